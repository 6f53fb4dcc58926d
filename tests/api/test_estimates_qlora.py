"""QLoRA and DoRA training estimates through the API: the 4-bit base's weights, the
dequantization transient, DoRA's trainable magnitude, the checkpointing default of
prepare_model_for_kbit_training, and a QLoRA configuration that contradicts the precision or
the GPU (422 naming the field, nothing written)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.helpers import assert_problem
from tests.api.test_workloads import workload
from tests.support import ApiClient, table_counts

BODY: dict[str, Any] = {
    "model": "llama-2-7b",
    "mode": "training",
    "batch_size": 1,
    "sequence_length": 512,
    "precision": "amp_bf16",
    "runtime": "pytorch_cuda",
}
QLORA = {
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bf16",
}
LORA = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "v_proj"]}


def test_qlora_llama_2_7b(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    response = client.post("/v1/estimates/memory", json={**BODY, "lora": {**LORA, "qlora": QLORA}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["trainable_params"] == 32 * 2 * 16 * 8192 == 8_388_608
    lines = {line["key"]: line for line in body["breakdown"]}
    # 224 Linear4bit (nf4, double quant) + 262,410,240 unquantized params in fp32
    assert lines["weights"]["bytes"] == 4_390_656_896
    assert "Linear4bit" in lines["weights"]["formula"]
    # the dequantized gate_proj (11008 x 4096 x 2 B) exists while a layer runs; the peak is the
    # loss's backward, where none does
    assert "adapter_transient" not in lines
    assert sum(line["bytes"] for line in body["breakdown"]) == body["peak_bytes"]
    used = {d["option"]: d for d in body["defaults_used"]}
    assert used["checkpointing"]["value"] == "full"
    assert "prepare_model_for_kbit_training" in used["checkpointing"]["reason"]
    lora = client.post("/v1/estimates/memory", json={**BODY, "lora": LORA})
    assert lora.status_code == 200, lora.text
    assert body["peak_bytes"] < lora.json()["peak_bytes"]
    assert table_counts(db_url) == before


def test_dora_adds_the_magnitude(client: ApiClient) -> None:
    response = client.post(
        "/v1/estimates/memory", json={**BODY, "lora": {**LORA, "use_dora": True}}
    )
    assert response.status_code == 200, response.text
    assert response.json()["trainable_params"] == 8_388_608 + 32 * 2 * 4096


def test_gpt2_c_attn(client: ApiClient) -> None:
    body = {**BODY, "model": "gpt-2", "sequence_length": 128}
    response = client.post(
        "/v1/estimates/memory", json={**body, "lora": {"r": 8, "target_modules": ["c_attn"]}}
    )
    assert response.status_code == 200, response.text
    assert response.json()["trainable_params"] == 12 * 8 * (768 + 2304)


@pytest.mark.parametrize(
    ("extra", "lora", "pointer", "fragment"),
    [
        ({"precision": "int4"}, {**LORA, "qlora": QLORA}, "/precision", "4 bits"),
        (
            {"precision": "amp_fp16"},
            {**LORA, "qlora": QLORA},
            "/lora/qlora/bnb_4bit_compute_dtype",
            "contradicts",
        ),
        (
            {"precision": "amp_fp16", "hardware": "nvidia-t4"},
            {**LORA, "qlora": {**QLORA, "bnb_4bit_compute_dtype": "bf16"}},
            "/lora/qlora/bnb_4bit_compute_dtype",
            "8.0",
        ),
        (
            {"parallelism": {"tensor": 2}},
            {**LORA, "qlora": QLORA},
            "/parallelism",
            "unsharded",
        ),
        (
            {},
            {**LORA, "qlora": {**QLORA, "llm_int8_skip_modules": ["score"]}},
            "/lora/qlora/llm_int8_skip_modules",
            "score",
        ),
        ({}, {**LORA, "qlora": {**QLORA, "bnb_4bit_quant_type": "int4"}}, "/lora/qlora", "nf4"),
        ({"model": "gpt-2"}, LORA, "/lora/target_modules", "c_attn"),
        ({}, {"r": 4097, "target_modules": ["q_proj"], "use_dora": True}, "/lora/r", "exceeds"),
    ],
)
def test_bad_qlora_is_422_naming_the_field(
    client: ApiClient,
    db_url: str,
    extra: dict[str, Any],
    lora: dict[str, Any],
    pointer: str,
    fragment: str,
) -> None:
    before = table_counts(db_url)
    response = client.post("/v1/estimates/memory", json={**BODY, **extra, "lora": lora})
    body = assert_problem(response, 422)
    pointers = [error["pointer"] for error in body["errors"]]
    assert any(p.startswith(pointer) for p in pointers), pointers
    assert fragment in body["detail"] or any(
        fragment in e.get("detail", "") for e in body["errors"]
    )
    assert table_counts(db_url) == before


def test_merged_and_unmerged_adapters_at_inference(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    serve = {**BODY, "mode": "inference", "precision": "bf16"}
    base = client.post("/v1/estimates/memory", json=serve)
    merged = client.post("/v1/estimates/memory", json={**serve, "lora": {**LORA, "merged": True}})
    beside = client.post("/v1/estimates/memory", json={**serve, "lora": {**LORA, "merged": False}})
    for response in (base, merged, beside):
        assert response.status_code == 200, response.text
    assert merged.json()["peak_bytes"] == base.json()["peak_bytes"]
    lines = {line["key"]: line["bytes"] for line in beside.json()["breakdown"]}
    assert lines["adapter_weights"] == 8_388_608 * 4
    assert beside.json()["peak_bytes"] > base.json()["peak_bytes"]
    assert beside.json()["trainable_params"] == 0
    assert table_counts(db_url) == before


@pytest.mark.parametrize(
    ("mode", "lora", "pointer"),
    [
        ("inference", LORA, "/lora"),
        ("training", {**LORA, "merged": True}, "/lora/merged"),
    ],
)
def test_merged_is_given_exactly_at_inference(
    client: ApiClient, db_url: str, mode: str, lora: dict[str, Any], pointer: str
) -> None:
    before = table_counts(db_url)
    response = client.post("/v1/estimates/memory", json={**BODY, "mode": mode, "lora": lora})
    body = assert_problem(response, 422)
    assert pointer in [error["pointer"] for error in body["errors"]]
    assert table_counts(db_url) == before


def test_a_stored_qlora_workload_is_estimated_as_the_request_would_be(
    client: ApiClient,
) -> None:
    options = {"lora": {**LORA, "qlora": QLORA}}
    body = workload(
        slug="llama-qlora",
        model="llama-2-7b",
        mode="training",
        batch_size=1,
        sequence_length=512,
        precision="amp_bf16",
        options=options,
    )
    created = client.post("/v1/workloads", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["options"]["lora"]["qlora"]["bnb_4bit_quant_type"] == "nf4"
    stored = client.get("/v1/workloads/llama-qlora/memory")
    assert stored.status_code == 200, stored.text
    direct = client.post(
        "/v1/estimates/memory",
        json={**BODY, "hardware": "nvidia-a100-80gb-sxm", "lora": {**LORA, "qlora": QLORA}},
    )
    assert direct.status_code == 200, direct.text
    assert stored.json()["peak_bytes"] == direct.json()["peak_bytes"]
    lines = {line["key"]: line["bytes"] for line in stored.json()["breakdown"]}
    assert lines["weights"] == 4_390_656_896


def test_a_stored_qlora_with_a_quantized_precision_is_refused(
    client: ApiClient, db_url: str
) -> None:
    before = table_counts(db_url)
    body = workload(
        slug="bad-qlora",
        model="llama-2-7b",
        mode="training",
        batch_size=1,
        precision="int4",
        options={"lora": {**LORA, "qlora": QLORA}},
    )
    problem = assert_problem(client.post("/v1/workloads", json=body), 422)
    assert any(e["pointer"].endswith("/precision") for e in problem["errors"]), problem
    assert table_counts(db_url) == before
