"""POST /v1/engines/vllm/memory: vLLM's start-up memory for a stored decoder on a catalog GPU."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.config import PROJECT_ROOT
from app.domain.engines.families import MlaGeometry
from app.domain.engines.profile_forward import graph_forward_peak
from app.domain.engines.vllm import (
    H100_80GB_CUDA_VISIBLE_BYTES,
    NO_MEMORY_MESSAGE,
    ServingModel,
    VllmOptions,
    decoder_stage_weights_bytes,
    engine_memory,
    graph_forward_peak_bytes,
)
from app.importers.hf_config import import_hf_config
from tests.api.helpers import assert_problem
from tests.support import ApiClient, table_counts

URL = "/v1/engines/vllm/memory"
H100 = "nvidia-h100-sxm"
# meta-llama/Meta-Llama-3-8B's config.json, written by hand (not read from the service).
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


# RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16's scheme (model card: GPTQ, symmetric,
# groups of 128; desc_act as AutoGPTQ's default).
GPTQ_W4A16: dict[str, Any] = {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": 128,
    "desc_act": True,
    "sym": True,
}
# Llama-3-8B at TP 1: embedding + head (128256 x 4096 x 2 B each) and 65 norms stay bf16; each
# of 32 layers has 218,103,808 linear weights (q/k/v/o 4096 x 10240, gate/up/down 3 x 4096 x
# 14336).
UNQUANTIZED = 2 * 128256 * 4096 * 2 + 65 * 4096 * 2
LINEAR_PARAMS = 32 * (4096 * 10240 + 3 * 4096 * 14336)


def _post(client: ApiClient, **body: Any) -> dict[str, Any]:
    response = client.post(URL, json={"model": "llama-3-8b", "hardware": H100, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_llama_3_8b_on_an_h100_matches_the_engine_model(client: ApiClient) -> None:
    body = _post(client)
    weights = decoder_stage_weights_bytes(LLAMA_3_8B, 1, 1, 2)
    expected = engine_memory(LLAMA_3_8B, VllmOptions(), H100_80GB_CUDA_VISIBLE_BYTES, weights)
    assert body["cuda_visible_bytes"] == H100_80GB_CUDA_VISIBLE_BYTES
    assert body["cuda_visible_source"].startswith("hardware catalog cuda_visible_memory_bytes")
    assert "total_memory=79.19GiB" in body["cuda_visible_source"]
    assert body["kv_tokens"] == expected.kv_tokens > 0
    assert body["max_concurrency"] == pytest.approx(expected.kv_tokens / 8192)
    assert body["starts"] is True
    assert "reason" not in body
    (stage,) = body["stages"]
    # Hand-derived: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes (bf16) at TP 1.
    assert stage["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 131_072
    assert stage["weights_bytes"] == body["weights_bytes"] == weights[0]
    assert stage["kv_pool_bytes"] == expected.stages[0].kv_pool_bytes
    assert body["kv_tokens"] == stage["kv_pool_bytes"] // (131_072 * 16) * 16
    # Llama-3-8B has 8,030,261,248 parameters (vocabulary 128256 is already a multiple of 64).
    assert body["weights_bytes"] == 8_030_261_248 * 2
    assert body["requested_bytes"] == int(0.9 * H100_80GB_CUDA_VISIBLE_BYTES)
    options = body["options"]
    assert options["max_model_len"] == 8192
    assert options["gpu_memory_utilization"] == 0.9
    assert (options["max_num_batched_tokens"], options["max_num_seqs"]) == (8192, 1024)
    assert options["block_size"] == 16
    assert options["dtype"] == "bfloat16"
    assert set(body["defaults_used"]) == {
        "max_model_len",
        "gpu_memory_utilization",
        "max_num_batched_tokens",
        "max_num_seqs",
        "block_size",
        "dtype",
        "kv_cache_dtype",
    }
    assert body["engine"]["name"] == "vllm"
    assert body["engine"]["version"] == "0.19.0"
    assert "start_verdict" in body["engine"]["sources"]
    assert body["assumptions"]


def test_tensor_parallel_fp8_kv_and_a_visible_memory_override(client: ApiClient) -> None:
    body = _post(
        client,
        tensor_parallel_size=2,
        kv_cache_dtype="fp8",
        max_model_len=4096,
        gpu_memory_utilization=0.95,
        cuda_visible_bytes=80 * 2**30,
    )
    options = VllmOptions(
        tensor_parallel_size=2,
        kv_cache_dtype="fp8",
        max_model_len=4096,
        gpu_memory_utilization=0.95,
    )
    weights = decoder_stage_weights_bytes(LLAMA_3_8B, 2, 1, 2)
    expected = engine_memory(LLAMA_3_8B, options, 80 * 2**30, weights)
    assert body["gpus"] == 2
    assert body["cuda_visible_source"] == "request (cuda_visible_bytes)"
    assert body["stages"][0]["kv_bytes_per_token"] == 2 * 32 * 4 * 128 * 1
    assert body["kv_tokens"] == expected.kv_tokens
    assert body["non_torch_bytes"] > body["stages"][0]["kv_bytes_per_token"]
    assert "kv_cache_dtype" not in body["defaults_used"]


def test_pipeline_stages_differ(client: ApiClient) -> None:
    body = _post(client, pipeline_parallel_size=2)
    first, last = body["stages"]
    weights = decoder_stage_weights_bytes(LLAMA_3_8B, 1, 2, 2)
    assert (first["weights_bytes"], last["weights_bytes"]) == weights
    assert first["layers"] + last["layers"] == 32
    assert body["kv_tokens"] == min(first["kv_tokens"], last["kv_tokens"])


def test_a_pool_too_small_for_one_sequence_does_not_start(client: ApiClient) -> None:
    # 0.2 x 79.19 GiB = 15.84 GiB < 14.96 GiB of weights + the profile peak: no pool at all.
    body = _post(client, gpu_memory_utilization=0.2)
    assert body["starts"] is False
    assert body["reason"] == NO_MEMORY_MESSAGE
    assert body["kv_tokens"] == 0
    assert body["max_concurrency"] == 0
    assert body["kv_pool_bytes"] <= 0
    # 0.22: a pool of ~0.32 GiB, less than one 8192-token sequence's 1 GiB: vLLM's other message.
    small = _post(client, gpu_memory_utilization=0.22)
    weights = decoder_stage_weights_bytes(LLAMA_3_8B, 1, 1, 2)
    expected = engine_memory(
        LLAMA_3_8B,
        VllmOptions(gpu_memory_utilization=0.22),
        H100_80GB_CUDA_VISIBLE_BYTES,
        weights,
    )
    assert 0 < small["kv_pool_bytes"] < 8192 * 131_072
    assert small["starts"] is False
    assert small["reason"] == expected.reason
    assert small["reason"].startswith("To serve at least one request with the models's max seq")
    assert "(1.00 GiB KV cache is needed" in small["reason"]
    # The same pool with a shorter max_model_len starts.
    assert _post(client, gpu_memory_utilization=0.22, max_model_len=2048)["starts"] is True


def test_runtime_fp8_stores_one_byte_linears_and_frees_kv_memory(client: ApiClient) -> None:
    plain = _post(client)
    body = _post(client, quantization="fp8")
    # fp8 linears (1 B) with one fp32 scale per module (4 modules x 32 layers); the rest bf16.
    assert body["weights_bytes"] == UNQUANTIZED + LINEAR_PARAMS + 4 * 32 * 4 == 9_081_201_152
    quant = body["quantization"]
    assert (quant["method"], quant["checkpoint"], quant["stage"]) == ("fp8", False, 0)
    assert quant["stored"] == {
        "packed_weight_bytes": LINEAR_PARAMS,
        "scale_bytes": 512,
        "zero_point_bytes": 0,
        "g_idx_bytes": 0,
    }
    assert quant["unquantized_bytes"] == UNQUANTIZED
    assert (quant["quantized_modules"], quant["skipped_modules"]) == (128, 0)
    assert body["options"]["quantization"] == "fp8"
    assert "fp8 (runtime quantization)" in " ".join(body["assumptions"])
    # The KV pool grows by exactly the weights saved (same peak and non-torch memory).
    saved = plain["weights_bytes"] - body["weights_bytes"]
    assert body["kv_pool_bytes"] - plain["kv_pool_bytes"] == saved
    assert body["stages"][0]["kv_bytes_per_token"] == 131_072  # the KV cache stays bf16
    assert "quantization" not in plain
    assert quant["kernels"] == ["fp8"]
    # An A100 (8.0) has no fp8 math: FP8 Marlin, weight-only, one bf16 scale per output column.
    a100 = client.post(
        URL, json={"model": "llama-3-8b", "hardware": "nvidia-a100-80gb-sxm", "quantization": "fp8"}
    )
    assert a100.status_code == 200, a100.text
    marlin = a100.json()["quantization"]
    assert marlin["kernels"] == ["fp8_marlin"]
    assert marlin["stored"]["scale_bytes"] == 32 * (6144 + 4096 + 28672 + 4096) * 2


def test_a_gptq_checkpoint_runs_as_gptq_marlin(client: ApiClient) -> None:
    body = _post(client, dtype="float16", quantization_config=GPTQ_W4A16)
    quant = body["quantization"]
    assert quant["method"] == body["options"]["quantization"] == "gptq_marlin"
    assert quant["checkpoint"] is True
    assert quant["kernels"] == ["machete"]  # an H100 is compute capability 9.0
    # int4 packed (half a byte a weight); fp16 scales per 128 inputs of qkv (6144 outputs), o
    # (4096), gate_up (28672) and down (14336 inputs: 112 groups x 4096); Machete keeps the
    # checkpoint's int4 qzeros (a quarter of the scales' bytes) and g_idx, plus the act-order
    # permutation: 2 x int32 per input.
    scales = 32 * (32 * 6144 + 32 * 4096 + 32 * 28672 + 112 * 4096) * 2
    g_idx = 32 * (3 * 4096 + 14336) * 2 * 4
    assert quant["stored"] == {
        "packed_weight_bytes": LINEAR_PARAMS // 2,
        "scale_bytes": scales,
        "zero_point_bytes": scales // 4,
        "g_idx_bytes": g_idx,
    }
    assert body["weights_bytes"] == (
        UNQUANTIZED + LINEAR_PARAMS // 2 + scales + scales // 4 + g_idx
    )
    assert "gptq_marlin" in quant["sources"]
    # An A100 (8.0) runs Marlin, which drops the symmetric checkpoint's zeros.
    a100 = client.post(
        URL,
        json={
            "model": "llama-3-8b",
            "hardware": "nvidia-a100-80gb-sxm",
            "dtype": "float16",
            "quantization_config": GPTQ_W4A16,
        },
    )
    assert a100.status_code == 200, a100.text
    marlin = a100.json()["quantization"]
    assert marlin["kernels"] == ["marlin"]
    assert marlin["stored"] == {**quant["stored"], "zero_point_bytes": 0}
    # Asked for the exllama kernel explicitly, it keeps the packed zeros and one g_idx.
    exllama = _post(client, quantization="gptq", quantization_config=GPTQ_W4A16)
    assert exllama["quantization"]["method"] == "gptq"
    assert exllama["quantization"]["stored"]["zero_point_bytes"] == scales // 4


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"gpu_memory_utilization": 0}, "/gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "/gpu_memory_utilization"),
        ({"tensor_parallel_size": 3}, "/tensor_parallel_size"),
        ({"max_model_len": 8193}, "/max_model_len"),
        ({"pipeline_parallel_size": 33}, "/pipeline_parallel_size"),
        ({"model": "gpt-2"}, "/model"),
        # A --quantization the checkpoint's quantization_config contradicts (vLLM refuses it).
        ({"quantization": "awq", "quantization_config": GPTQ_W4A16}, "/quantization"),
        ({"quantization": "fp8", "quantization_config": GPTQ_W4A16}, "/quantization"),
        (
            {"quantization": "gptq_marlin", "quantization_config": {**GPTQ_W4A16, "bits": 3}},
            "/quantization_config/bits",
        ),
        ({"quantization": "gptq"}, "/quantization_config"),
        ({"quantization": "int4"}, "/quantization"),
    ],
)
def test_bad_input_is_a_422_naming_the_field(
    client: ApiClient, db_url: str, body: dict[str, Any], pointer: str
) -> None:
    before = table_counts(db_url)
    response = client.post(URL, json={"model": "llama-3-8b", "hardware": H100, **body})
    problem = assert_problem(response, 422)
    pointers = [e.get("pointer") for e in problem.get("errors", [])] + [problem.get("pointer")]
    assert pointer in pointers, problem
    assert table_counts(db_url) == before


@pytest.mark.parametrize(
    "body", [{"model": "no-such-model"}, {"hardware": "no-such-gpu"}], ids=["model", "hardware"]
)
def test_unknown_model_or_hardware_is_a_404(client: ApiClient, body: dict[str, Any]) -> None:
    response = client.post(URL, json={"model": "llama-3-8b", "hardware": H100, **body})
    assert_problem(response, 404)


HF_CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs"
# Each config's geometry written by hand from its config.json (the context is the imported
# sequence_length, the model's default `seq` binding).
IMPORTED = {
    "mixtral-8x7b-v0.1": ServingModel(
        layers=32,
        hidden_size=4096,
        attention_heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        experts=8,
        experts_per_token=2,
        max_position_embeddings=4096,
    ),
    "qwen2-0.5b": ServingModel(
        layers=24,
        hidden_size=896,
        attention_heads=14,
        kv_heads=2,
        head_dim=64,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
        qkv_bias=True,
        max_position_embeddings=4096,
    ),
    "deepseek-v2-lite-chat": ServingModel(
        layers=27,
        hidden_size=2048,
        attention_heads=16,
        kv_heads=16,
        head_dim=192,
        intermediate_size=1408,
        vocab_size=102400,
        experts=64,
        experts_per_token=6,
        mla_latent_dim=576,
        max_position_embeddings=4096,
        mla=MlaGeometry(
            kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128
        ),
        shared_expert_intermediate_size=2 * 1408,
        dense_layers=(0,),
        dense_intermediate_size=10944,
    ),
    "gemma-2-9b-it": ServingModel(
        layers=42,
        hidden_size=3584,
        attention_heads=16,
        kv_heads=8,
        head_dim=256,
        intermediate_size=14336,
        vocab_size=256000,
        tie_word_embeddings=True,
        norms_per_layer=4,
        sliding_window=4096,
        max_position_embeddings=4096,
    ),
    "gemma-2b": ServingModel(
        layers=18,
        hidden_size=2048,
        attention_heads=8,
        kv_heads=1,
        head_dim=256,
        intermediate_size=16384,
        vocab_size=256000,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ),
}


@pytest.mark.parametrize("name", sorted(IMPORTED))
def test_imported_decoders_map_to_their_config_geometry(client: ApiClient, name: str) -> None:
    config = json.loads((HF_CONFIGS / f"{name}.json").read_text())
    created = client.post(
        "/v1/models/import/hf-config",
        json={"slug": name.replace(".", "-"), "sequence_length": 4096, "config": config},
    )
    assert created.status_code == 201, created.text
    model = IMPORTED[name]
    tp = 2
    response = client.post(
        URL,
        json={"model": name.replace(".", "-"), "hardware": H100, "tensor_parallel_size": tp},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    weights = decoder_stage_weights_bytes(model, tp, 1, 2)
    # the profile forward from the config's own graph: 8192 tokens (the H100's default
    # max_num_batched_tokens) on one of 2 tensor-parallel ranks, in bf16
    graph = import_hf_config(config, sequence_length=4096)
    peak = graph_forward_peak(
        graph.inputs,
        graph.layers,
        graph.default_bindings,
        tokens=8192,
        tensor_parallel_size=tp,
        dtype="bfloat16",
    )
    expected = engine_memory(
        model,
        VllmOptions(tensor_parallel_size=tp),
        H100_80GB_CUDA_VISIBLE_BYTES,
        weights,
        forward_peak=graph_forward_peak_bytes(peak.peak_bytes),
    )
    forward = body["profile_forward"]
    assert forward["source"] == "graph"
    assert (forward["tokens"], forward["tensor_parallel_size"]) == (8192, 2)
    assert forward["graph_peak_bytes"] == peak.peak_bytes
    assert body["weights_bytes"] == weights[0]
    assert body["kv_tokens"] == expected.kv_tokens
    assert body["stages"][0]["kv_bytes_per_token"] == expected.stages[0].kv_bytes_per_token
    assert body["options"]["max_model_len"] == 4096


def test_a_cpu_is_a_422_naming_hardware(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    response = client.post(URL, json={"model": "llama-3-8b", "hardware": "amd-epyc-9654"})
    problem = assert_problem(response, 422)
    assert "/hardware" in [e.get("pointer") for e in problem.get("errors", [])] + [
        problem.get("pointer")
    ]
    assert table_counts(db_url) == before


def _llama_3_8b_config(**extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((HF_CONFIGS / "llama-3-8b.json").read_text())
    return {**config, **extra}


def test_an_hf_config_with_its_quantization_config_is_the_model(
    client: ApiClient, db_url: str
) -> None:
    before = table_counts(db_url)
    config = _llama_3_8b_config(torch_dtype="float16", quantization_config=GPTQ_W4A16)
    response = client.post(URL, json={"hf_config": config, "hardware": H100})
    assert response.status_code == 200, response.text
    body = response.json()
    stored = _post(client, dtype="float16", quantization_config=GPTQ_W4A16)
    # The same geometry as the stored llama-3-8b, its own quantization_config and dtype.
    assert body["model"] == "hf_config (meta-llama/Meta-Llama-3-8B)"
    assert body["quantization"]["method"] == "gptq_marlin"
    assert body["weights_bytes"] == stored["weights_bytes"]
    assert body["quantization"]["stored"] == stored["quantization"]["stored"]
    assert body["options"]["dtype"] == "float16"
    assert body["options"]["max_model_len"] == 8192  # max_position_embeddings
    assert body["kv_tokens"] == stored["kv_tokens"]
    assert table_counts(db_url) == before  # imported for the answer only


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"model": "llama-3-8b", "hf_config": {"model_type": "llama"}}, "/hf_config"),
        ({}, "/model"),
        ({"hf_config": {"model_type": "no-such-type"}}, "/hf_config/model_type"),
        (
            {"hf_config": json.loads((HF_CONFIGS / "bert-base-uncased.json").read_text())},
            "/hf_config",
        ),
        (
            {
                "hf_config": {"quantization_config": GPTQ_W4A16},
                "quantization_config": {**GPTQ_W4A16, "group_size": 64},
            },
            "/quantization_config",
        ),
        (
            {"hf_config": {"quantization_config": GPTQ_W4A16}, "quantization": "awq"},
            "/quantization",
        ),
    ],
    ids=["both", "neither", "model-type", "encoder", "two-configs", "contradicted"],
)
def test_a_bad_hf_config_request_is_a_422_naming_the_field(
    client: ApiClient, db_url: str, body: dict[str, Any], pointer: str
) -> None:
    if "hf_config" in body and "model_type" not in body["hf_config"]:
        body = {**body, "hf_config": _llama_3_8b_config(**body["hf_config"])}
    before = table_counts(db_url)
    response = client.post(URL, json={"hardware": H100, **body})
    problem = assert_problem(response, 422)
    pointers = [e.get("pointer") for e in problem.get("errors", [])] + [problem.get("pointer")]
    assert pointer in pointers, problem
    assert table_counts(db_url) == before


# A tiny Llama (tests/domain/test_profile_forward.py derives its graph peak by hand).
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5,
}


def test_the_profile_peak_comes_from_the_graph(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    response = client.post(
        URL,
        json={
            "hf_config": TINY_LLAMA,
            "hardware": H100,
            "max_num_batched_tokens": 512,
            "max_num_seqs": 4,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    forward = body["profile_forward"]
    assert forward["source"] == "graph"
    assert (forward["tokens"], forward["tensor_parallel_size"]) == (512, 1)
    # 4,096 B input ids + 3,145,728 B live activations + 12 MiB gated-MLP transients + the
    # 32 MiB cuBLAS workspace, per rank (hand-derived in tests/domain/test_profile_forward.py)
    assert forward["graph_peak_bytes"] == 49_287_168
    assert forward["graph_peak_at"] == "during the forward of 'layers.0.mlp'"
    assert forward["attention"] == "flash"
    assert forward["graph_peak_parts"]["transient"] == 12 * 2**20
    assert forward["factor"] == 1.2
    assert forward["forward_peak_bytes"] == 59_144_602  # ceil(1.2 x 49,287,168)
    assert forward["sampler_peak_bytes"] < forward["forward_peak_bytes"]
    assert "fallback_reason" not in forward
    # one stage, the last: max(forward, sampler) is the forward
    assert body["stages"][0]["profile_peak_bytes"] == body["profile_peak_bytes"] == 59_144_602
    assert any(
        "from the model's graph" in line and "512 tokens" in line and "49,287,168 B" in line
        for line in body["assumptions"]
    )
    assert table_counts(db_url) == before


def test_tensor_parallel_splits_the_graph_peak(client: ApiClient) -> None:
    one, four = _post(client), _post(client, tensor_parallel_size=4)
    assert four["profile_forward"]["tensor_parallel_size"] == 4
    assert four["profile_forward"]["graph_peak_bytes"] < one["profile_forward"]["graph_peak_bytes"]
    # Llama-3-8B at 8192 tokens: the sampler's 1024 x 128256 logits decide the peak either way
    assert one["profile_peak_bytes"] == one["profile_forward"]["sampler_peak_bytes"]
    # pipeline: the first stage's peak is the forward alone
    first, _ = _post(client, pipeline_parallel_size=2)["stages"]
    assert first["profile_peak_bytes"] == one["profile_forward"]["forward_peak_bytes"]
