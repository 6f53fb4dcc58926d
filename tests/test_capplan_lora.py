"""capplan's LoRA / QLoRA flags: each reaches the workload's ``lora`` object, the choices are
the API's enumerations, and a QLoRA flag without --qlora is a usage error; a QLoRA estimate
through the CLI against the real app."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient

from app.client import cli_requests
from app.domain.peft import LoraBias, LoraKind
from app.domain.peft.qlora import QuantType
from app.schemas.estimates import Bnb4bitComputeDtype
from tests.test_capplan import http, recorded, run  # noqa: F401 - the fixture

LORA_FLAGS = ("--mode", "training", "--lora-r", "16", "--lora-alpha", "32", "--lora-target",
              "q_proj", "--lora-target", "v_proj", "--lora-dropout", "0.05", "--lora-bias",
              "lora_only", "--lora-save", "lm_head", "--dora", "--qlora", "nf4",
              "--double-quant", "--bnb-compute-dtype", "bf16")  # fmt: skip


def test_every_lora_flag_reaches_the_body() -> None:
    _, bodies = recorded("estimate", "llama-2-7b", *LORA_FLAGS)
    assert bodies["/v1/estimates/memory"]["lora"] == {
        "r": 16, "alpha": 32, "target_modules": ["q_proj", "v_proj"], "dropout": 0.05,
        "bias": "lora_only", "modules_to_save": ["lm_head"], "use_dora": True,
        "qlora": {"bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                  "bnb_4bit_compute_dtype": "bf16"},
    }  # fmt: skip
    _, bodies = recorded("estimate", "gpt-2", "--mode", "training", "--lora-kind", "all-linear")
    assert bodies["/v1/estimates/memory"]["lora"] == {"target_kind": "all-linear"}
    _, bodies = recorded("estimate", "gpt-2", "--mode", "training", "--lora-regex", r".*\.c_attn")
    assert bodies["/v1/estimates/memory"]["lora"] == {"target_regex": r".*\.c_attn"}
    _, bodies = recorded("estimate", "gpt-2", "--mode", "training")
    assert "lora" not in bodies["/v1/estimates/memory"]


def test_the_lora_choices_are_the_api_enumerations() -> None:
    assert cli_requests.LORA_KINDS == tuple(k.value for k in LoraKind)
    assert cli_requests.LORA_BIASES == tuple(b.value for b in LoraBias)
    assert cli_requests.QUANT_TYPES == tuple(q.value for q in QuantType)
    assert cli_requests.BNB_COMPUTE_DTYPES == tuple(d.value for d in Bnb4bitComputeDtype)


def test_qlora_options_without_qlora_are_a_usage_error() -> None:
    with httpx.Client(
        base_url="http://planner", transport=httpx.MockTransport(lambda r: httpx.Response(500))
    ) as client:
        code, _, err = run(client, "estimate", "llama-2-7b", "--mode", "training", "--double-quant")
    assert code == 2
    assert "--qlora" in err


def test_a_qlora_estimate_through_the_cli(http: TestClient) -> None:  # noqa: F811
    code, out, err = run(
        http, "estimate", "llama-2-7b", "--mode", "training", "--precision", "amp_bf16",
        "--seq", "512", "--runtime", "pytorch_cuda", "--lora-r", "16", "--lora-target", "q_proj",
        "--lora-target", "v_proj", "--qlora", "nf4", "--double-quant", "--bnb-compute-dtype",
        "bf16", "--json",
    )  # fmt: skip
    assert code == 0, err
    body = json.loads(out)
    assert body["trainable_params"] == 8_388_608
    lines = {line["key"]: line["bytes"] for line in body["breakdown"]}
    assert lines["weights"] == 4_390_656_896


@pytest.mark.parametrize("flag", ["--lora-kind", "--lora-bias", "--qlora", "--bnb-compute-dtype"])
def test_bad_lora_choices_are_usage_errors(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(500))
    with httpx.Client(base_url="http://planner", transport=transport) as client:
        code, _, err = run(client, "estimate", "llama-2-7b", "--mode", "training", flag, "int3")
    assert code == 2
    assert "int3" in err + capsys.readouterr().err  # argparse's own errors go to sys.stderr
