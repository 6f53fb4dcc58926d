"""Schemathesis over every operation of openapi.yaml, in process, on a fresh SQLite database.

Every operation of the committed ``openapi.yaml`` (``test_openapi.py`` fails when it drifts
from the app) is called with generated requests, valid and invalid (examples, coverage and
fuzzing phases), through the app's ASGI interface in open dev mode. Each response must not be
a 5xx and must conform to the document: a declared status code, a declared content type, and a
body that validates against the declared schema.

Each operation gets its own database, copied from the migrated, catalog-synced template: what
one operation writes (dozens of generated hardware profiles, models, workloads) cannot slow
down or change the answers of another (``POST /v1/recommendations/inference`` evaluates every
stored device), and the outcome does not depend on the order the operations run in. Stateful
scenarios (chains along inferred links) each get a fresh database too.

Deterministic: a fixed seed, derandomized generation and no example database, so CI sees the
same requests on every run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import hypothesis
import pytest
import schemathesis
import yaml
from fastapi import FastAPI
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Ok
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.schemas import APIOperation

from app.config import PROJECT_ROOT
from app.domain.zoo import ZOO
from app.main import create_app
from tests.support import CATALOG_DIR, SqliteDatabases, settings_for

OPENAPI_FILE = PROJECT_ROOT / "openapi.yaml"

# Generated examples per operation in the fuzzing phase; the examples and coverage phases add
# their own deterministic, finite sets on top.
MAX_EXAMPLES = 25

# Values that broke the service before (issue 11), mixed into the generated strings and numbers
# wherever the schema allows them (or, in negative cases, where it does not): NUL (PostgreSQL
# cannot store it; lone surrogates, the other such case, come from the generator itself and
# cannot be dictionary entries), subnormal and extreme floats (divisions in the roofline and
# recommendation engines).
HOSTILE_TEXT = ["\x00", "gpu\x00", "~/..%2f", " "]
HOSTILE_NUMBERS = [5e-324, 1e-308, 2.2250738585072014e-308, 1e-300, 1.7976931348623157e308, -0.0]


def _catalog_names() -> tuple[list[str], list[str]]:
    """Hardware slugs and Kubernetes MIG resources of the shipped catalog."""
    hardware: list[str] = []
    profiles: set[str] = set()
    for path in sorted(CATALOG_DIR.glob("*.yaml")):
        for device in yaml.safe_load(path.read_text(encoding="utf-8")).get("devices", []):
            hardware.append(device["slug"])
            for profile in (device.get("mig") or {}).get("profiles", []):
                profiles.add(profile["name"])
    resources = [f"nvidia.com/mig-{name.replace('+', '.')}" for name in sorted(profiles)]
    return hardware, [*resources, "nvidia.com/gpu"]


# Names the seeded database knows, put into the fields that take them: random text almost never
# names a stored model or GPU, and without them nearly every estimate, fit, workload, admission
# check and recommendation would stop at a 404 before its real work.
HARDWARE_NAMES, RESOURCE_NAMES = _catalog_names()
KNOWN_NAME_FIELDS = {
    "model-names": (
        "query.model",
        "body.model",
        "body.workload.model",
        "body.workloads[*].workload.model",
    ),
    "hardware-names": ("query.hardware", "body.hardware", "body.gpu", "body.gpu_model"),
    "resource-names": ("body.resource",),
}
KNOWN_NAME_PROBABILITY = 0.5

CONFIG = SchemathesisConfig.from_dict(
    {
        "seed": 20240611,
        "dictionaries": {
            "hostile-text": {"values": HOSTILE_TEXT},
            "hostile-numbers": {"values": HOSTILE_NUMBERS},
            "model-names": {"values": sorted(ZOO)},
            "hardware-names": {"values": HARDWARE_NAMES},
            "resource-names": {"values": RESOURCE_NAMES},
        },
        "parameters": {
            field: {"dictionary": dictionary, "probability": KNOWN_NAME_PROBABILITY}
            for dictionary, fields in KNOWN_NAME_FIELDS.items()
            for field in fields
        },
        "generation": {
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            # No .hypothesis/ directory: a failure found once must not change later runs.
            "database": "none",
            "dictionaries": {
                "string": {"dictionary": "hostile-text", "probability": 0.1},
                "number": {"dictionary": "hostile-numbers", "probability": 0.1},
            },
        },
        "checks": {
            "enabled": False,
            "not_a_server_error": {"enabled": True},
            "status_code_conformance": {"enabled": True},
            "content_type_conformance": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
        },
    }
)

schema = schemathesis.openapi.from_path(OPENAPI_FILE, config=CONFIG)
LOADED = list(schema.get_all_operations())
OPERATIONS: list[APIOperation[Any, Any, Any, Any]] = [
    result.ok() for result in LOADED if isinstance(result, Ok)
]


@pytest.fixture
def app(sqlite_databases: SqliteDatabases) -> Iterator[FastAPI]:
    """The real app in open dev mode on a fresh database, shared by one operation's examples."""
    with sqlite_databases.fresh() as url:
        application = create_app(settings_for(url))
        try:
            yield application
        finally:
            shutdown_lifespans()  # schemathesis started the app's lifespan on the first call
            application.state.engine.dispose()


def test_every_operation_is_tested() -> None:
    assert len(OPERATIONS) == len(LOADED), "an operation of openapi.yaml could not be loaded"
    assert len(OPERATIONS) >= 30
    assert {"POST /v1/admission/pods", "POST /v1/models/import/onnx"} <= {
        operation.label for operation in OPERATIONS
    }


@schema.parametrize()
@hypothesis.settings(
    deadline=None,
    # The `app` fixture is deliberately shared by all examples of one operation (one database
    # per operation, not per example: copying it per example would dominate the run time).
    suppress_health_check=[
        hypothesis.HealthCheck.function_scoped_fixture,
        hypothesis.HealthCheck.too_slow,
    ],
)
def test_api_conforms_to_openapi(case: schemathesis.Case[Any], app: FastAPI) -> None:
    case.call_and_validate(app=app)


# Schemathesis never puts NUL in a path parameter (many servers reject it before routing), so
# the dictionary above cannot reach path segments. Each path parameter of each operation gets
# the hostile strings here, through the same ASGI call and the same checks.
HOSTILE_PATH_VALUES = ["\x00", "gpu\x00"]
PATH_PARAMETERS = [
    (operation.label, parameter.name)
    for operation in OPERATIONS
    for parameter in operation.path_parameters
]


@pytest.mark.parametrize(("label", "parameter"), PATH_PARAMETERS)
@pytest.mark.parametrize("value", HOSTILE_PATH_VALUES, ids=ascii)
def test_hostile_path_parameters_conform_to_openapi(
    app: FastAPI, label: str, parameter: str, value: str
) -> None:
    method, path = label.split(" ", 1)
    operation = schema[path][method]
    others = {p.name: "x" for p in operation.path_parameters}
    case = operation.Case(path_parameters={**others, parameter: value})
    case.call_and_validate(app=app)


def test_every_path_parameter_gets_hostile_values() -> None:
    assert len(PATH_PARAMETERS) >= 12
    assert ("GET /v1/hardware/{slug}", "slug") in PATH_PARAMETERS


# Stateful scenarios: chains of calls along the links schemathesis infers from the document
# (POST /v1/models -> GET/PUT/DELETE /v1/models/{slug} with the ETag, ...). Each scenario starts
# on its own fresh database, so its responses depend only on its own steps (Hypothesis replays
# a scenario from its choices, and would call shared, changing state flaky) and the rows it
# creates are bounded by SCENARIO_STEPS.
SCENARIOS = 30
SCENARIO_STEPS = 8


def test_api_workflows_conform_to_openapi(sqlite_databases: SqliteDatabases) -> None:
    class Workflows(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            self.resources = ExitStack()
            url = self.resources.enter_context(sqlite_databases.fresh())
            self.app = create_app(settings_for(url))
            self.resources.callback(self.app.state.engine.dispose)
            self.resources.callback(shutdown_lifespans)

        def teardown(self) -> None:
            self.resources.close()

        def get_call_kwargs(self, case: schemathesis.Case[Any]) -> dict[str, Any]:
            return {"app": self.app}

    Workflows.run(
        settings=hypothesis.settings(
            max_examples=SCENARIOS,
            stateful_step_count=SCENARIO_STEPS,
            derandomize=True,
            database=None,
            deadline=None,
            # Generation only, as schemathesis runs its own stateful phase: no shrinking, which
            # would replay scenarios (each on a new database) for minutes.
            phases=[hypothesis.Phase.generate],
            suppress_health_check=[hypothesis.HealthCheck.too_slow],
        )
    )
