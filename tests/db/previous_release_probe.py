"""Run ANOTHER release's code against a database: readiness and a few reads.

Run by tests/db/test_previous_release.py with ``PYTHONPATH`` pointing at an exported tree of
that release (its ``app/``, ``migrations/``, ``alembic.ini``, ``hardware_catalog/``), so every
``app`` import below is that release's code. Usage::

    python previous_release_probe.py TREE DATABASE_URL SCHEMA_COMPAT_PY

Prints one JSON object. ``SCHEMA_COMPAT_PY`` is the *current* ``app/db/schema_compat.py``,
loaded under another name: for a release older than that module, its verdict on the release's
own metadata says whether the expand rule holds (that release's own `/readyz` demanded its exact
head revision).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any


def main(tree: str, url: str, compat_path: str) -> dict[str, Any]:
    os.environ["CAPPLAN_DATABASE_URL"] = url
    os.environ.setdefault("CAPPLAN_LOG_LEVEL", "WARNING")

    from alembic.script import ScriptDirectory
    from fastapi.testclient import TestClient

    import app
    from app.db import models  # noqa: F401
    from app.db.base import Base
    from app.db.migrations import alembic_config
    from app.db.session import make_engine
    from app.main import create_app

    loaded_from = Path(app.__file__).resolve()
    if not loaded_from.is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"imported app from {loaded_from}, not from the release tree {tree}")

    spec = importlib.util.spec_from_file_location("current_schema_compat", compat_path)
    assert spec is not None
    assert spec.loader is not None
    compat = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = compat
    spec.loader.exec_module(compat)

    script = ScriptDirectory.from_config(alembic_config())
    heads = sorted(script.get_heads())
    known = [revision.revision for revision in script.walk_revisions()]
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            check = compat.check_schema(
                connection, Base.metadata, code_heads=heads, known_revisions=known
            )
    finally:
        engine.dispose()

    answers: dict[str, Any] = {}
    with TestClient(create_app()) as client:
        ready = client.get("/readyz")
        answers["readyz"] = {"status": ready.status_code, "body": ready.json()}
        for path in (
            "/v1/hardware",
            "/v1/hardware/nvidia-h100-sxm",
            "/v1/models/resnet-50",
        ):
            response = client.get(path)
            answers[path] = {"status": response.status_code}
        answers["/v1/hardware/nvidia-h100-sxm"]["memory_bytes"] = client.get(
            "/v1/hardware/nvidia-h100-sxm"
        ).json()["memory_bytes"]
        recommended = client.post(
            "/v1/recommendations/inference", json={"model": "resnet-50", "latency_slo_ms": 20}
        )
        answers["recommendation"] = {
            "status": recommended.status_code,
            "eligible_candidates": recommended.json().get("eligible_candidates"),
        }
    return {
        "code_heads": heads,
        "has_schema_compat": (Path(tree) / "app" / "db" / "schema_compat.py").exists(),
        "rule": {"status": check.status, "ready": check.ready, "problems": list(check.problems)},
        "answers": answers,
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))  # noqa: T201
