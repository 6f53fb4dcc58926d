"""One home per concept (issue 30, point 2): each concept below is defined once and imported
everywhere, and these tests fail when a second copy comes back.

* every database query lives in ``app/db/repositories.py`` (one repository per aggregate,
  workloads included): no module of ``app/services`` or ``app/api`` builds one;
* the MIG resource name, the MIG profile schema, the TDP and price limits and the fit verdict
  have one definition in ``app/``;
* the fit verdict ``required <= usable`` is written only in ``app.domain.fit``;
* no class name stands for one type in ``app/domain`` and another in ``app/schemas``;
* the calibration scripts build hardware specs without ORM rows, and the plain record they use
  carries every column a client supplies.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect as sa_inspect

import app.domain.hardware as domain_hardware
import app.schemas.hardware as schema_hardware
from app.config import PROJECT_ROOT
from app.db.models import Hardware, MigProfile
from app.db.repositories import HardwareRepository, WorkloadRepository
from app.domain.fit import Requirement, fit, fits
from app.schemas.hardware import HardwareCreate
from app.services.catalog import load_catalog
from app.services.convert import (
    HardwareRecord,
    MigProfileRecord,
    apply_hardware_fields,
    hardware_record,
    hardware_spec,
)
from tests.support import CATALOG_DIR, ApiClient, db_session

APP = PROJECT_ROOT / "app"
CALIBRATION = PROJECT_ROOT / "benchmarks" / "calibration"


def _modules(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (APP / folder).rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(PROJECT_ROOT).as_posix() if path.is_relative_to(PROJECT_ROOT) else ""


# --------------------------------------------------------------------------------------------
# Every query in the repositories
# --------------------------------------------------------------------------------------------

# What builds or runs SQL: imported from sqlalchemy, or called on a session.
QUERY_BUILDERS = frozenset(
    {"select", "insert", "update", "delete", "union_all", "literal", "text", "func", "exists"}
)
SESSION_QUERIES = frozenset({"execute", "scalars", "scalar", "get", "query"})
# Not a query over the planning data: the readiness probe's round trip.
QUERY_ALLOWED = {"app/api/routes/ops.py": {"execute", "text"}}


def _queries(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    allowed = QUERY_ALLOWED.get(_relative(path), set())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            found += [
                f"{node.lineno}: imports {alias.name}"
                for alias in node.names
                if alias.name in QUERY_BUILDERS - allowed
            ]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SESSION_QUERIES - allowed
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("session", "db")
        ):
            found.append(f"{node.lineno}: {node.func.value.id}.{node.func.attr}()")
    return found


def test_services_and_routes_build_no_query() -> None:
    offenders = {
        _relative(path): found for path in _modules("services", "api") if (found := _queries(path))
    }
    assert offenders == {}, "queries belong in app/db/repositories.py"


def test_the_query_scan_finds_a_query(tmp_path: Path) -> None:
    """The scan above can fail: a service that selects by itself is caught."""
    module = tmp_path / "rogue.py"
    module.write_text(
        "from sqlalchemy import select\n"
        "def rows(session):\n"
        "    return session.scalars(select(Workload)).all()\n",
        encoding="utf-8",
    )
    assert _queries(module) == ["1: imports select", "3: session.scalars()"]


def test_workloads_have_a_repository(client: ApiClient, db_url: str) -> None:
    """WorkloadRepository answers what the services ask, on SQLite and PostgreSQL."""
    body = {
        "name": "Chat",
        "model": "gpt-2",
        "mode": "inference",
        "batch_size": 4,
        "sequence_length": 256,
        "precision": "bf16",
    }
    for slug, mode in (("b-train", "training"), ("a-chat", "inference"), ("c-chat", "inference")):
        extra = {"optimizer": "adamw"} if mode == "training" else {}
        response = client.post("/v1/workloads", json={**body, **extra, "slug": slug, "mode": mode})
        assert response.status_code == 201, response.text
    with db_session(db_url) as session:
        workloads = WorkloadRepository(session)
        found = workloads.get("a-chat")
        assert found is not None
        assert found.slug == "a-chat"
        assert workloads.get("nope") is None
        assert workloads.exists("c-chat")
        assert not workloads.exists("nope")
        page, total = workloads.list(model_id=None, mode="inference", limit=1, offset=1)
        assert ([w.slug for w in page], total) == (["c-chat"], 2)
        page, total = workloads.list(model_id=-1, mode=None, limit=50, offset=0)
        assert (list(page), total) == ([], 0)
        every = workloads.all_by_id()
        assert [w.slug for w in every] == ["b-train", "a-chat", "c-chat"]
        assert {w.slug for w in workloads.of_model(found.model_id)} == {
            "a-chat",
            "b-train",
            "c-chat",
        }
        ids = [every[0].id, every[2].id, 10**9]
        assert {w.slug for w in workloads.by_ids(ids).values()} == {"b-train", "c-chat"}
        hardware = HardwareRepository(session)
        gpus = hardware.gpus_by_memory()
        assert gpus
        assert {g.kind for g in gpus} == {"gpu"}
        assert [(g.memory_bytes, g.slug) for g in gpus] == sorted(
            (g.memory_bytes, g.slug) for g in gpus
        )
        slugs = hardware.mig_capable_slugs()
        assert "nvidia-a100-80gb-sxm" in slugs
        assert slugs == sorted(slugs)
        assert "nvidia-t4" not in slugs


# --------------------------------------------------------------------------------------------
# One definition per name
# --------------------------------------------------------------------------------------------

ONE_HOME = {
    "kubernetes_resource": "app/domain/mig/layout.py",
    "MigProfileRead": "app/schemas/hardware.py",
    "MAX_TDP_WATTS": "app/domain/hardware.py",
    "MAX_PRICE_USD_PER_HOUR": "app/domain/hardware.py",
    "fits": "app/domain/fit.py",
    "hardware_spec": "app/services/convert.py",
    "hardware_record": "app/services/convert.py",
    "planning_data_digest": "app/db/repositories.py",
    "WorkloadRepository": "app/db/repositories.py",
}
GONE = ("kubernetes_resource_name", "MigProfileInfo")


def _definitions() -> Counter[tuple[str, str]]:
    """(name, module) of every module-level function, class and assignment in app/."""
    found: Counter[tuple[str, str]] = Counter()
    for path in _modules("."):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            names: list[str] = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            for name in names:
                found[(name, _relative(path))] += 1
    return found


def test_each_concept_is_defined_once() -> None:
    definitions = _definitions()
    for name, home in ONE_HOME.items():
        where = {module: n for (found, module), n in definitions.items() if found == name}
        assert where == {home: 1}, name
    for name in GONE:
        assert not [m for (found, m) in definitions if found == name], name


def test_no_class_name_means_one_thing_in_the_domain_and_another_in_the_schemas() -> None:
    """The API contract's types and the domain's are different classes with different names
    (``WorkloadInput`` is the body, ``app.domain.workload.WorkloadSpec`` the maths;
    ``FrameworkOverheadDefaults`` a profile's stored figures, ``app.domain.hardware.
    FrameworkOverhead`` the resolved ones): one name, one concept."""
    classes: dict[str, set[str]] = {"app/domain/": set(), "app/schemas/": set()}
    for (name, module), _ in _definitions().items():
        for prefix, names in classes.items():
            if module.startswith(prefix) and name[:1].isupper() and not name.isupper():
                names.add(name)
    assert len(classes["app/domain/"]) > 50
    assert len(classes["app/schemas/"]) > 50
    assert classes["app/domain/"] & classes["app/schemas/"] == set()


def test_the_schema_limits_are_the_domain_limits() -> None:
    """One value on write (422) and before dividing (the domain's check)."""
    assert vars(schema_hardware)["MAX_TDP_WATTS"] is domain_hardware.MAX_TDP_WATTS
    assert vars(schema_hardware)["MAX_PRICE_USD_PER_HOUR"] is domain_hardware.MAX_PRICE_USD_PER_HOUR
    properties = HardwareCreate.model_json_schema()["properties"]

    def maximum(field: str) -> Any:
        schema = properties[field]
        return next(s["maximum"] for s in schema.get("anyOf", [schema]) if "maximum" in s)

    assert maximum("tdp_watts") == domain_hardware.MAX_TDP_WATTS == 100_000
    assert maximum("price_usd_per_hour") == domain_hardware.MAX_PRICE_USD_PER_HOUR == 100_000


def test_both_mig_profile_views_are_one_schema(client: ApiClient) -> None:
    """GET /v1/hardware/{gpu}/mig-profiles and the hardware profile's ``mig.profiles`` are the same
    schema and the same figures."""
    gpu = "nvidia-a100-80gb-sxm"
    listed = client.get(f"/v1/hardware/{gpu}/mig-profiles")
    assert listed.status_code == 200, listed.text
    stored = client.get(f"/v1/hardware/{gpu}").json()["mig"]["profiles"]
    by_name = {p["name"]: p for p in stored}
    assert listed.json()["profiles"]
    for profile in listed.json()["profiles"]:
        assert profile == by_name[profile["name"]]
        assert profile["kubernetes_resource"] == "nvidia.com/mig-" + profile["name"].replace(
            "+", "."
        )
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["MigProfileList"]["properties"]["profiles"]["items"] == {
        "$ref": "#/components/schemas/MigProfileRead"
    }


# --------------------------------------------------------------------------------------------
# The fit verdict
# --------------------------------------------------------------------------------------------

_NEED = r"(required|need)\w*(\.\w+|\[[^]]+\])?"
_HAVE = r"[\w.\[\]\"']*(usable|memory_bytes|available)[\w\"'\]]*"
VERDICT = re.compile(rf"{_NEED}\s*(<=|>)\s*{_HAVE}|{_HAVE}\s*(>=|<)\s*{_NEED}")
# Where the verdict is still written out, with who moves it (issue 30: after those splits).
VERDICT_ELSEWHERE = {
    "app/domain/fit.py": "the verdict itself",
    "app/client/cli_estimate.py": "the CLI's offline alternatives (client code)",
    "app/api/middleware.py": "the import's process-memory reservation, not a workload's fit",
}
VERDICT_SKIPPED_FOLDERS: tuple[str, ...] = ()


def _verdicts(text: str) -> list[int]:
    return [
        number
        for number, line in enumerate(text.splitlines(), 1)
        if VERDICT.search(line.split("#")[0]) and "Field(" not in line
    ]


def test_the_fit_verdict_is_written_only_in_domain_fit() -> None:
    offenders = {}
    for path in _modules("."):
        where = _relative(path)
        if where in VERDICT_ELSEWHERE or where.startswith(VERDICT_SKIPPED_FOLDERS):
            continue
        if lines := _verdicts(path.read_text(encoding="utf-8")):
            offenders[where] = lines
    assert offenders == {}, "use app.domain.fit.fits / fit"


@pytest.mark.parametrize(
    "line",
    [
        "    fits = required <= profile.memory_bytes",
        "        if gpu.memory_bytes >= required and runs(gpu)",
        "        return need.required_bytes <= profile.memory_bytes",
        "    allowed = required <= usable",
        '         if h["memory_bytes"] >= required and runs_precision(h, precision)),',
        "        return required > candidate.device.memory_bytes",
    ],
)
def test_the_verdict_scan_finds_a_copy(line: str) -> None:
    assert _verdicts(line) == [1]


def test_the_one_verdict() -> None:
    assert fits(10, 10)
    assert fits(0, 1)
    assert not fits(11, 10)
    need = Requirement(lines=(), required_bytes=10, safety_margin_fraction=0.0)
    assert fit(need, 10).fits
    assert not fit(need, 9).fits
    assert fit(need, 9).headroom_bytes == -1


# --------------------------------------------------------------------------------------------
# Hardware specs without ORM rows
# --------------------------------------------------------------------------------------------


def test_calibration_scripts_use_no_orm_rows() -> None:
    for path in sorted(CALIBRATION.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        imported = [
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        ] + [
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        ]
        assert not [m for m in imported if m.startswith(("app.db", "sqlalchemy"))], path.name


def test_the_record_carries_every_client_column() -> None:
    """A column added to ``Hardware`` (or ``MigProfile``) and not to the record would be lost
    on write and in the calibration's specs: the record is the one mapping for both."""
    bookkeeping = {"id", "version", "source", "catalog_digest", "created_at", "updated_at"}
    columns = {a.key for a in sa_inspect(Hardware).column_attrs} - bookkeeping
    record = set(HardwareRecord.__slots__) - {"mig_profiles"}
    assert record == columns
    profile_columns = {a.key for a in sa_inspect(MigProfile).column_attrs}
    assert set(MigProfileRecord.__slots__) == profile_columns - {"id", "hardware_id", "position"}


def test_catalog_specs_without_rows_equal_the_stored_ones() -> None:
    entries = load_catalog(CATALOG_DIR)
    assert len(entries) > 40
    for entry in entries:
        row = Hardware(slug=entry.slug)
        apply_hardware_fields(row, entry)
        assert hardware_spec(hardware_record(entry.slug, entry)) == hardware_spec(row), entry.slug


def _declared_fields(path: str, name: str) -> set[str]:
    """The fields a schema class declares in its own body (annotated assignments)."""
    tree = ast.parse((PROJECT_ROOT / path).read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def test_the_vllm_options_are_declared_once() -> None:
    """The endpoint's request and a workload's engine share vLLM's option fields (one field,
    default and description each, in app.schemas.engines.VllmOptionFields); each declares only
    what differs: the endpoint's model/GPU and a workload's engine name and min_concurrency, and
    the tensor/pipeline degrees, whose defaults differ on purpose (1 vs the workload's)."""
    from app.schemas.engine_options import VllmEngineOptions
    from app.schemas.engines import VllmMemoryRequest, VllmOptionFields

    shared = _declared_fields("app/schemas/engines.py", "VllmOptionFields")
    assert {"dtype", "kv_cache_dtype", "quantization", "quantization_config"} <= shared
    endpoint = _declared_fields("app/schemas/engines.py", "VllmMemoryRequest")
    workload = _declared_fields("app/schemas/engine_options.py", "VllmEngineOptions")
    degrees = {"tensor_parallel_size", "pipeline_parallel_size"}
    assert endpoint & workload == degrees
    assert not (endpoint | workload) & shared
    for cls in (VllmMemoryRequest, VllmEngineOptions):
        assert issubclass(cls, VllmOptionFields)
    assert VllmMemoryRequest.model_fields["tensor_parallel_size"].default == 1
    assert VllmEngineOptions.model_fields["tensor_parallel_size"].default is None
