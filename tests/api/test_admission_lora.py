"""A training pod whose inline annotations carry a LoRA / QLoRA workload
(``capacity-planner.io/lora``: the workload's lora object as JSON) is judged as that
fine-tune, not as a full one; a malformed lora annotation is refused, naming it."""

from __future__ import annotations

import json
from typing import Any

from tests.api.test_admission import _answer, _container, review
from tests.support import ApiClient

NOTES = {
    "capacity-planner.io/model": "llama-2-7b",
    "capacity-planner.io/mode": "training",
    "capacity-planner.io/batch-size": "1",
    "capacity-planner.io/precision": "amp_bf16",
    "capacity-planner.io/sequence-length": "512",
}
QLORA = {
    "r": 16,
    "target_modules": ["q_proj", "v_proj"],
    "qlora": {
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bf16",
    },
}


def _pod(notes: dict[str, str]) -> dict[str, Any]:
    pod = review(_container("trainer", {"nvidia.com/gpu": "1"}), annotations=notes)
    pod["request"]["object"]["spec"]["nodeSelector"] = {"capacity-planner.io/gpu": "nvidia-l4"}
    return pod


def test_a_qlora_pod_fits_an_l4_where_the_full_fine_tune_does_not(client: ApiClient) -> None:
    # the full fine-tune: at least 16 B per parameter x 6.7e9
    assert _answer(client, _pod(NOTES))["allowed"] is False
    qlora = {**NOTES, "capacity-planner.io/lora": json.dumps(QLORA)}
    answer = _answer(client, _pod(qlora))
    assert answer["allowed"] is True, answer  # a 4.4 GB 4-bit base on a 24 GB L4
    lora = {
        **NOTES,
        "capacity-planner.io/lora": json.dumps({k: QLORA[k] for k in ("r", "target_modules")}),
    }
    assert _answer(client, _pod(lora))["allowed"] is False  # amp_bf16 keeps an fp32 base: 27 GB


def test_a_malformed_lora_annotation_is_refused(client: ApiClient) -> None:
    for value in ("{r: 16", json.dumps({**QLORA, "r": 0})):
        answer = _answer(client, _pod({**NOTES, "capacity-planner.io/lora": value}))
        assert answer["allowed"] is False
        assert "lora" in answer["status"]["message"]
