"""openapi.yaml is the app's schema, and every field documents itself."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import openapi_document
from app.config import PROJECT_ROOT

OPENAPI_FILE = PROJECT_ROOT / "openapi.yaml"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(openapi_document())
    return loaded


def test_committed_openapi_matches_the_app(schema: dict[str, Any]) -> None:
    committed = yaml.safe_load(Path(OPENAPI_FILE).read_text(encoding="utf-8"))
    assert committed == schema, (
        "openapi.yaml drifted from the app; regenerate it with "
        "`.venv/bin/capplan-server openapi -o openapi.yaml`"
    )


def _properties(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (name, prop_name, prop)
        for name, component in schema["components"]["schemas"].items()
        for prop_name, prop in component.get("properties", {}).items()
    ]


def _is_object_ref(prop: dict[str, Any]) -> bool:
    """A nested model (its own fields carry the examples), possibly nullable or in a list."""
    variants = prop.get("anyOf", [prop])
    return any("$ref" in v or "$ref" in v.get("items", {}) for v in variants)


def test_every_field_has_a_description_and_an_example(schema: dict[str, Any]) -> None:
    missing = []
    for component, field, prop in _properties(schema):
        if not prop.get("description"):
            missing.append(f"{component}.{field}: description")
        if "examples" not in prop and "example" not in prop and not _is_object_ref(prop):
            missing.append(f"{component}.{field}: example")
    assert missing == []


def test_error_responses_are_problem_json(schema: dict[str, Any]) -> None:
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for code, response in operation["responses"].items():
                if code[0] in "45":
                    assert list(response.get("content", {})) == ["application/problem+json"], (
                        f"{method.upper()} {path} {code}"
                    )
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_write_endpoints_declare_their_errors(schema: dict[str, Any]) -> None:
    put = schema["paths"]["/v1/hardware/{slug}"]["put"]
    assert {"401", "403", "404", "409", "412", "413", "422", "428"} <= set(put["responses"])
    assert {"HTTPBearer", "APIKeyHeader"} <= {
        name for requirement in put["security"] for name in requirement
    }
