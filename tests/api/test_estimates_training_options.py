"""The training options practitioners set, through the API: bitsandbytes AdamW (8-bit, paged),
the optimizer step in backward, chunked cross-entropy, packed sequences and gradients kept
between steps; contradictory combinations are a 422 problem+json naming the field, and nothing
is written."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.helpers import assert_problem
from tests.support import ApiClient, table_counts

# Linear(1024, 1000) with bias: a 1,024,000-element weight and a 1,000-element bias
FC: dict[str, Any] = {
    "architecture": {
        "inputs": [{"name": "x", "shape": ["batch", 1024]}],
        "layers": [{"name": "fc", "op": "linear", "out_features": 1000}],
    },
    "mode": "training",
    "batch_size": 1,
    "precision": "fp32",
    "runtime": "pytorch_cpu",
}
# 1024 -> 4096 -> 1024 without biases: the largest parameter has 4,194,304 elements
CHAIN: dict[str, Any] = {
    **FC,
    "architecture": {
        "inputs": [{"name": "x", "shape": ["batch", 1024]}],
        "layers": [
            {"name": "fc1", "op": "linear", "out_features": 4096, "bias": False},
            {"name": "fc2", "op": "linear", "out_features": 1024, "bias": False},
        ],
    },
}
LM: dict[str, Any] = {
    **FC,
    "architecture": {
        "inputs": [{"name": "ids", "shape": ["batch", "seq"], "dtype": "int64"}],
        "layers": [
            {"name": "embed", "op": "embedding", "num_embeddings": 1000, "embedding_dim": 64},
            {"name": "lm_head", "op": "linear", "out_features": 1000, "bias": False},
        ],
        "default_bindings": {"seq": 1024},
    },
    "optimizer": "sgd",
}


def _post(client: ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/estimates/memory", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    assert sum(line["bytes"] for line in result["breakdown"]) == result["peak_bytes"]
    return result


def _lines(body: dict[str, Any]) -> dict[str, int]:
    return {line["key"]: line["bytes"] for line in body["breakdown"]}


def test_adamw_8bit_state(client: ApiClient) -> None:
    body = _post(client, {**FC, "optimizer": "adamw_8bit"})
    # weight: 2 x 1,024,000 x 1 B + 2 x 4,000 absmax x 4 B; bias (< 4,096 elements): 2 x 1,000
    # x 4 B; quantization maps 2 x 256 x 4 B
    assert _lines(body)["optimizer_state"] == 2_048_000 + 32_000 + 8_000 + 2_048
    assert body["host_memory"] == []


def test_paged_adamw_8bit_reports_paged_state_on_the_host(client: ApiClient) -> None:
    body = _post(client, {**FC, "optimizer": "paged_adamw_8bit"})
    assert _lines(body)["optimizer_state"] == 32_000 + 8_000 + 2_048
    host = {line["key"]: line for line in body["host_memory"]}
    assert host["paged_optimizer_state"]["bytes"] == 2_048_000
    assert "cudaMallocManaged" in host["paged_optimizer_state"]["assumptions"][0]


def test_optimizer_in_backward(client: ApiClient) -> None:
    body = _post(client, {**CHAIN, "optimizer_in_backward": True})
    assert _lines(body)["gradients"] == 4096 * 1024 * 4  # the largest parameter's only
    assert body["peak_phase"] == "backward"
    assert "optimizer_step" not in body["phase_peaks"]
    assert any("optimizer_in_backward" in a for a in body["assumptions"])
    plain = _post(client, CHAIN)
    assert body["peak_bytes"] < plain["peak_bytes"]


def test_loss_chunks(client: ApiClient) -> None:
    one = _post(client, {**LM, "loss_chunks": 1})
    eight = _post(client, {**LM, "loss_chunks": 8})
    # the loss's backward: two fp32 gradients of 1,024 x 1,000 x 4 B in one chunk, of
    # 128 x 1,000 x 4 B in eight (fp32 logits: no upcast copy)
    assert one["phase_peaks"]["backward"] - eight["phase_peaks"]["backward"] == 2 * (
        4_096_000 - 512_000
    )
    assert any("CEWithChunkedOutputLoss" in a for a in eight["assumptions"])


def test_loss_logits_sum(client: ApiClient) -> None:
    # HF's loss (tests/domain/test_loss_rule.py, fp32 here): no upcast copy; the loss's
    # backward holds the fp32 log-probabilities and their two gradients, 3 x 4,096,000 B
    hf = _post(client, LM)
    assert _lines(hf)["loss"] == _lines(hf)["transient"] // 2 == 4_096_000
    summed = _post(client, {**LM, "loss": "logits_sum"})
    assert "loss" not in _lines(summed)
    assert summed["peak_bytes"] < hf["peak_bytes"]


def test_packed_tokens_per_batch(client: ApiClient) -> None:
    body = _post(client, {**LM, "batch_size": 4, "tokens_per_batch": 3000})
    assert body["bindings"]["batch"] == 1
    assert body["bindings"]["seq"] == 3000
    assert _lines(body)["loss"] == 3000 * 1000 * 4
    assert any("packed sequences" in a for a in body["assumptions"])


def test_keep_outputs(client: ApiClient) -> None:
    """The loop holds ``outputs``: the previous step's logits (1,024 tokens x 1,000 fp32
    values; the toy model returns no key/value cache) join the steady forward."""
    plain = _post(client, {**LM, "loss": "logits_sum"})
    held = _post(client, {**LM, "loss": "logits_sum", "keep_outputs": True})
    logits = 1024 * 1000 * 4
    assert held["phase_peaks"]["forward"] == plain["phase_peaks"]["forward"] + logits
    assert held["phase_peaks"]["backward"] == plain["phase_peaks"]["backward"]
    assert any("keep_outputs" in text for text in held["assumptions"])
    # with Hugging Face's loss the loop no longer drops the logits before the backward
    dropped = _post(client, LM)
    kept = _post(client, {**LM, "keep_outputs": True})
    assert kept["phase_peaks"]["backward"] == dropped["phase_peaks"]["backward"] + logits


def test_keep_gradients(client: ApiClient) -> None:
    kept = _post(client, {**CHAIN, "keep_gradients": True})
    freed = _post(client, CHAIN)
    assert kept["phase_peaks"]["forward"] - freed["phase_peaks"]["forward"] == 2 * 4096 * 1024 * 4


def test_activation_offload_reports_pinned_host_memory(client: ApiClient) -> None:
    deep = {
        **FC,
        "architecture": {
            "inputs": [{"name": "x", "shape": [64, 1024]}],
            "layers": [
                {"name": f"fc{i}", "op": "linear", "out_features": 1024, "bias": False}
                for i in range(4)
            ],
        },
        "runtime": "pytorch_cuda",
        "optimizer": "sgd",
    }
    body = _post(client, {**deep, "activation_offload": True})
    plain = _post(client, deep)
    # fc1..fc3's outputs (64 x 1,024 x 4 B each) are pinned on the host
    assert [(line["key"], line["bytes"]) for line in body["host_memory"]] == [
        ("offloaded_activations", 3 * 64 * 1024 * 4)
    ]

    # the forward's bytes, net of the allocator lines (each estimate's replay of its own step:
    # with the offload, the reserve of the offloaded step)
    def forward(estimate: dict[str, Any]) -> int:
        lines = _lines(estimate)
        cached = lines["allocator_rounding"] + lines["fragmentation_reserve"]
        return int(estimate["phase_peaks"]["forward"]) - cached

    assert forward(plain) - forward(body) == 64 * 1024 * 4


def test_zero3_cpu_offload_reports_the_host_shards(client: ApiClient) -> None:
    body = _post(
        client,
        {
            **CHAIN,
            "runtime": "pytorch_cuda",
            "precision": "mixed_bf16",
            "parallelism": {"data": 2, "zero_stage": 3, "cpu_offload": True},
        },
    )
    params = 2 * 4096 * 1024
    host = {line["key"]: line["bytes"] for line in body["host_memory"]}
    assert host["offloaded_weights"] == params  # params x 2 B / 2 ranks
    assert host["offloaded_optimizer_state"] == 4 * params
    assert _lines(body)["weights"] == 0
    assert "optimizer_step" not in body["phase_peaks"]


@pytest.mark.parametrize(
    ("body", "pointer", "fragment"),
    [
        ({**LM, "loss_chunks": 0}, "/loss_chunks", "greater"),
        ({**FC, "loss_chunks": 2}, "/loss_chunks", "token-level"),
        ({**LM, "mode": "inference", "loss_chunks": 2}, "/loss_chunks", "training"),
        ({**LM, "loss": "mse"}, "/loss", "cross_entropy"),
        ({**LM, "mode": "inference", "loss": "logits_sum"}, "/loss", "training"),
        ({**LM, "mode": "inference", "keep_outputs": True}, "/keep_outputs", "training"),
        ({**LM, "keep_outputs": "maybe"}, "/keep_outputs", "bool"),
        ({**LM, "loss": "logits_sum", "loss_chunks": 2}, "/loss", "nothing to chunk"),
        (
            {**CHAIN, "batch_size": 2, "micro_batch_size": 1, "optimizer_in_backward": True},
            "/optimizer_in_backward",
            "accumulate",
        ),
        (
            {**CHAIN, "optimizer_in_backward": True, "keep_gradients": True},
            "/keep_gradients",
            "frees",
        ),
        (
            {
                **CHAIN,
                "optimizer_in_backward": True,
                "precision": "mixed_bf16",
                "parallelism": {"data": 2, "zero_stage": 1},
            },
            "/optimizer_in_backward",
            "ZeRO-1",
        ),
        ({**LM, "tokens_per_batch": 512, "sequence_length": 1024}, "/tokens_per_batch", "exceeds"),
        ({**FC, "tokens_per_batch": 512}, "/tokens_per_batch", "seq"),
        ({**FC, "activation_offload": True}, "/activation_offload", "pytorch_cpu"),
        (
            {**FC, "mode": "inference", "compile": True, "engine": {"name": "vllm"}},
            "/compile",
            "compilation_config",
        ),
        (
            {**CHAIN, "parallelism": {"data": 2, "zero_stage": 1, "cpu_offload": True}},
            "/parallelism/cpu_offload",
            "zero_stage 3",
        ),
    ],
)
def test_contradictory_training_options_are_422(
    client: ApiClient, db_url: str, body: dict[str, Any], pointer: str, fragment: str
) -> None:
    before = table_counts(db_url)
    problem = assert_problem(client.post("/v1/estimates/memory", json=body), 422)
    assert fragment in problem["detail"]
    assert pointer in [error["pointer"] for error in problem["errors"]]
    assert table_counts(db_url) == before


def test_compile_keeps_less_for_backward(client: ApiClient) -> None:
    gpt2 = {"model": "gpt-2", "mode": "training", "batch_size": 2, "sequence_length": 256,
            "precision": "amp_bf16", "runtime": "pytorch_cuda"}  # fmt: skip
    eager = _post(client, gpt2)
    compiled = _post(client, {**gpt2, "compile": True})
    # GPT-2's gelu_new intermediates are recomputed: fewer saved activations, a lower peak
    assert compiled["peak_bytes"] < eager["peak_bytes"]
    assert any(a.startswith("compile: torch.compile") for a in compiled["assumptions"])
    inference = {**gpt2, "mode": "inference"}
    assert (
        _post(client, {**inference, "compile": True})["peak_bytes"]
        == _post(client, inference)["peak_bytes"]
    )


def test_zero3_offload_on_one_gpu_is_deepspeeds(client: ApiClient) -> None:
    body = {**CHAIN, "precision": "mixed_bf16", "runtime": "pytorch_cuda",
            "parallelism": {"zero_stage": 3, "cpu_offload": True}}  # fmt: skip
    lines = _lines(_post(client, body))
    # DeepSpeed's defaults: 5e8 x 2 B bucket; gathered: both layers (2 x 4,194,304, reused
    # within stage3_max_reuse_distance 1e9: kept into the backward) + 5e7 prefetched + the
    # prefetch's GPU copy of its host partitions (offload_param), x 2 B
    assert lines["zero_reduce_bucket"] == 1_000_000_000
    assert lines["zero_gathered_params"] == (2 * 4_194_304 + 2 * 50_000_000) * 2
    assert lines["weights"] == 0
    tuned = {**body, "parallelism": {**body["parallelism"],
             "deepspeed": {"reduce_bucket_size": 1_000_000}}}  # fmt: skip
    assert _lines(_post(client, tuned))["zero_reduce_bucket"] == 2_000_000
    problem = assert_problem(
        client.post(
            "/v1/estimates/memory",
            json={**CHAIN, "parallelism": {"deepspeed": {"reduce_bucket_size": 1}}},
        ),
        422,
    )
    assert "/parallelism/deepspeed" in [error["pointer"] for error in problem["errors"]]
