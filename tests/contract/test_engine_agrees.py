"""One engine, one answer: POST /v1/engines/vllm/memory and a workload's `engine` (the
estimate's fit, hence the MIG fit, admission and recommendations, which share
app.services.engine_fit) give the same bytes, down to the byte, on whole GPUs and MIG slices.

Both go through app.services.engines.engine_start: the same weights (quantized or not) and the
same profile-run peak from the model's graph (profile_forward), not a per-architecture formula
on one side. The cases include ones where the profile forward, not the sampler, sets the peak
(small max_num_seqs, a first pipeline stage), where a formula would answer other bytes.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.engines.vllm import ServingModel, forward_peak_bytes
from tests.support import ApiClient

H100 = "nvidia-h100-sxm"
# meta-llama/Meta-Llama-3-8B's config.json, by hand (not read from the service).
LLAMA_3_8B = ServingModel(
    layers=32, hidden_size=4096, attention_heads=32, kv_heads=8, head_dim=128,
    intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
)  # fmt: skip
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "defaults": (H100, {}),
    "forward sets the peak": (H100, {"max_num_seqs": 16}),
    "pipeline 2": (H100, {"pipeline_parallel_size": 2, "max_num_seqs": 64}),
    "tensor 2, fp8 KV": (H100, {"tensor_parallel_size": 2, "kv_cache_dtype": "fp8"}),
    "runtime fp8": (H100, {"quantization": "fp8", "max_num_seqs": 8}),
    "gptq checkpoint": (H100, {"quantization_config": GPTQ, "max_num_batched_tokens": 4096}),
    "fp32, eager": ("nvidia-a100-80gb-sxm", {"dtype": "float32", "enforce_eager": True}),
    "small GPU": ("nvidia-l4", {"max_model_len": 4096}),
    "MIG slice": ("nvidia-h100-sxm/3g.40gb", {"max_model_len": 4096, "max_num_seqs": 32}),
}
SAME = (
    "requested_bytes",
    "cuda_graph_pool_bytes",
    "stages",
    "profile_forward",
    "weights_bytes",
    "profile_peak_bytes",
    "non_torch_bytes",
    "kv_pool_bytes",
    "kv_tokens",
    "max_concurrency",
    "starts",
    "reason",
)


def _ok(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize("case", list(CASES))
def test_the_endpoint_and_the_workloads_engine_agree_byte_for_byte(
    client: ApiClient, case: str
) -> None:
    hardware, options = CASES[case]
    workload = {"model": "llama-3-8b", "mode": "inference", "batch_size": 1}
    estimate = _ok(
        client.post(
            "/v1/estimates/memory",
            json={**workload, "hardware": hardware, "engine": {"name": "vllm", **options}},
        )
    )
    fit = estimate["fit"]["engine"]
    assert estimate["engine"] == fit  # the estimate shows the engine's figures beside the fit
    gpu = hardware.split("/", 1)[0]
    endpoint = _ok(
        client.post(
            "/v1/engines/vllm/memory",
            json={
                "model": "llama-3-8b",
                "hardware": gpu,
                "cuda_visible_bytes": fit["cuda_visible_bytes"],
                **options,
            },
        )
    )
    assert {k: fit.get(k) for k in SAME} == {k: endpoint.get(k) for k in SAME}
    lines = {line["key"]: line["bytes"] for line in estimate["fit"]["required"]}
    worst = max(endpoint["stages"], key=lambda s: s["weights_bytes"] + s["profile_peak_bytes"])
    assert lines["engine_profile_peak"] == worst["profile_peak_bytes"]


def test_a_formula_peak_would_answer_other_bytes(client: ApiClient) -> None:
    """The agreement is not vacuous: where the forward sets the peak, the graph's peak and the
    per-architecture formula differ, and the workload's fit shows the graph's."""
    body = {"model": "llama-3-8b", "hardware": H100, "max_num_seqs": 16}
    endpoint = _ok(client.post("/v1/engines/vllm/memory", json=body))
    assert endpoint["profile_forward"]["source"] == "graph"
    graph = endpoint["profile_forward"]["forward_peak_bytes"]
    assert endpoint["profile_peak_bytes"] == graph
    assert forward_peak_bytes(LLAMA_3_8B, 8192, 1, 2) != graph
    workload = {"model": "llama-3-8b", "mode": "inference", "batch_size": 1, "hardware": H100,
                "engine": {"name": "vllm", "max_num_seqs": 16}}  # fmt: skip
    fit = _ok(client.post("/v1/estimates/memory", json=workload))["fit"]
    assert fit["engine"]["profile_peak_bytes"] == graph
