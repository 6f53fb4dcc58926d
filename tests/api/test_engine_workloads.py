"""A workload's `engine` (vLLM) through the one shared requirement: the estimate's fit, the MIG
fit ("the smallest profile on which the engine starts with N sequences of L tokens") and plan,
stored workloads; bad engine options are 422 problems naming the field, nothing written."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.engines.vllm import (
    H100_80GB_CUDA_VISIBLE_BYTES,
    ServingModel,
    VllmOptions,
    decoder_stage_weights_bytes,
    engine_memory,
)
from app.domain.units import GIB
from tests.api.helpers import assert_problem
from tests.support import ApiClient, table_counts

H100 = "nvidia-h100-sxm"
T4 = "nvidia-t4"
# meta-llama/Meta-Llama-3-8B's config.json, by hand (not read from the service).
LLAMA_3_8B = ServingModel(
    layers=32,
    hidden_size=4096,
    attention_heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    max_position_embeddings=8192,
)


def _workload(**engine: Any) -> dict[str, Any]:
    return {
        "model": "llama-3-8b",
        "mode": "inference",
        "batch_size": 1,
        "engine": {"name": "vllm", **engine},
    }


def _estimate(client: ApiClient, hardware: str, **engine: Any) -> dict[str, Any]:
    response = client.post(
        "/v1/estimates/memory", json={**_workload(**engine), "hardware": hardware}
    )
    assert response.status_code == 200, response.text
    fit: dict[str, Any] = response.json()["fit"]
    return fit


def _memory(visible: int, options: VllmOptions) -> Any:
    weights = decoder_stage_weights_bytes(
        LLAMA_3_8B, options.tensor_parallel_size, options.pipeline_parallel_size, 2
    )
    return engine_memory(LLAMA_3_8B, options, visible, weights)


def test_the_estimates_fit_is_the_engines_on_an_h100(client: ApiClient) -> None:
    fit = _estimate(client, H100)
    expected = _memory(H100_80GB_CUDA_VISIBLE_BYTES, VllmOptions())
    engine = fit["engine"]
    assert engine["kv_tokens"] == expected.kv_tokens == 443_792
    assert engine["max_concurrency"] == pytest.approx(443_792 / 8192)
    assert engine["starts"] is engine["fits"] is fit["fits"] is True
    assert fit["usable_bytes"] == engine["cuda_visible_bytes"] == H100_80GB_CUDA_VISIBLE_BYTES
    lines = {line["key"]: line["bytes"] for line in fit["required"]}
    # Hand-derived: bf16 Llama-3-8B weights; one 8,192-token sequence of 131,072 B a token.
    assert lines["engine_weights"] == 8_030_261_248 * 2
    assert lines["engine_kv_cache"] == 8192 * 131_072 == GIB
    assert sum(lines.values()) == fit["required_bytes"]
    assert fit["safety_margin_fraction"] == 0.0
    spent = sum(v for k, v in lines.items() if k != "engine_unclaimed")
    assert int(0.9 * fit["required_bytes"]) >= spent > int(0.9 * (fit["required_bytes"] - 1))


def test_a_t4_does_not_start_it_with_vllms_own_message(client: ApiClient) -> None:
    fit = _estimate(client, T4)
    assert fit["fits"] is False
    assert fit["engine"]["starts"] is False
    assert fit["engine"]["reason"].startswith("No available memory for the cache blocks.")
    assert fit["required_bytes"] > fit["usable_bytes"]


def test_min_concurrency_decides_the_fit(client: ApiClient) -> None:
    ok = _estimate(client, H100, min_concurrency=54)
    short = _estimate(client, H100, min_concurrency=55)
    assert ok["fits"] is True
    assert short["fits"] is False
    assert short["engine"]["starts"] is True
    assert "concurrency 54.17" in short["engine"]["reason"]
    assert "55 sequences" in short["engine"]["reason"]
    assert short["required_bytes"] > short["usable_bytes"] >= ok["required_bytes"]


def test_a_max_model_len_the_pool_cannot_hold_is_vllms_refusal(client: ApiClient) -> None:
    fit = _estimate(client, "nvidia-l4", gpu_memory_utilization=0.68)
    assert fit["engine"]["starts"] is False
    assert (
        "To serve at least one request with the models's max seq len (8192)"
        in (fit["engine"]["reason"])
    )


def test_the_engines_tensor_degree_is_the_workloads(client: ApiClient) -> None:
    fit = _estimate(client, H100, tensor_parallel_size=4)
    expected = _memory(H100_80GB_CUDA_VISIBLE_BYTES, VllmOptions(tensor_parallel_size=4))
    assert fit["engine"]["kv_tokens"] == expected.kv_tokens
    assert fit["engine"]["options"]["tensor_parallel_size"] == 4


def test_mig_fit_smallest_profile_for_n_sequences_of_l_tokens(client: ApiClient) -> None:
    """The smallest H100 profile on which vLLM starts with 4 x 4,096 tokens: each other profile
    with its reason (no pool on 10 GB; 3.74 sequences on 20 GB)."""
    body = {"workload": _workload(), "gpu": H100, "min_concurrency": 4, "max_model_len": 4096}
    response = client.post("/v1/mig/fit", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    profiles = {p["profile"]: p for p in answer["profiles"]}
    assert answer["smallest_fitting_profile"] == "3g.40gb"
    assert answer["smallest_fitting_resource"] == "nvidia.com/mig-3g.40gb"
    assert profiles["1g.10gb"]["reason"].startswith("No available memory for the cache blocks")
    assert profiles["2g.20gb"]["fits"] is False
    assert "below the 4 sequences asked" in profiles["2g.20gb"]["reason"]
    assert profiles["3g.40gb"]["fits"] is True
    assert "reason" not in profiles["3g.40gb"]
    for p in answer["profiles"]:
        engine = p["engine"]
        assert p["usable_bytes"] == engine["cuda_visible_bytes"]
        assert engine["max_model_len"] == 4096
        assert engine["min_concurrency"] == 4
        assert p["fits"] is (engine["starts"] and engine["kv_tokens"] >= 4 * 4096)
        assert p["fits"] is (p["required_bytes"] <= p["usable_bytes"])
    # one sequence: the 20 GB profile suffices
    body["min_concurrency"] = 1
    answer = client.post("/v1/mig/fit", json=body).json()
    assert answer["smallest_fitting_profile"] == "1g.20gb"


def test_mig_fit_a_tensor_group_never_fits_a_slice(client: ApiClient) -> None:
    body = {"workload": _workload(tensor_parallel_size=2), "gpu": H100}
    answer = client.post("/v1/mig/fit", json=body).json()
    assert answer.get("smallest_fitting_profile") is None
    assert all("cannot span MIG slices" in p["reason"] for p in answer["profiles"])
    assert answer["alternatives"]["full_gpu_fits"] is True


def test_mig_plan_sizes_an_engine_workload_per_profile(client: ApiClient) -> None:
    body = {
        "gpu": H100,
        "workloads": [{"name": "chat", "replicas": 2, "workload": _workload(max_model_len=4096)}],
    }
    response = client.post("/v1/mig/plan", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["workloads"][0]["profile"] == "1g.20gb"


def test_a_stored_workload_keeps_its_engine(client: ApiClient) -> None:
    body = {"slug": "llama-vllm", "name": "Llama on vLLM", "model": "llama-3-8b",
            "mode": "inference", "batch_size": 1, "precision": "bf16",
            "options": {"engine": {"name": "vllm", "max_model_len": 4096}}}  # fmt: skip
    created = client.post("/v1/workloads", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["options"]["engine"]["max_model_len"] == 4096
    answer = client.post("/v1/mig/fit", json={"workload": "llama-vllm", "gpu": H100}).json()
    assert answer["smallest_fitting_profile"] == "1g.20gb"
    assert answer["engine"]["max_model_len"] == 4096


@pytest.mark.parametrize(
    ("engine", "pointer"),
    [
        ({"gpu_memory_utilization": 0}, "/engine/gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.01}, "/engine/gpu_memory_utilization"),
        ({"tensor_parallel_size": 3}, "/engine/tensor_parallel_size"),
        ({"max_model_len": 8193}, "/engine/max_model_len"),
        ({"pipeline_parallel_size": 33}, "/engine/pipeline_parallel_size"),
        ({"kv_cache_dtype": "fp4"}, "/engine/kv_cache_dtype"),
        ({"name": "sglang"}, "/engine/name"),
        ({"min_concurrency": 0}, "/engine/min_concurrency"),
    ],
)
def test_bad_engine_options_are_a_422_naming_the_field(
    client: ApiClient, db_url: str, engine: dict[str, Any], pointer: str
) -> None:
    before = table_counts(db_url)
    for url, body, prefix in (
        ("/v1/estimates/memory", {**_workload(**engine), "hardware": H100}, ""),
        ("/v1/mig/fit", {"workload": _workload(**engine), "gpu": H100}, "/workload"),
        ("/v1/workloads", {"slug": "bad", "name": "Bad", "model": "llama-3-8b",
                           "mode": "inference", "batch_size": 1, "precision": "bf16",
                           "options": {"engine": {"name": "vllm", **engine}}}, "/options"),
    ):  # fmt: skip
        problem = assert_problem(client.post(url, json=body), 422)
        pointers = [e.get("pointer") for e in problem.get("errors", [])] + [problem.get("pointer")]
        assert prefix + pointer in pointers, (url, problem)
    assert table_counts(db_url) == before


def test_an_engine_on_a_training_workload_or_a_clash_of_degrees_is_a_422(
    client: ApiClient, db_url: str
) -> None:
    before = table_counts(db_url)
    training = {**_workload(), "mode": "training", "hardware": H100}
    problem = assert_problem(client.post("/v1/estimates/memory", json=training), 422)
    assert "/engine" in [e.get("pointer") for e in problem["errors"]]
    clash = {**_workload(tensor_parallel_size=2), "parallelism": {"tensor": 4}, "hardware": H100}
    problem = assert_problem(client.post("/v1/estimates/memory", json=clash), 422)
    assert "/engine/tensor_parallel_size" in [e.get("pointer") for e in problem["errors"]]
    assert table_counts(db_url) == before


def test_mig_fit_questions_about_an_engine_need_one(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    plain = {"model": "llama-3-8b", "mode": "inference", "batch_size": 1}
    for name in ("min_concurrency", "max_model_len"):
        body = {"workload": plain, "gpu": H100, name: 4}
        problem = assert_problem(client.post("/v1/mig/fit", json=body), 422)
        assert problem.get("pointer") == f"/{name}" or f"/{name}" in [
            e.get("pointer") for e in problem.get("errors", [])
        ]
    body = {"workload": _workload(), "gpu": H100, "max_model_len": 100_000}
    problem = assert_problem(client.post("/v1/mig/fit", json=body), 422)
    assert "/max_model_len" in [e.get("pointer") for e in problem.get("errors", [])] + [
        problem.get("pointer")
    ]
    assert table_counts(db_url) == before


def test_recommendation_eligibility_follows_the_engine(client: ApiClient, db_url: str) -> None:
    """Devices on which vLLM does not start (a T4, a 10 GB slice) are excluded with its reason;
    the H100 stays a candidate."""
    body = {"model": "llama-3-8b", "precisions": ["bf16"], "batch_sizes": [1],
            "prompt_tokens": 512, "generated_tokens": 64,
            "devices": [H100, "nvidia-h100-sxm/1g.10gb", "nvidia-l4"],
            "engine": {"name": "vllm", "max_model_len": 4096}}  # fmt: skip
    response = client.post("/v1/recommendations/inference", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    excluded = {e["device"]: e["reason"] for e in answer["excluded"]}
    assert "nvidia-h100-sxm/1g.10gb" in excluded
    assert "No available memory for the cache blocks" in excluded["nvidia-h100-sxm/1g.10gb"]
    assert H100 not in excluded
    assert H100 in {c["device"] for c in answer["candidates"]}
    before = table_counts(db_url)
    body["devices"] = ["nvidia-h100-sxm/1g.10gb"]
    problem = assert_problem(client.post("/v1/recommendations/inference", json=body), 422)
    assert problem.get("pointer") == "/engine" or "/engine" in [
        e.get("pointer") for e in problem.get("errors", [])
    ]
    assert table_counts(db_url) == before


def _endpoint(client: ApiClient, hardware: str, **options: Any) -> dict[str, Any]:
    body = {"model": "llama-3-8b", "hardware": hardware, **options}
    response = client.post("/v1/engines/vllm/memory", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


GPTQ_W4 = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def test_runtime_fp8_sizes_the_workloads_engine(client: ApiClient) -> None:
    """`quantization: fp8` on a bf16 checkpoint: decoder linears in fp8, embedding, head and
    norms in bf16 (hand-derived from Llama-3-8B's config), as the endpoint answers."""
    fit = _estimate(client, H100, quantization="fp8")
    lines = {line["key"]: line["bytes"] for line in fit["required"]}
    linears = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)  # 1 B each
    kept = (2 * 128_256 * 4096 + 65 * 4096) * 2  # embedding, head, 65 norms in bf16
    assert linears == 6_979_321_856
    assert kept == 2_101_878_784
    scales = lines["engine_weights"] - linears - kept  # fp32 per-tensor scales only
    assert 0 < scales <= 32 * 7 * 4
    endpoint = _endpoint(client, H100, quantization="fp8")
    assert lines["engine_weights"] == endpoint["weights_bytes"]
    assert fit["engine"]["kv_tokens"] == endpoint["kv_tokens"]
    assert fit["engine"]["kv_tokens"] > _estimate(client, H100)["engine"]["kv_tokens"]


def test_a_gptq_checkpoint_config_sizes_the_workloads_engine(client: ApiClient) -> None:
    fit = _estimate(client, H100, quantization_config=GPTQ_W4)
    endpoint = _endpoint(client, H100, quantization_config=GPTQ_W4)
    assert endpoint["options"]["quantization"] == "gptq_marlin"
    lines = {line["key"]: line["bytes"] for line in fit["required"]}
    assert lines["engine_weights"] == endpoint["weights_bytes"] < 6 * GIB
    assert fit["engine"]["kv_tokens"] == endpoint["kv_tokens"]


@pytest.mark.parametrize(
    ("engine", "pointer"),
    [
        ({"quantization": "int3"}, "/engine/quantization"),
        ({"quantization": "awq", "quantization_config": GPTQ_W4}, "/engine/quantization"),
        ({"quantization": "gptq_marlin"}, "/engine/quantization_config"),
        (
            {"quantization": "gptq_marlin", "quantization_config": {**GPTQ_W4, "bits": 3}},
            "/engine/quantization_config/bits",
        ),
        ({"quantization_config": {"bits": 4}}, "/engine/quantization_config/quant_method"),
    ],
)
def test_a_quantization_the_config_contradicts_is_a_422_naming_the_field(
    client: ApiClient, db_url: str, engine: dict[str, Any], pointer: str
) -> None:
    test_bad_engine_options_are_a_422_naming_the_field(client, db_url, engine, pointer)


def test_recommendations_size_the_engine_with_its_quantization(client: ApiClient) -> None:
    """20 sequences of 4,096 tokens: bf16 Llama-3-8B leaves an L4 about 12 of them, fp8
    linears about 25, so the L4 is excluded without quantization and kept with it."""
    body = {"model": "llama-3-8b", "precisions": ["bf16"], "batch_sizes": [1],
            "prompt_tokens": 512, "generated_tokens": 64, "devices": ["nvidia-l4", H100],
            "engine": {"name": "vllm", "max_model_len": 4096, "min_concurrency": 20}}  # fmt: skip
    plain = client.post("/v1/recommendations/inference", json=body)
    assert plain.status_code == 200, plain.text
    excluded = {e["device"]: e["reason"] for e in plain.json()["excluded"]}
    assert "below the 20 sequences asked" in excluded["nvidia-l4"]
    body["engine"] = {**body["engine"], "quantization": "fp8"}  # type: ignore[dict-item]
    fp8 = client.post("/v1/recommendations/inference", json=body)
    assert fp8.status_code == 200, fp8.text
    assert "nvidia-l4" not in {e["device"] for e in fp8.json()["excluded"]}
    assert "nvidia-l4" in {c["device"] for c in fp8.json()["candidates"]}


def test_the_estimate_shows_every_figure_the_engines_fit_uses(client: ApiClient) -> None:
    """Beside the PyTorch breakdown, `engine` carries the per-GPU figures, and the fit's lines
    are read from them: weights, profile peak, non-torch (+ graphs sized before KV: none in
    0.19), KV bytes a token x whole blocks of one max_model_len sequence."""
    body = {**_workload(pipeline_parallel_size=2, max_num_seqs=64), "hardware": H100}
    answer = client.post("/v1/estimates/memory", json=body).json()
    engine = answer["engine"]
    assert engine == answer["fit"]["engine"]
    assert engine["cuda_graph_pool_bytes"] == round(0.91 * GIB)
    assert engine["profile_forward"]["source"] == "graph"
    assert [s["layers"] for s in engine["stages"]] == [16, 16]
    lines = {line["key"]: line["bytes"] for line in answer["fit"]["required"]}
    needs = [
        s["weights_bytes"] + s["profile_peak_bytes"] + s["non_torch_bytes"]
        + 8192 * s["kv_bytes_per_token"]
        for s in engine["stages"]
    ]  # fmt: skip
    worst = engine["stages"][needs.index(max(needs))]
    assert lines["engine_weights"] == worst["weights_bytes"]
    assert lines["engine_profile_peak"] == worst["profile_peak_bytes"]
    assert lines["engine_non_torch"] == worst["non_torch_bytes"]
    assert lines["engine_kv_cache"] == 8192 * worst["kv_bytes_per_token"]
    assert engine["kv_tokens"] == min(s["kv_tokens"] for s in engine["stages"])
    assert any("decide the fit, not the breakdown" in a for a in answer["assumptions"])
    bare = client.post("/v1/estimates/memory", json=_workload()).json()
    assert "engine" not in bare
    assert any("give `hardware`" in a for a in bare["assumptions"])


def test_a_stored_workload_keeps_its_quantization(client: ApiClient) -> None:
    engine = {"name": "vllm", "max_model_len": 4096, "quantization_config": GPTQ_W4}
    body = {"slug": "llama-gptq", "name": "Llama GPTQ on vLLM", "model": "llama-3-8b",
            "mode": "inference", "batch_size": 1, "precision": "bf16",
            "options": {"engine": engine}}  # fmt: skip
    created = client.post("/v1/workloads", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["options"]["engine"]["quantization_config"] == GPTQ_W4
    fit = client.post("/v1/mig/fit", json={"workload": "llama-gptq", "gpu": H100}).json()
    endpoint = _endpoint(client, H100, max_model_len=4096, quantization_config=GPTQ_W4)
    assert fit["engine"]["quantization"] == "gptq_marlin"
    assert fit["engine"]["kv_tokens"] == endpoint["kv_tokens"]
    assert fit["engine"]["weights_bytes"] == endpoint["weights_bytes"]
    # 4-bit weights (about 5 GiB) start on the 10 GB slice, where bf16 (15 GiB) cannot
    assert fit["smallest_fitting_profile"] == "1g.10gb"
