"""Tensor parallelism through the API: a degree that does not divide the attention heads is a
422 naming ``parallelism.tensor`` (vLLM refuses to start with it) and nothing is written; a
valid one answers per GPU with the replicated KV heads (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

from app.domain.zoo.transformers import llama
from tests.api.helpers import assert_problem
from tests.support import ApiClient, table_counts


def _qwen_like() -> dict[str, Any]:
    """An inline decoder with Qwen2.5-7B's head layout: 28 attention heads, 4 KV heads."""
    _, layers = llama(
        layers=2, hidden=56, heads=28, kv_heads=4, intermediate=64, vocab=100, head_dim=2
    )
    return {
        "inputs": [{"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"}],
        "layers": layers,
        "default_bindings": {"seq": 16},
    }


def _pointers(problem: dict[str, Any]) -> list[str]:
    return [error["pointer"] for error in problem["errors"]]


def test_tensor_that_does_not_divide_the_heads_is_422(client: ApiClient) -> None:
    body = {
        "architecture": _qwen_like(),
        "mode": "inference",
        "batch_size": 1,
        "parallelism": {"tensor": 8},
    }
    problem = assert_problem(client.post("/v1/estimates/memory", json=body), 422)
    assert _pointers(problem) == ["/parallelism/tensor"]
    assert "28 attention heads" in problem["detail"]
    assert "must be divisible by tensor parallel size" in problem["detail"]
    # 4 divides 28 (7 heads a GPU) and the 4 KV heads (1 a GPU): answered
    body["parallelism"] = {"tensor": 4}
    assert client.post("/v1/estimates/memory", json=body).status_code == 200


def test_stored_model_refused_and_nested_pointer(client: ApiClient) -> None:
    """GPT-2 has 12 heads: tensor 8 is refused; in a MIG fit the workload is nested."""
    body = {"model": "gpt-2", "mode": "inference", "batch_size": 1, "parallelism": {"tensor": 8}}
    problem = assert_problem(client.post("/v1/estimates/memory", json=body), 422)
    assert _pointers(problem) == ["/parallelism/tensor"]
    assert "12 attention heads" in problem["detail"]
    workload = dict(body)
    fit = client.post("/v1/mig/fit", json={"gpu": "nvidia-a100-80gb-sxm", "workload": workload})
    assert _pointers(assert_problem(fit, 422)) == ["/workload/parallelism/tensor"]


def test_workload_write_with_a_bad_tensor_degree_writes_nothing(
    client: ApiClient, db_url: str
) -> None:
    payload = {
        "slug": "gpt2-tp8",
        "name": "GPT-2 over 8 GPUs",
        "model": "gpt-2",
        "mode": "inference",
        "batch_size": 1,
        "sequence_length": 128,
        "precision": "bf16",
        "options": {"parallelism": {"tensor": 8}},
    }
    before = table_counts(db_url)
    problem = assert_problem(client.post("/v1/workloads", json=payload), 422)
    assert _pointers(problem) == ["/options/parallelism/tensor"]
    assert table_counts(db_url) == before
    assert_problem(client.get("/v1/workloads/gpt2-tp8"), 404)
    payload["options"] = {"parallelism": {"tensor": 4}}  # 3 heads a GPU
    assert client.post("/v1/workloads", json=payload).status_code == 201


def test_tensor_16_estimate_keeps_one_kv_head_per_gpu(client: ApiClient) -> None:
    """Llama-3-8B (8 KV heads) at tensor 16, 8192 tokens, bf16: every GPU caches one KV head
    per layer, 2 x 32 x 1 x 128 x 8192 x 2 B = 134,217,728 B."""
    response = client.post(
        "/v1/estimates/memory",
        json={
            "model": "llama-3-8b",
            "mode": "inference",
            "batch_size": 1,
            "sequence_length": 8192,
            "precision": "bf16",
            "parallelism": {"tensor": 16},
        },
    )
    assert response.status_code == 200, response.text
    lines = {line["key"]: line for line in response.json()["breakdown"]}
    assert lines["kv_cache"]["bytes"] == 134_217_728
    assert "max(1, kv_heads // 16)" in lines["kv_cache"]["formula"]
    # weights: 1/16 of 8,030,261,248 x 2 B plus the replicated K/V rows, 32 x 2 x 64 x 4096 x 2
    assert lines["weights"]["bytes"] == 1_003_782_656 + 33_554_432
