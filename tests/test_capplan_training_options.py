"""capplan's training-option flags (issue 32): each reaches the workload body under the API's
name, none is sent when not given, and an estimate with them through the CLI against the real
app is the API's."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient

from app.client import cli_requests
from app.schemas.estimates import WorkloadInput
from tests.test_capplan import http, recorded, run  # noqa: F401 - the fixture

FLAGS = ("--mode", "training", "--optimizer-in-backward", "--loss-chunks", "8",
         "--tokens-per-batch", "4096", "--keep-gradients", "--activation-offload",
         "--zero", "3", "--dp", "2", "--cpu-offload", "--compile")  # fmt: skip


def test_every_training_option_flag_reaches_the_body() -> None:
    _, bodies = recorded("estimate", "llama-2-7b", *FLAGS)
    body = bodies["/v1/estimates/memory"]
    assert {
        key: body[key]
        for key in ("optimizer_in_backward", "loss_chunks", "tokens_per_batch",
                    "keep_gradients", "activation_offload")
    } == {"optimizer_in_backward": True, "loss_chunks": 8, "tokens_per_batch": 4096,
          "keep_gradients": True, "activation_offload": True}  # fmt: skip
    assert body["parallelism"] == {"data": 2, "zero_stage": 3, "cpu_offload": True}
    assert body["compile"] is True
    _, bodies = recorded("estimate", "gpt-2", "--mode", "training")
    plain = bodies["/v1/estimates/memory"]
    for key in ("optimizer_in_backward", "loss_chunks", "tokens_per_batch", "keep_gradients",
                "activation_offload", "parallelism", "compile"):  # fmt: skip
        assert key not in plain


def test_a_training_options_estimate_through_the_cli(http: TestClient) -> None:  # noqa: F811
    argv = ("estimate", "gpt-2", "--mode", "training", "--precision", "amp_bf16", "--seq", "256",
            "--batch", "2", "--runtime", "pytorch_cuda", "--json")  # fmt: skip
    code, out, err = run(http, *argv, "--optimizer-in-backward", "--loss-chunks", "8")
    assert code == 0, err
    tuned = json.loads(out)
    direct = http.post(
        "/v1/estimates/memory",
        json={"model": "gpt-2", "mode": "training", "precision": "amp_bf16",
              "sequence_length": 256, "batch_size": 2, "runtime": "pytorch_cuda",
              "optimizer_in_backward": True, "loss_chunks": 8},
    )  # fmt: skip
    assert direct.status_code == 200, direct.text
    assert tuned["peak_bytes"] == direct.json()["peak_bytes"]
    code, out, err = run(http, *argv)
    assert code == 0, err
    assert tuned["peak_bytes"] != json.loads(out)["peak_bytes"]  # the options are applied


def test_the_integer_bounds_are_the_api_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    """--loss-chunks and --tokens-per-batch are checked before sending, against the schema's
    bounds: one past the largest is a usage error (exit 2) naming the range."""
    bounds = {}
    for name in ("loss_chunks", "tokens_per_batch"):
        schema = WorkloadInput.model_json_schema()["properties"][name]["anyOf"][0]
        bounds[name] = (schema["minimum"], schema["maximum"])
    assert bounds == {
        "loss_chunks": (1, cli_requests.MAX_LOSS_CHUNKS),
        "tokens_per_batch": (1, cli_requests.MAX_TOKENS),
    }
    transport = httpx.MockTransport(lambda r: httpx.Response(500))
    for flag, high in (("--loss-chunks", 65_536), ("--tokens-per-batch", 16_777_216)):
        with httpx.Client(base_url="http://planner", transport=transport) as client:
            code, _, err = run(
                client, "estimate", "gpt-2", "--mode", "training", flag, str(high + 1)
            )
        assert code == 2
        assert f"[1, {high}]" in err + capsys.readouterr().err
