"""A pre-quantized checkpoint imported from its config.json: stored with its
quantization_config, priced as stored by the memory estimate, and served by the engine without
repeating the config."""

from typing import Any

import pytest

from tests.api.helpers import assert_problem
from tests.domain.test_checkpoint_weights import BNB_NF4, FP8, GPTQ, SMALL_LLAMA
from tests.support import ApiClient, table_counts

IMPORT = "/v1/models/import/hf-config"
ESTIMATE = "/v1/estimates/memory"
# the golden figures of tests/domain/test_checkpoint_weights.py
GPTQ_WEIGHTS = 1_655_808
FP8_WEIGHTS = 2_206_496


def _import(client: ApiClient, slug: str, quantization: dict[str, Any], dtype: str) -> Any:
    config = {**SMALL_LLAMA, "torch_dtype": dtype, "quantization_config": quantization}
    response = client.post(IMPORT, json={"slug": slug, "config": config})
    assert response.status_code == 201, response.text
    return response.json()["model"]


def _pointers(problem: dict[str, Any]) -> list[Any]:
    return [e.get("pointer") for e in problem.get("errors", [])] + [problem.get("pointer")]


def _weights(body: dict[str, Any]) -> int:
    (line,) = [line for line in body["breakdown"] if line["key"] == "weights"]
    return int(line["bytes"])


def test_import_keeps_the_checkpoint_and_the_estimate_prices_it_as_stored(
    client: ApiClient,
) -> None:
    model = _import(client, "small-gptq", GPTQ, "float16")
    assert model["quantization_config"] == GPTQ
    assert model["torch_dtype"] == "float16"
    assert client.get("/v1/models/small-gptq").json()["quantization_config"] == GPTQ
    response = client.post(
        ESTIMATE, json={"model": "small-gptq", "mode": "inference", "batch_size": 1}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["precision"] == "fp16"  # the checkpoint's torch_dtype
    assert _weights(body) == GPTQ_WEIGHTS
    (default,) = [d for d in body["defaults_used"] if d["option"] == "precision"]
    assert "torch_dtype float16" in default["reason"]
    assert any("gptq checkpoint" in a and "as stored" in a for a in body["assumptions"])
    # The same graph without its quantization_config prices every weight at 2 B.
    plain = client.post(IMPORT, json={"slug": "small-fp16", "config": SMALL_LLAMA})
    assert plain.status_code == 201, plain.text
    unquantized = client.post(
        ESTIMATE,
        json={"model": "small-fp16", "mode": "inference", "batch_size": 1, "precision": "fp16"},
    ).json()
    assert _weights(unquantized) == (1_179_648 + 513_280) * 2

    fp8 = _import(client, "small-fp8", FP8, "bfloat16")
    assert fp8["torch_dtype"] == "bfloat16"
    answer = client.post(
        ESTIMATE, json={"model": "small-fp8", "mode": "inference", "batch_size": 1}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["precision"] == "bf16"
    assert _weights(answer.json()) == FP8_WEIGHTS


def test_put_round_trips_the_quantization_config(client: ApiClient) -> None:
    model = _import(client, "small-gptq", GPTQ, "float16")
    keys = ("name", "family", "description", "inputs", "layers", "default_bindings",
            "quantization_config", "torch_dtype")  # fmt: skip
    fields = {k: model[k] for k in keys}
    replaced = client.put("/v1/models/small-gptq", json=fields, headers={"If-Match": '"1"'})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["quantization_config"] == GPTQ
    bad = {**fields, "quantization_config": {**GPTQ, "bits": 5}}
    problem = assert_problem(
        client.put("/v1/models/small-gptq", json=bad, headers={"If-Match": '"2"'}), 422
    )
    assert "/quantization_config/bits" in _pointers(problem), problem
    assert client.get("/v1/models/small-gptq").json()["version"] == 2


@pytest.mark.parametrize(
    ("slug", "body", "pointer"),
    [
        ("small-fp8", {"precision": "int4"}, "/precision"),  # int4 weights of an fp8 checkpoint
        ("small-gptq", {"mode": "training", "precision": "fp32"}, "/precision"),
        ("small-gptq", {"mode": "training", "precision": "fp16"}, "/mode"),
    ],
)
def test_a_precision_the_checkpoint_contradicts_is_a_422(
    client: ApiClient, db_url: str, slug: str, body: dict[str, Any], pointer: str
) -> None:
    _import(client, "small-gptq", GPTQ, "float16")
    _import(client, "small-fp8", FP8, "bfloat16")
    before = table_counts(db_url)
    response = client.post(
        ESTIMATE, json={"model": slug, "mode": "inference", "batch_size": 1, **body}
    )
    problem = assert_problem(response, 422)
    assert pointer in _pointers(problem), problem
    # a stored workload with that precision is refused too, and nothing is written
    workload = {"slug": "w", "name": "w", "model": slug, "mode": "inference", "batch_size": 1,
                "precision": "fp16", **body}  # fmt: skip
    assert_problem(client.post("/v1/workloads", json=workload), 422)
    assert table_counts(db_url) == before


def test_an_import_with_a_quantization_config_vllm_refuses_is_a_422(
    client: ApiClient, db_url: str
) -> None:
    before = table_counts(db_url)
    config = {**SMALL_LLAMA, "quantization_config": {**GPTQ, "bits": 5}}
    problem = assert_problem(client.post(IMPORT, json={"slug": "bad", "config": config}), 422)
    assert "/config/quantization_config/bits" in _pointers(problem), problem
    assert table_counts(db_url) == before


def test_a_stored_workload_prices_the_checkpoint(client: ApiClient) -> None:
    _import(client, "small-gptq", GPTQ, "float16")
    workload = {"slug": "gptq-serving", "name": "GPTQ serving", "model": "small-gptq",
                "mode": "inference", "batch_size": 1, "precision": "fp16",
                "hardware": "nvidia-h100-sxm"}  # fmt: skip
    created = client.post("/v1/workloads", json=workload)
    assert created.status_code == 201, created.text
    memory = client.get("/v1/workloads/gptq-serving/memory")
    assert memory.status_code == 200, memory.text
    assert _weights(memory.json()) == GPTQ_WEIGHTS


def test_the_engine_reads_a_stored_checkpoint(client: ApiClient) -> None:
    llama = dict(SMALL_LLAMA)
    config = {**llama, "torch_dtype": "float16", "quantization_config": GPTQ}
    stored = client.post(IMPORT, json={"slug": "small-gptq", "config": config})
    assert stored.status_code == 201, stored.text
    engine = {"hardware": "nvidia-h100-sxm", "max_model_len": 512}
    by_slug = client.post("/v1/engines/vllm/memory", json={"model": "small-gptq", **engine})
    assert by_slug.status_code == 200, by_slug.text
    by_config = client.post("/v1/engines/vllm/memory", json={"hf_config": config, **engine})
    assert by_config.status_code == 200, by_config.text
    a, b = by_slug.json(), by_config.json()
    assert a["quantization"]["method"] == b["quantization"]["method"] == "gptq_marlin"
    assert a["weights_bytes"] == b["weights_bytes"]
    assert a["options"]["dtype"] == b["options"]["dtype"] == "float16"
    # a different config beside the stored one is refused
    other = client.post(
        "/v1/engines/vllm/memory",
        json={"model": "small-gptq", **engine, "quantization_config": {**GPTQ, "group_size": 64}},
    )
    assert "/quantization_config" in _pointers(assert_problem(other, 422))


def test_a_recommendation_prices_the_checkpoint_and_leaves_out_what_it_contradicts(
    client: ApiClient,
) -> None:
    _import(client, "small-gptq", GPTQ, "float16")
    plain = client.post(IMPORT, json={"slug": "small-fp16", "config": SMALL_LLAMA})
    assert plain.status_code == 201, plain.text
    body = {"devices": ["nvidia-a10"], "batch_sizes": [1], "prompt_tokens": 64,
            "generated_tokens": 8, "precisions": ["fp32", "fp16"]}  # fmt: skip
    response = client.post("/v1/recommendations/inference", json={"model": "small-gptq", **body})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert {c["precision"] for c in answer["candidates"]} == {"fp16"}
    (excluded,) = [e for e in answer["excluded"] if e["precision"] == "fp32"]
    assert "pre-quantized gptq checkpoint" in excluded["reason"]
    unquantized = client.post(
        "/v1/recommendations/inference", json={"model": "small-fp16", **body}
    ).json()
    (fp16,) = [c for c in unquantized["candidates"] if c["precision"] == "fp16"]
    (gptq,) = answer["candidates"]
    # the requirement (peak + the default safety margin) shrinks with the stored weights:
    # 3,385,856 B of fp16 weights against 1,655,808 B as the checkpoint stores them
    assert gptq["memory_required_bytes"] < fp16["memory_required_bytes"] - 1_600_000
    only_fp32 = client.post(
        "/v1/recommendations/inference",
        json={"model": "small-gptq", **body, "precisions": ["fp32"]},
    )
    assert "/precisions" in _pointers(assert_problem(only_fp32, 422))


def test_a_workload_engine_reads_the_stored_checkpoint(client: ApiClient) -> None:
    _import(client, "small-gptq", GPTQ, "float16")
    engine = {"hardware": "nvidia-h100-sxm", "max_model_len": 512}
    endpoint = client.post("/v1/engines/vllm/memory", json={"model": "small-gptq", **engine})
    assert endpoint.status_code == 200, endpoint.text
    workload = {"model": "small-gptq", "mode": "inference", "batch_size": 1,
                "hardware": "nvidia-h100-sxm",
                "engine": {"name": "vllm", "max_model_len": 512}}  # fmt: skip
    response = client.post(ESTIMATE, json=workload)
    assert response.status_code == 200, response.text
    fit = response.json()["fit"]["engine"]
    # the workload's engine runs the stored GPTQ config (no quantization_config repeated)
    assert fit["weights_bytes"] == endpoint.json()["weights_bytes"]
    contradicted = {**workload, "engine": {"name": "vllm", "quantization": "awq"}}
    problem = assert_problem(client.post(ESTIMATE, json=contradicted), 422)
    assert "/engine/quantization" in _pointers(problem)


def test_a_saved_bitsandbytes_checkpoint_is_priced_and_takes_qlora_only(client: ApiClient) -> None:
    _import(client, "small-nf4", BNB_NF4, "bfloat16")
    answer = client.post(
        ESTIMATE, json={"model": "small-nf4", "mode": "inference", "batch_size": 1}
    )
    assert answer.status_code == 200, answer.text
    assert _weights(answer.json()) == 1_650_392  # tests/domain/test_checkpoint_weights.py
    training = {"model": "small-nf4", "mode": "training", "batch_size": 1, "precision": "bf16"}
    qlora = {"r": 8, "target_modules": ["q_proj", "v_proj"],
             "qlora": {"bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                       "bnb_4bit_compute_dtype": "bf16"}}  # fmt: skip
    adapters = client.post(ESTIMATE, json={**training, "lora": qlora})
    assert adapters.status_code == 200, adapters.text
    assert "Linear4bit" in next(
        line["formula"] for line in adapters.json()["breakdown"] if line["key"] == "weights"
    )
    full = client.post(ESTIMATE, json=training)
    assert "/mode" in _pointers(assert_problem(full, 422))
    # vLLM's bitsandbytes loader is not modelled by the engine: the stored config is refused
    engine = client.post(
        "/v1/engines/vllm/memory", json={"model": "small-nf4", "hardware": "nvidia-h100-sxm"}
    )
    assert "/quantization_config/quant_method" in _pointers(assert_problem(engine, 422))
