"""Unknown query parameters are a 422 problem on every GET route, not silently ignored."""

from __future__ import annotations

import re

import pytest

from app.main import create_app
from tests.api.helpers import assert_problem
from tests.support import ApiClient


def _get_paths_with_query() -> list[str]:
    """Every GET operation of the app's OpenAPI document that declares a query parameter."""
    document = create_app().openapi()
    paths = sorted(
        path
        for path, operations in document["paths"].items()
        if any(p["in"] == "query" for p in operations.get("get", {}).get("parameters", []))
    )
    assert len(paths) >= 5, paths  # the listings, the estimate and the charts at least
    return paths


@pytest.mark.parametrize("path", _get_paths_with_query())
def test_an_unknown_query_parameter_is_a_422(client: ApiClient, path: str) -> None:
    url = re.sub(r"\{[^}]+\}", "gpt-2", path)
    response = client.get(url, params={"seq_len": "512"})
    body = assert_problem(response, 422, "validation-error")
    assert "seq_len" in body["detail"]
    assert "unknown query parameter 'seq_len'" in body["detail"]


def test_the_problem_lists_the_valid_names(client: ApiClient) -> None:
    params = {
        "model": "llama-3-8b",
        "mode": "inference",
        "batch_size": "8",
        "seq_len": "512",
        "precision": "bf16",
    }
    body = assert_problem(client.get("/v1/estimates/memory", params=params), 422)
    assert "seq_len" in body["detail"]
    assert "sequence_length" in body["detail"]  # the name the caller meant is listed
    params["sequence_length"] = params.pop("seq_len")
    assert client.get("/v1/estimates/memory", params=params).status_code == 200


def test_post_routes_accept_the_api_servers_timeout_parameter(client: ApiClient) -> None:
    """The Kubernetes API server calls webhooks with ?timeout=10s."""
    response = client.post("/v1/admission/pods?timeout=10s", content=b"{}")
    assert response.status_code != 422 or "timeout" not in response.text
