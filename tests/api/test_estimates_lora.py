"""A LoRA training estimate through the API: trainable parameters as PEFT counts them, the
adapters' lines, and LoRA configurations that do not apply (422 naming the field)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.config import PROJECT_ROOT
from tests.api.helpers import assert_problem
from tests.support import ApiClient, table_counts

BODY: dict[str, Any] = {
    "model": "llama-2-7b",
    "mode": "training",
    "batch_size": 1,
    "sequence_length": 512,
    "precision": "mixed_bf16",
    "runtime": "pytorch_cpu",
}


def test_lora_training_estimate_of_llama_2_7b(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    lora = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    response = client.post("/v1/estimates/memory", json={**BODY, "lora": lora})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["params"] == 6_738_415_616
    assert body["trainable_params"] == 4_194_304  # 32 x 2 x 8 x (4096 + 4096)
    lines = {line["key"]: line for line in body["breakdown"]}
    assert lines["weights"]["bytes"] == 6_738_415_616 * 2
    assert lines["adapter_weights"]["bytes"] == 4_194_304 * 4
    assert lines["gradients"]["bytes"] == 0  # the loss's backward: none yet (set_to_none)
    assert lines["optimizer_state"]["bytes"] == 4_194_304 * 8
    assert "master_weights" not in lines
    assert lines["adapter_activations"]["bytes"] == 64 * (512 * 4096 * 4 + 512 * 8 * 4)
    assert "lora_A" in lines["adapter_activations"]["formula"]
    assert sum(line["bytes"] for line in body["breakdown"]) == body["peak_bytes"]
    full = client.post("/v1/estimates/memory", json=BODY)
    assert full.status_code == 200, full.text
    assert full.json()["trainable_params"] == 6_738_415_616
    assert body["peak_bytes"] < full.json()["peak_bytes"]
    assert table_counts(db_url) == before  # estimates store nothing


def test_lora_all_linear(client: ApiClient) -> None:
    lora = {"r": 16, "target_kind": "all-linear"}
    response = client.post("/v1/estimates/memory", json={**BODY, "lora": lora})
    assert response.status_code == 200, response.text
    assert response.json()["trainable_params"] == 39_976_960


@pytest.mark.parametrize(
    ("lora", "mode", "pointer", "fragment"),
    [
        ({"target_modules": ["query_key_value"]}, "training", "/lora/target_modules", "match"),
        ({"r": 4097, "target_modules": ["q_proj"]}, "training", "/lora/r", "exceeds"),
        ({"target_modules": ["q_proj"]}, "inference", "/lora", "training"),
        ({"target_regex": "(q_proj"}, "training", "/lora/target_regex", "regular expression"),
        ({"target_kind": "mlp", "r": 0}, "training", "/lora/r", "greater"),
        (
            {"target_modules": ["q_proj"], "target_kind": "mlp"},
            "training",
            "/lora/target_modules",
            "exactly one",
        ),
        (
            {"target_modules": ["q_proj"], "modules_to_save": ["score"]},
            "training",
            "/lora/modules_to_save",
            "score",
        ),
    ],
)
def test_bad_lora_is_422_naming_the_field(
    client: ApiClient, db_url: str, lora: dict[str, Any], mode: str, pointer: str, fragment: str
) -> None:
    before = table_counts(db_url)
    response = client.post("/v1/estimates/memory", json={**BODY, "mode": mode, "lora": lora})
    body = assert_problem(response, 422)
    assert fragment in body["detail"]
    assert pointer in [error["pointer"] for error in body["errors"]]
    assert table_counts(db_url) == before


def test_deepseek_routed_experts_through_the_api(client: ApiClient, db_url: str) -> None:
    """peft 0.21.0 adapts DeepSeek's routed experts (fused parameters) for gate/up/down; what
    its ParamWrapper refuses is a 422 naming the field, nothing written."""
    config = json.loads(
        (PROJECT_ROOT / "tests/fixtures/hf_configs/deepseek-v2-lite-chat.json").read_text()
    )
    created = client.post("/v1/models/import/hf-config", json={"slug": "dsv2", "config": config})
    assert created.status_code == 201, created.text
    body = {**BODY, "model": "dsv2", "sequence_length": 64, "precision": "bf16"}
    moe = ["gate_proj", "up_proj", "down_proj"]
    response = client.post("/v1/estimates/memory", json={**body, "lora": {"target_modules": moe}})
    assert response.status_code == 200, response.text
    assert response.json()["trainable_params"] == 175_505_408
    before = table_counts(db_url)
    for lora, pointer, fragment in (
        ({"target_modules": ["gate_proj", "down_proj"]}, "/lora/target_modules", "up_proj"),
        ({"target_modules": moe, "dropout": 0.1}, "/lora/dropout", "lora_dropout"),
        ({"target_modules": moe, "use_dora": True}, "/lora/use_dora", "use_dora"),
    ):
        response = client.post("/v1/estimates/memory", json={**body, "lora": lora})
        problem = assert_problem(response, 422)
        assert fragment in problem["detail"]
        assert pointer in [error["pointer"] for error in problem["errors"]]
    assert table_counts(db_url) == before
