"""The deploy kit's resource limits hold the service's own bounds on ONNX imports."""

from __future__ import annotations

from typing import Any

import yaml

from app.api.errors import IMPORT_PEAK_FACTOR
from app.config import PROJECT_ROOT, Settings

DEPLOYMENT = PROJECT_ROOT / "deploy" / "kubernetes" / "deployment.yaml"
# Resident memory of `serve` at rest after its first ONNX import (the onnx package loaded),
# measured by benchmarks/import_memory.py through HTTP: 150 MiB on a 2-core VM.
REST_MIB = 150
# Left for every other request while imports use their whole budget.
OTHER_REQUESTS_MIB = 64


def _container() -> dict[str, Any]:
    documents = list(yaml.safe_load_all(DEPLOYMENT.read_text()))
    deployment = next(d for d in documents if d and d.get("kind") == "Deployment")
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def _mib(quantity: str) -> float:
    units = {"Ki": 2**-10, "Mi": 1, "Gi": 2**10}
    return float(quantity[:-2]) * units[quantity[-2:]]


def _settings() -> Settings:
    env = {item["name"]: item["value"] for item in _container()["env"] if "value" in item}
    fields = {name.removeprefix("CAPPLAN_").lower(): value for name, value in env.items()}
    return Settings(_env_file=None, **fields)


def test_import_memory_fits_the_memory_limit() -> None:
    settings = _settings()
    limit_mib = _mib(_container()["resources"]["limits"]["memory"])
    budget_mib = settings.import_memory_bytes / 2**20
    assert REST_MIB + budget_mib + OTHER_REQUESTS_MIB <= limit_mib
    # The largest upload accepted can be imported at all (else the upload limit lies).
    assert settings.max_import_bytes * IMPORT_PEAK_FACTOR <= settings.import_memory_bytes


def test_spooled_uploads_fit_the_tmp_volume() -> None:
    """Uploads arrive in /tmp (an emptyDir): the import gate lets at most the budget / the
    peak factor of them in at once, and the volume must hold that."""
    settings = _settings()
    documents = list(yaml.safe_load_all(DEPLOYMENT.read_text()))
    deployment = next(d for d in documents if d and d.get("kind") == "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    tmp_mib = _mib(volumes["tmp"]["emptyDir"]["sizeLimit"])
    uploads_mib = settings.import_memory_bytes / IMPORT_PEAK_FACTOR / 2**20
    assert uploads_mib + 2 * settings.max_request_bytes / 2**20 <= tmp_mib


def test_http_limits_are_spelled_out() -> None:
    settings = _settings()
    assert settings.max_url_bytes == Settings.model_fields["max_url_bytes"].default
    assert settings.max_header_bytes == Settings.model_fields["max_header_bytes"].default
    assert settings.header_timeout_s == Settings.model_fields["header_timeout_s"].default
