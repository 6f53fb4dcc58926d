"""Every request example of the OpenAPI document succeeds against a fresh database.

The operations are walked in the app's generated schema (``openapi.yaml`` is that schema: the
contract tests fail when it drifts) and every example is sent as Swagger UI's "Try it out"
would send it: path and query parameters from their examples, and each request-body example
in turn. Creates run first (the PUT, DELETE and stored-workload examples name what they make),
then reads and computations, then replacements, then deletions (workloads before the models
and hardware they could name). `If-Match` is the ETag a GET of the same resource returns, as
the API documents. Each request must answer 2xx.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.importers import onnx_models
from tests.support import ApiClient

METHODS = ("get", "post", "put", "delete")
DELETE_ORDER = ("/v1/workloads/", "/v1/models/", "/v1/hardware/")


@dataclass
class Call:
    """One request built from the document's examples."""

    method: str
    template: str
    path: str
    label: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    files: dict[str, Any] | None = None
    data: dict[str, str] | None = None
    needs_etag: bool = False


def _parameter_example(parameter: dict[str, Any]) -> tuple[bool, Any]:
    if "example" in parameter:
        return True, parameter["example"]
    if parameter.get("examples"):
        return True, next(iter(parameter["examples"].values()))["value"]
    schema = parameter.get("schema", {})
    if schema.get("examples"):
        return True, schema["examples"][0]
    if "example" in schema:
        return True, schema["example"]
    return False, None


def _media_examples(content: dict[str, Any]) -> list[tuple[str, Any]]:
    if "example" in content:
        return [("example", content["example"])]
    return [(name, item["value"]) for name, item in content.get("examples", {}).items()]


def _form_fields(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    properties: dict[str, Any] = schema["properties"]
    return properties


def _multipart(
    schema: dict[str, Any], components: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The form Swagger UI fills from the fields' examples; the file part gets a real ONNX
    model (the document can only name a file, not hold one)."""
    files: dict[str, Any] = {}
    data: dict[str, str] = {}
    for name, prop in _form_fields(schema, components).items():
        if prop.get("format") == "binary" or prop.get("contentMediaType"):
            filename = (prop.get("examples") or ["model.onnx"])[0]
            files[name] = (filename, onnx_models.small_cnn(), "application/octet-stream")
            continue
        value = (prop.get("examples") or [None])[0]
        if value is None:
            continue
        data[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return files, data


def _phase(call: Call) -> tuple[int, int]:
    if call.method == "delete":
        order = next(i for i, prefix in enumerate(DELETE_ORDER) if call.path.startswith(prefix))
        return 3, order
    return {"post-create": 0, "get": 1, "post": 1, "put": 2}[call.label], 0


def example_calls(schema: dict[str, Any]) -> Iterator[Call]:
    """Every request the document's examples describe, in the order to send them."""
    components = schema["components"]["schemas"]
    calls: list[Call] = []
    for template, operations in schema["paths"].items():
        for method in METHODS:
            operation = operations.get(method)
            if operation is None:
                continue
            path = template
            params: dict[str, Any] = {}
            needs_etag = False
            for parameter in operation.get("parameters", []):
                found, value = _parameter_example(parameter)
                where, name = parameter["in"], parameter["name"]
                if where == "header":
                    assert name == "If-Match", f"{method} {template}: header {name}"
                    needs_etag = True
                    continue
                if parameter.get("required"):
                    assert found, f"{method.upper()} {template}: required {name} has no example"
                if not found:
                    continue
                if where == "path":
                    path = path.replace("{" + name + "}", str(value))
                else:
                    params[name] = value
            label = method
            if method == "post" and "201" in operation["responses"]:
                label = "post-create"
            body = operation.get("requestBody")
            if body is None:
                calls.append(Call(method, template, path, label, params, needs_etag=needs_etag))
                continue
            for media_type, content in body["content"].items():
                if media_type == "multipart/form-data":
                    files, data = _multipart(content["schema"], components)
                    calls.append(
                        Call(method, template, path, label, params, files=files, data=data)
                    )
                    continue
                assert media_type == "application/json", f"{method} {template}: {media_type}"
                examples = _media_examples(content)
                assert examples, f"{method.upper()} {template} has no request-body example"
                for _, value in examples:
                    calls.append(
                        Call(
                            method, template, path, label, params, json=value, needs_etag=needs_etag
                        )
                    )
    yield from sorted(calls, key=_phase)


def send(client: ApiClient, call: Call) -> httpx.Response:
    headers: dict[str, str] = {}
    if call.needs_etag:
        current = client.get(call.path)
        assert current.status_code == 200, f"GET {call.path}: {current.text}"
        headers["If-Match"] = current.headers["etag"]
    return client.request(
        call.method.upper(),
        call.path,
        params=call.params or None,
        json=call.json,
        files=call.files,
        data=call.data,
        headers=headers,
    )


def test_every_request_example_succeeds(client: ApiClient) -> None:
    schema = client.app.openapi()
    calls = list(example_calls(schema))
    operations = {
        (method, path)
        for path, ops in schema["paths"].items()
        for method in ops
        if method in METHODS
    }
    assert len(operations) >= 30
    failures = []
    for call in calls:
        response = send(client, call)
        if not 200 <= response.status_code < 300:
            failures.append(
                f"{call.method.upper()} {call.path}: {response.status_code} {response.text}"
            )
        elif (
            call.path == "/v1/admission/pods" and response.json()["response"]["allowed"] is not True
        ):
            # The example pod is one the webhook admits (its answer example says so).
            failures.append(f"POST /v1/admission/pods: not admitted: {response.text}")
    assert failures == []
    assert {(call.method, call.template) for call in calls} == operations


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/v1/estimates/memory", "post"),
        ("/v1/mig/fit", "post"),
        ("/v1/mig/plan", "post"),
        ("/v1/admission/check", "post"),
        ("/v1/recommendations/inference", "post"),
    ],
)
def test_workload_examples_give_a_model_or_an_architecture_not_both(
    client: ApiClient, path: str, method: str
) -> None:
    """The five operations whose assembled example held both (a 422 in "Try it out")."""
    content = client.app.openapi()["paths"][path][method]["requestBody"]["content"]
    examples = _media_examples(content["application/json"])
    assert examples

    def workloads(value: Any) -> Iterator[dict[str, Any]]:
        if isinstance(value, dict):
            if "mode" in value or "model" in value or "architecture" in value:
                yield value
            for child in value.values():
                yield from workloads(child)
        elif isinstance(value, list):
            for child in value:
                yield from workloads(child)

    found = [w for _, value in examples for w in workloads(value)]
    assert found
    for workload in found:
        assert ("model" in workload) != ("architecture" in workload), workload
