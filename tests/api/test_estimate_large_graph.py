"""A 99,999-layer repeated graph is estimated through the API (issue 29: a 503 after 8 s when
the caching-allocator replay walked its 2.6 million allocator events); stored and inline, the
estimate says that the allocator was not replayed and how its CUDA lines were computed.
Behavioural, not timed: tests/domain/test_memory_replay_budget.py counts that no event is built."""

from __future__ import annotations

from typing import Any

from tests.support import ApiClient

DEEP: dict[str, Any] = {
    "inputs": [{"name": "x", "shape": ["batch", 64]}],
    "layers": [
        {
            "name": "stack",
            "op": "repeat",
            "times": 99_999,
            "layers": [{"name": "fc", "op": "linear", "out_features": 64}],
        }
    ],
}


def _check(body: dict[str, Any]) -> None:
    assert body["params"] == 99_999 * (64 * 64 + 64)
    assert any(
        "allocator not replayed: 99,999 executed layers exceed the replay's 10,000" in a
        for a in body["assumptions"]
    )
    lines = {line["key"]: line for line in body["breakdown"]}
    assert "not replayed (99,999 layers > 10,000)" in lines["allocator_rounding"]["formula"]
    assert "x 0.05 [fragmentation_fraction]" in lines["fragmentation_reserve"]["formula"]
    assert sum(line["bytes"] for line in body["breakdown"]) == body["peak_bytes"]
    cuda = body["cuda"]
    assert (
        cuda["reserved_bytes"] - cuda["allocated_bytes"] == lines["fragmentation_reserve"]["bytes"]
    )


def test_a_99999_layer_inline_repeat_is_estimated(client: ApiClient) -> None:
    body = {"architecture": DEEP, "mode": "training", "batch_size": 8}
    response = client.post("/v1/estimates/memory", json=body)
    assert response.status_code == 200, response.text
    _check(response.json())


def test_a_99999_layer_stored_model_is_estimated(client: ApiClient) -> None:
    created = client.post(
        "/v1/models", json={"slug": "deep", "name": "Deep", "family": "mlp", **DEEP}
    )
    assert created.status_code == 201, created.text
    response = client.post(
        "/v1/estimates/memory", json={"model": "deep", "mode": "inference", "batch_size": 8}
    )
    assert response.status_code == 200, response.text
    _check(response.json())
