"""`capplan` as scripts use it: exit codes, options anywhere, flags that reach the request body,
--gpu matching, alternatives when nothing fits, tables, --version, a closed pipe, and the CLI
running with no server package installed."""

import argparse
import io
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.client import cli, cli_devices, cli_output, cli_requests
from app.client.cli import main
from app.client.cli_devices import resolve_gpu
from app.client.cli_recommend import recommendation_table
from app.client.transport import Json
from app.config import PROJECT_ROOT
from app.domain.hardware import DeviceKind, PriceKind
from app.domain.performance.calibration import CalibrationClass
from app.domain.performance.decoding import Batching
from app.domain.performance.pipeline import ParallelStrategy
from app.domain.performance.recommend import Objective, Scenario
from app.domain.performance.runtimes import ServingRuntime
from app.domain.precision import Precision
from app.domain.workload import (
    Attention,
    Checkpointing,
    Logits,
    Optimizer,
    OptimizerImpl,
    Runtime,
)
from app.main import create_app
from app.schemas.recommendations import CalibrationOverride, InferenceRecommendationRequest
from tests.live_server import live_server
from tests.support import SqliteDatabases, settings_for

CAPPLAN = [sys.executable, "-c", "import sys; from app.client.cli import main; sys.exit(main())"]


@pytest.fixture
def http(db_url: str) -> Iterator[TestClient]:
    app = create_app(settings_for(db_url, api_keys="key-1"))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    app.state.engine.dispose()


def run(http: httpx.Client, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), http=http, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# -- exit codes --------------------------------------------------------------------------------


def test_exit_codes_tell_the_verdict_from_errors(http: TestClient, tmp_path: Path) -> None:
    key = ("--token", "key-1")
    fits = ("estimate", "gpt-2", "--seq", "64", "--gpu", "nvidia-a100-80gb-sxm", *key)
    code, out, err = run(http, *fits)
    assert (code, err) == (cli_output.EXIT_OK, "")
    assert "fits nvidia-a100-80gb-sxm" in out
    code, out, _ = run(http, "estimate", "llama-3-8b", "--batch", "8", "--gpu", "l4", *key)
    assert code == cli_output.EXIT_VERDICT_NO == 1
    assert "does NOT fit nvidia-l4" in out
    code, out, _ = run(http, "estimate", "llama-3-8b", "--batch", "8", "--gpu", "l4", "--json")
    assert code == 1  # --json: the same verdict
    assert json.loads(out)["fit"]["fits"] is False

    code, out, _ = run(http, "fit", "gpt-2", "--gpu", "a100-80gb-sxm", "--seq", "64", *key)
    assert code == 0
    assert "smallest fit: 1g.10gb" in out
    code, out, _ = run(http, "fit", "llama-3-8b", "--gpu", "a100-40gb-sxm", "--batch", "64")
    assert code == 1
    assert "no MIG profile fits" in out

    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"gpu": "nvidia-a100-80gb-sxm", "instances": [
        {"profile": "7g.80gb", "start": 0}, {"profile": "1g.10gb", "start": 0}]}))  # fmt: skip
    code, out, _ = run(http, "mig", "validate", str(layout))
    assert (code, out.splitlines()[0]) == (1, "INVALID")
    layout.write_text(json.dumps({"gpu": "nvidia-a100-80gb-sxm",
                                  "instances": [{"profile": "7g.80gb", "start": 0}]}))  # fmt: skip
    assert run(http, "mig", "validate", str(layout))[:2] == (0, "valid\n")

    admit = ("admission", "gpt-2", "--seq", "64", "--gpu", "a100-80gb-sxm")
    code, out, _ = run(http, *admit, "--resource", "nvidia.com/mig-1g.10gb")
    assert (code, out[:7]) == (0, "ALLOWED")
    code, out, _ = run(http, "admission", "llama-3-8b", "--batch", "64", "--gpu",
                       "a100-80gb-sxm", "--resource", "nvidia.com/mig-1g.10gb")  # fmt: skip
    assert (code, out[:6]) == (1, "DENIED")

    recommend = ("recommend", "resnet-50", "--devices", "nvidia-l4", "--objective", "latency")
    assert run(http, *recommend)[0] == 0
    assert run(http, *recommend, "--slo-ms", "0.001")[0] == 1  # nothing meets 1 us

    assert run(http, "estimate")[0] == cli_output.EXIT_USAGE == 2
    assert run(http, "estimate", "gpt-2", "--gpu", "nvidia")[0] == 2  # ambiguous
    code, _, err = run(http, "estimate", "no-such-model")
    assert (code, err.startswith("error 404")) == (cli_output.EXIT_API_ERROR, True)
    assert cli_output.EXIT_API_ERROR == 3
    code, _, err = run(http, "models", "delete", "gpt-2")  # writes need the key
    assert code == 3, err
    assert err.startswith("error 40")


def test_an_unreachable_server_exits_4() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--url", "http://127.0.0.1:9", "--timeout", "5", "health"], out=out, err=err)
    assert code == cli_output.EXIT_UNREACHABLE == 4
    assert "no answer from http://127.0.0.1:9" in err.getvalue()


def test_help_documents_the_exit_codes_without_rst_markup() -> None:
    parser = cli.build_parser()
    texts = [parser.format_help()]
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    while actions:
        for sub in actions.pop().choices.values():
            texts.append(sub.format_help())
            actions += [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(texts) == 14  # capplan, 10 commands, import's 3 sources
    for text in texts:
        assert "`" not in text, text
        assert "exit codes:" in text
        for code in (0, 1, 2, 3, 4, 141):
            assert f"\n  {code} " in text
    readme = (PROJECT_ROOT / "README.md").read_text()
    for line in ("  0    ok:", "  1    the answer is no", "  2    usage", "  3    the server",
                 "  4    the server could not", "  141  the output pipe"):  # fmt: skip
        assert line in texts[0]
        assert line in readme, line


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"capplan {metadata.version('capacity-planner')}\n"


# -- options anywhere --------------------------------------------------------------------------


def test_global_options_go_before_or_after_the_subcommand(http: TestClient) -> None:
    for argv in (
        ["--json", "--token", "key-1", "estimate", "gpt-2", "--seq", "64"],
        ["estimate", "--json", "gpt-2", "--token", "key-1", "--seq", "64"],
        ["--token", "key-1", "estimate", "gpt-2", "--seq", "64", "--json"],
    ):
        code, out, err = run(http, *argv)
        assert code == 0, (argv, err)
        assert json.loads(out)["params"] == 124_439_808
    for argv in (
        ["--url", "http://127.0.0.1:9", "health"],
        ["health", "--url", "http://127.0.0.1:9"],
        ["--url", "http://ignored:1", "health", "--url", "http://127.0.0.1:9"],  # last wins
    ):
        stderr = io.StringIO()
        assert main([*argv, "--timeout", "5"], out=io.StringIO(), err=stderr) == 4
        assert "http://127.0.0.1:9" in stderr.getvalue()
    code, out, _ = run(http, "--json", "import", "hf-config",
                       str(PROJECT_ROOT / "tests/fixtures/hf_configs/gpt2.json"), "--slug", "g2",
                       "--token", "key-1")  # fmt: skip
    assert code == 0
    assert json.loads(out)["model"]["slug"] == "g2"
    # The key from the environment: CAPPLAN_TOKEN.
    os.environ["CAPPLAN_TOKEN"] = "key-1"
    try:
        assert run(http, "models", "delete", "g2")[:2] == (0, "deleted g2\n")
    finally:
        del os.environ["CAPPLAN_TOKEN"]


# -- every option reaches the request body -----------------------------------------------------

HARDWARE = [
    {"slug": "nvidia-l4", "vendor": "NVIDIA", "name": "L4", "kind": "gpu",
     "memory_bytes": 24 * 2**30, "mig": None},
    {"slug": "nvidia-l40s", "vendor": "NVIDIA", "name": "L40S", "kind": "gpu",
     "memory_bytes": 48 * 2**30, "mig": None},
    {"slug": "nvidia-h100-sxm", "vendor": "NVIDIA", "name": "H100 SXM5 80GB", "kind": "gpu",
     "memory_bytes": 80 * 2**30, "mig": {"profiles": []}},
    {"slug": "nvidia-h100-nvl", "vendor": "NVIDIA", "name": "H100 NVL 94GB", "kind": "gpu",
     "memory_bytes": 94 * 2**30, "mig": {"profiles": []}},
    {"slug": "nvidia-h100-pcie", "vendor": "NVIDIA", "name": "H100 PCIe 80GB", "kind": "gpu",
     "memory_bytes": 80 * 2**30, "mig": {"profiles": []}},
    {"slug": "nvidia-a100-80gb-sxm", "vendor": "NVIDIA", "name": "A100 80GB SXM4", "kind": "gpu",
     "memory_bytes": 80 * 2**30, "mig": {"profiles": []}},
    {"slug": "nvidia-a100-40gb-sxm", "vendor": "NVIDIA", "name": "A100 40GB SXM4", "kind": "gpu",
     "memory_bytes": 40 * 2**30, "mig": {"profiles": []}},
]  # fmt: skip


class Recorder:
    """A stand-in server that records each request body and answers with a fixed body."""

    def __init__(self) -> None:
        self.bodies: dict[str, Any] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/hardware":
            return httpx.Response(200, json={"items": HARDWARE, "total": len(HARDWARE)})
        if path.startswith("/v1/hardware/"):
            slug = path.rpartition("/")[2]
            return httpx.Response(200, json=next(h for h in HARDWARE if h["slug"] == slug))
        self.bodies[path] = json.loads(request.content)
        answers = {
            "/v1/mig/fit": {"smallest_fitting_profile": "1g.10gb"},
            "/v1/admission/check": {"allowed": True},
            "/v1/recommendations/inference": {"eligible_candidates": 1, "candidates": []},
        }
        return httpx.Response(200, json=answers.get(path, {}))


def recorded(*argv: str) -> tuple[int, dict[str, Any]]:
    recorder = Recorder()
    with httpx.Client(base_url="http://planner", transport=httpx.MockTransport(recorder)) as http:
        code, _, err = run(http, *argv, "--json")
    assert code == 0, err
    return code, recorder.bodies


WORKLOAD_FLAGS = ("--mode", "training", "--batch", "16", "--micro-batch", "4", "--precision",
                  "mixed_bf16", "--seq", "2048", "--image", "224", "--bind", "heads=32",
                  "--bind", "experts=8", "--optimizer", "adam", "--optimizer-impl", "fused",
                  "--checkpointing", "selective", "--attention", "eager", "--logits", "all",
                  "--no-kv-cache", "--fp32-grad-buffer", "--dp", "8", "--tp", "2", "--pp", "4",
                  "--zero", "3", "--grad-bucket-view")  # fmt: skip
WORKLOAD_BODY = {
    "model": "llama-3-8b", "mode": "training", "batch_size": 16, "micro_batch_size": 4,
    "precision": "mixed_bf16", "sequence_length": 2048, "image_size": 224,
    "bindings": {"heads": 32, "experts": 8}, "optimizer": "adam", "optimizer_impl": "fused",
    "checkpointing": "selective", "attention": "eager", "logits": "all", "kv_cache": False,
    "fp32_grad_buffer": True,
    "parallelism": {"data": 8, "tensor": 2, "pipeline": 4, "zero_stage": 3,
                    "gradient_as_bucket_view": True},
}  # fmt: skip


def test_every_estimate_option_reaches_the_body() -> None:
    _, bodies = recorded("estimate", "llama-3-8b", *WORKLOAD_FLAGS, "--gpu", "l4",
                         "--runtime", "pytorch_cuda", "--safety-margin", "0.1",
                         "--cuda-context", "1000", "--workspace", "2000",
                         "--fragmentation", "0.05", "--no-round-allocations",
                         "--expandable-segments", "--per-layer")  # fmt: skip
    assert bodies["/v1/estimates/memory"] == {
        **WORKLOAD_BODY, "hardware": "nvidia-l4", "runtime": "pytorch_cuda",
        "safety_margin_fraction": 0.1, "per_layer": True,
        "framework_overhead": {"cuda_context_bytes": 1000, "workspace_bytes": 2000,
                               "fragmentation_fraction": 0.05, "round_allocations": False,
                               "expandable_segments": True},
    }  # fmt: skip
    _, bodies = recorded("estimate", "gpt-2")  # nothing given: the server's defaults decide
    assert bodies["/v1/estimates/memory"] == {"model": "gpt-2", "mode": "inference",
                                              "batch_size": 1}  # fmt: skip


def test_every_fit_admission_plan_and_recommend_option_reaches_the_body(tmp_path: Path) -> None:
    _, bodies = recorded("fit", "llama-3-8b", *WORKLOAD_FLAGS, "--gpu", "h100-sxm",
                         "--profile", "3g.40gb", "--cuda-context", "1000",
                         "--safety-margin", "0.2")  # fmt: skip
    assert bodies["/v1/mig/fit"] == {
        "workload": WORKLOAD_BODY, "gpu": "nvidia-h100-sxm", "profile": "3g.40gb",
        "cuda_context_bytes": 1000, "safety_margin_fraction": 0.2,
    }  # fmt: skip
    _, bodies = recorded("admission", "llama-3-8b", *WORKLOAD_FLAGS, "--gpu", "h100-nvl",
                         "--resource", "nvidia.com/gpu", "--count", "2")  # fmt: skip
    assert bodies["/v1/admission/check"] == {
        "workload": WORKLOAD_BODY, "gpu_model": "nvidia-h100-nvl", "resource": "nvidia.com/gpu",
        "count": 2,
    }  # fmt: skip
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"gpu": "nvidia-h100-sxm", "workloads": []}))
    _, bodies = recorded("mig", "plan", str(plan), "--config-name", "mine",
                         "--cuda-context", "5", "--safety-margin", "0.01")  # fmt: skip
    assert bodies["/v1/mig/plan"] == {"gpu": "nvidia-h100-sxm", "workloads": [],
                                      "config_name": "mine", "cuda_context_bytes": 5,
                                      "safety_margin_fraction": 0.01}  # fmt: skip
    _, bodies = recorded("recommend", "bert-base", "--batch", "1", "--batch", "8",
                         "--max-batch", "64", "--precision", "int8", "--precision", "fp16",
                         "--slo-ms", "20", "--target", "500", "--devices", "nvidia-l4,x/1g.10gb",
                         "--objective", "energy", "--price", "nvidia-l4=0.8",
                         "--slo-margin", "0.2", "--price-kind", "spot", "--scenario", "server",
                         "--serving-runtime", "torch_compile", "--tensor-parallel-max", "4",
                         "--calibration", "gpu.compute_efficiency=0.5",
                         "--calibration", "gpu_hopper.compute_efficiency=0.3",
                         "--calibration", "cpu.request_overhead_us=40", "--seq", "384",
                         "--tokens-mean", "177", "--image", "32", "--bind", "heads=12",
                         "--prompt-tokens", "100", "--generated-tokens", "20", "--no-fuse",
                         "--prompt-tokens-mean", "60", "--generated-tokens-mean", "12",
                         "--batching", "continuous", "--beam-width", "4",
                         "--kv-block-tokens", "16", "--beams-copy-prompt",
                         "--parallelism", "both",
                         "--pipeline-parallel-max", "2", "--limit", "3")  # fmt: skip
    assert bodies["/v1/recommendations/inference"] == {
        "model": "bert-base", "objective": "energy", "batch_sizes": [1, 8], "max_batch_size": 64,
        "precisions": ["int8", "fp16"], "latency_slo_ms": 20.0, "throughput_target_per_s": 500.0,
        "devices": ["nvidia-l4", "x/1g.10gb"], "sequence_length": 384, "tokens_mean": 177,
        "image_size": 32, "bindings": {"heads": 12}, "prompt_tokens": 100,
        "generated_tokens": 20, "fuse_elementwise": False, "limit": 3,
        "prices_usd_per_hour": {"nvidia-l4": 0.8}, "slo_margin": 0.2, "price_kind": "spot",
        "scenario": "server", "serving_runtime": "torch_compile", "tensor_parallel_max": 4,
        "calibration": {"gpu": {"compute_efficiency": 0.5},
                        "gpu_hopper": {"compute_efficiency": 0.3},
                        "cpu": {"request_overhead_us": 40.0}},
        "prompt_tokens_mean": 60, "generated_tokens_mean": 12, "batching": "continuous",
        "beam_width": 4, "kv_block_tokens": 16, "beams_share_prompt": False,
        "parallelism": "both",
        "pipeline_parallel_max": 2,
    }  # fmt: skip


def test_the_cli_choices_are_the_api_enumerations() -> None:
    assert cli_requests.PRECISIONS == tuple(p.value for p in Precision if p.value != "none")
    assert cli_requests.OPTIMIZERS == tuple(o.value for o in Optimizer)
    assert cli_requests.OPTIMIZER_IMPLS == tuple(o.value for o in OptimizerImpl)
    assert cli_requests.CHECKPOINTING == tuple(c.value for c in Checkpointing)
    assert cli_requests.ATTENTIONS == tuple(a.value for a in Attention)
    assert cli_requests.LOGITS == tuple(lg.value for lg in Logits)
    assert cli_requests.RUNTIMES == tuple(r.value for r in Runtime)
    assert cli_requests.OBJECTIVES == tuple(o.value for o in Objective)
    assert cli_requests.PRICE_KINDS == tuple(k.value for k in PriceKind)
    assert cli_requests.SCENARIOS == tuple(k.value for k in Scenario)
    assert cli_requests.SERVING_RUNTIMES == tuple(r.value for r in ServingRuntime)
    assert cli_requests.BATCHINGS == tuple(b.value for b in Batching)
    assert cli_requests.PARALLELISMS == tuple(p.value for p in ParallelStrategy)
    assert set(cli_requests.DEVICE_KINDS) == {k.value for k in DeviceKind}
    assert cli_requests.CALIBRATION_FIELDS == tuple(CalibrationOverride.model_fields)
    assert cli_requests.CALIBRATION_CLASSES == tuple(c.value for c in CalibrationClass)


def _recommend_actions() -> dict[str, argparse.Action]:
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in commands.choices["recommend"]._actions}


def test_the_recommend_choices_and_integer_bounds_are_the_request_schemas() -> None:
    properties = InferenceRecommendationRequest.model_json_schema()["properties"]
    actions = _recommend_actions()
    for name in ("batching", "parallelism", "scenario", "serving_runtime", "price_kind"):
        assert tuple(actions[name].choices or ()) == _enum(name), name
    bounded = {dest: a.type for dest, a in actions.items() if isinstance(a.type, cli.IntIn)}
    assert set(bounded) == {"prompt_tokens", "generated_tokens", "prompt_tokens_mean",
                            "generated_tokens_mean", "beam_width", "kv_block_tokens",
                            "tensor_parallel_max", "pipeline_parallel_max"}  # fmt: skip
    for dest, bounds in bounded.items():
        schema = properties[dest]
        schema = next((s for s in schema.get("anyOf", []) if s.get("type") == "integer"), schema)
        assert (bounds.low, bounds.high) == (schema["minimum"], schema["maximum"]), dest


def _enum(name: str) -> tuple[str, ...]:
    """The values of the enum a request field refers to (``$ref`` to its definition)."""
    schema = InferenceRecommendationRequest.model_json_schema()
    ref = schema["properties"][name]["$ref"].rsplit("/", 1)[1]
    return tuple(schema["$defs"][ref]["enum"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("estimate", "gpt-2", "--bind", "heads"), "--bind 'heads': expected NAME=INTEGER"),
        (("recommend", "gpt-2", "--calibration", "gpu.speed=2"), "KIND.FIELD=VALUE"),
        (("recommend", "gpt-2", "--calibration", "gpu.compute_efficiency=x"), "not a number"),
        (("admission", "gpt-2"), "needs --resource and --gpu"),
        (("hardware", "show"), "a slug is required"),
        (("fit", "gpt-2", "--gpu", "l4", "--profile", "1g.10gb"), "nvidia-l4 has no MIG profiles"),
        (("recommend", "gpt-2", "--prompt-tokens-mean", "0"),
         "argument --prompt-tokens-mean: must be in [1, 16777216], got 0"),
        (("recommend", "gpt-2", "--prompt-tokens", "100", "--prompt-tokens-mean", "101"),
         "--prompt-tokens-mean 101 exceeds --prompt-tokens 100, the maximum"),
        (("recommend", "gpt-2", "--generated-tokens-mean", "1.5"),
         "argument --generated-tokens-mean: expected an integer in [1, 16777216], got '1.5'"),
        (("recommend", "gpt-2", "--generated-tokens", "10", "--generated-tokens-mean", "11"),
         "--generated-tokens-mean 11 exceeds --generated-tokens 10, the maximum"),
        (("recommend", "gpt-2", "--batching", "dynamic"),
         "argument --batching: invalid choice: 'dynamic' (choose from"),
        (("recommend", "gpt-2", "--beam-width", "17"),
         "argument --beam-width: must be in [1, 16], got 17"),
        (("recommend", "gpt-2", "--batching", "continuous", "--kv-block-tokens", "4097"),
         "argument --kv-block-tokens: must be in [1, 4096], got 4097"),
        (("recommend", "gpt-2", "--kv-block-tokens", "16"),
         "--kv-block-tokens sizes the paged KV cache of --batching continuous"),
        (("recommend", "gpt-2", "--beam-width", "4", "--beams-copy-prompt"),
         "--beams-copy-prompt is about the paged KV cache of --batching continuous"),
        (("recommend", "gpt-2", "--batching", "static", "--beam-width", "4",
          "--beams-copy-prompt"),
         "static batching gives every beam its own padded copy of the prompt"),
        (("recommend", "gpt-2", "--parallelism", "data"),
         "argument --parallelism: invalid choice: 'data' (choose from"),
        (("recommend", "gpt-2", "--pipeline-parallel-max", "9"),
         "argument --pipeline-parallel-max: must be in [1, 8], got 9"),
        (("recommend", "gpt-2", "--tensor-parallel-max", "0"),
         "argument --tensor-parallel-max: must be in [1, 8], got 0"),
    ],
)  # fmt: skip
def test_bad_flag_values_are_usage_errors(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    recorder = Recorder()
    with httpx.Client(base_url="http://planner", transport=httpx.MockTransport(recorder)) as http:
        code, _, err = run(http, *argv)
    assert (code, recorder.bodies) == (2, {})
    assert message in err + capsys.readouterr().err  # argparse's own errors go to sys.stderr


# -- --gpu -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "slug"),
    [
        ("l4", "nvidia-l4"),  # not ambiguous with L40S
        ("L4", "nvidia-l4"),
        ("l40s", "nvidia-l40s"),
        ("nvidia-l4", "nvidia-l4"),
        ("h100-sxm", "nvidia-h100-sxm"),
        ("h100-sxm-80gb", "nvidia-h100-sxm"),
        ("h100-94gb", "nvidia-h100-nvl"),
        ("H100 NVL 94GB", "nvidia-h100-nvl"),  # the exact part name
        ("a100-40gb", "nvidia-a100-40gb-sxm"),
    ],
)
def test_gpu_names_resolve_to_one_slug(query: str, slug: str) -> None:
    assert resolve_gpu(HARDWARE, query) == slug


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("h100-sxm-94gb", "the memory size does not match; candidates: nvidia-h100-sxm (80.00"),
        ("h100", "'h100' is ambiguous: nvidia-h100-sxm (80.00 GiB), nvidia-h100-nvl"),
        ("h100-80gb", "ambiguous: nvidia-h100-sxm (80.00 GiB), nvidia-h100-pcie (80.00 GiB)"),
        ("a100-80gb-pcie", "no hardware matches 'a100-80gb-pcie'"),
        ("v100", "no hardware matches 'v100'"),
    ],
)
def test_gpu_names_that_do_not_name_one_part_list_candidates(query: str, message: str) -> None:
    with pytest.raises(cli_output.UsageError) as caught:
        resolve_gpu(HARDWARE, query)
    assert message in str(caught.value)


def test_gpu_names_against_the_catalog(http: TestClient) -> None:
    code, out, err = run(http, "estimate", "gpt-2", "--seq", "64", "--gpu", "l4")
    assert code == 0, err
    assert "fits nvidia-l4" in out
    code, _, err = run(http, "estimate", "gpt-2", "--seq", "64", "--gpu", "h100-sxm-94gb")
    assert code == 2
    assert "candidates: nvidia-h100-sxm (80.00 GiB)" in err


def test_estimate_and_fit_take_the_mig_slug_profile_form(http: TestClient) -> None:
    """``--gpu slug/profile`` as recommend takes it: the slice's usable memory is the fit's."""
    code, out, err = run(http, "estimate", "gpt-2", "--seq", "64", "--gpu", "a100-80gb-sxm/1g.10gb")
    assert code == 0, err
    assert "fits nvidia-a100-80gb-sxm/1g.10gb: needs " in out
    code, out, err = run(http, "estimate", "gpt-2", "--gpu", "a100-80gb-sxm/1g.10gb", "--json")
    assert json.loads(out)["fit"]["usable_bytes"] < 10 * 2**30
    code, out, err = run(http, "fit", "gpt-2", "--seq", "64", "--gpu", "a100-80gb-sxm/2g.20gb")
    assert code == 0, err
    assert "2g.20gb: fits, headroom " in out
    # an unknown profile is the server's 404, a usage error naming the valid ones
    code, _, err = run(http, "estimate", "gpt-2", "--gpu", "a100-80gb-sxm/9g.99gb")
    assert code != 0
    code, _, err = run(http, "estimate", "gpt-2", "--gpu", "a100-80gb-sxm/1g.99gb")
    assert code != 0
    assert "has no MIG profile '1g.99gb'; valid profiles: 1g.10gb" in err
    code, _, err = run(http, "fit", "gpt-2", "--gpu", "a100-80gb-sxm/1g.10gb", "--profile",
                       "2g.20gb")  # fmt: skip
    assert code == 2
    assert "give one" in err


@pytest.mark.parametrize(
    "capability", [None, "5.2", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0"]
)
@pytest.mark.parametrize("peaks", [("fp32", "fp16"), ("fp32", "fp16", "bf16", "int8"),
                                   ("fp32", "bf16", "fp8", "fp4", "tf32")])  # fmt: skip
def test_the_cli_precision_rule_is_the_servers(capability: str | None, peaks: tuple[str]) -> None:
    from app.domain.precision import ComputeCapability, Precision, cannot_run

    assert set(cli_devices.PRECISION_NEEDS) == {p.value for p in Precision}
    item = {"compute_capability": capability, "peak_flops_per_s": dict.fromkeys(peaks, 1e12)}
    for precision in Precision:
        server = cannot_run(
            precision,
            compute_capability=None if capability is None else ComputeCapability.parse(capability),
            peak_dtypes=set(peaks),
        )
        assert cli_devices.runs_precision(item, precision.value) == (server is None), precision


def test_the_gpus_that_would_fit_run_the_precision(http: TestClient) -> None:
    """bf16 work is never sent to a V100 (no bf16: compute capability 7.0); fp16 work is."""
    # The case: 23.7 GiB peak, 24.9 GiB required, on a 24 GiB L4; a 32 GiB V100 holds it.
    argv = ("estimate", "llama-3-8b", "--batch", "8", "--seq", "4096", "--gpu", "l4")
    code, out, err = run(http, *argv, "--precision", "bf16")
    assert code == 1, err
    assert "that run bf16 (smallest first)" in out
    assert "\nnvidia-a100-40gb-" in out
    assert "nvidia-v100" not in out
    code, out, err = run(http, *argv, "--precision", "fp16")
    assert code == 1, err
    assert "\nnvidia-v100-32gb-" in out
    code, out, err = run(http, "estimate", "llama-2-7b", "--batch", "2", "--seq", "4096",
                         "--gpu", "t4", "--precision", "fp16")  # fmt: skip
    assert code == 1, err
    assert "that run fp16 (smallest first)" in out
    assert "\nnvidia-v100-32gb-" in out  # 32 GiB, fp16: offered


# -- fit: what would work ----------------------------------------------------------------------


def test_fit_shows_the_alternatives_when_nothing_fits(http: TestClient) -> None:
    argv = ("fit", "llama-3-8b", "--gpu", "a100-40gb-sxm", "--batch", "64", "--seq", "8192")
    code, out, _ = run(http, *argv, "--json")
    alternatives = json.loads(out)["alternatives"]
    code, out, err = run(http, *argv)
    assert code == 1, err
    assert "no MIG profile fits" in out
    assert "the whole nvidia-a100-40gb-sxm (40.00 GiB, MIG disabled): does NOT fit" in out
    for gpu in alternatives["larger_gpus"]:
        assert f"\n{gpu['hardware']} " in out
    assert alternatives["larger_gpus"], "the case must have a larger GPU to show"
    batch = alternatives["largest_batch_on_biggest_profile"]
    assert f"largest batch that fits 7g.40gb: {batch}\n" in out

    # A GPU without MIG: the larger GPUs by the same rule, the largest batch by the estimate.
    code, out, err = run(http, "fit", "llama-3-8b", "--gpu", "l4", "--batch", "8", "--seq", "8192")
    assert code == 1, err
    assert "does NOT fit nvidia-l4" in out
    assert "GPUs whose whole memory holds" in out
    assert "\nnvidia-l40s " in out
    batch = int(out.rsplit("largest batch that fits nvidia-l4: ", 1)[1])
    assert 1 <= batch < 8
    for size, verdict in ((batch, 0), (batch + 1, 1)):
        assert run(http, "estimate", "llama-3-8b", "--batch", str(size), "--seq", "8192",
                   "--gpu", "l4")[0] == verdict  # fmt: skip

    # With --micro-batch the memory follows the micro-batch: the divisors of the batch below it.
    training = ("gpt-2", "--mode", "training", "--batch", "64", "--seq", "1024", "--precision",
                "fp32", "--gpu", "l4")  # fmt: skip
    code, out, err = run(http, "fit", *training, "--micro-batch", "32")
    assert code == 1, err
    micro = int(out.rsplit("largest micro-batch that fits nvidia-l4: ", 1)[1])
    assert 64 % micro == 0
    assert micro < 32
    assert run(http, "estimate", *training, "--micro-batch", str(micro))[0] == 0
    assert run(http, "estimate", *training, "--micro-batch", str(micro * 2))[0] == 1


# -- tables ------------------------------------------------------------------------------------


def test_show_commands_print_tables_and_json_on_request(http: TestClient) -> None:
    code, out, _ = run(http, "hardware", "show", "a100-40gb-sxm")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["field", "value"]
    assert "memory                           40.00 GiB (42,949,672,960 B)" in out
    assert "launch_year                      2020" in out
    assert any(line.split()[:3] == ["bf16", "312.00", "624.00"] for line in lines)
    assert any(line.startswith("7g.40gb    nvidia.com/mig-7g.40gb") for line in lines)
    code, out, _ = run(http, "hardware", "show", "nvidia-a100-40gb-sxm", "--json")
    assert json.loads(out)["memory_bytes"] == 42_949_672_960

    body = {"slug": "serve", "name": "Serve", "model": "gpt-2", "mode": "inference",
            "batch_size": 4, "precision": "bf16"}  # fmt: skip
    assert http.post("/v1/workloads", json=body, headers={"Authorization": "Bearer key-1"})
    code, out, _ = run(http, "workloads", "show", "serve")
    assert code == 0
    assert out.splitlines()[0].split() == ["field", "value"]
    rows = [line.split() for line in out.splitlines()]
    assert ["batch_size", "4"] in rows
    assert ["options.parallelism.zero_stage", "0"] in rows
    assert json.loads(run(http, "workloads", "show", "serve", "--json")[1])["batch_size"] == 4


def test_the_llm_table_shows_the_column_it_is_ranked_by(http: TestClient) -> None:
    devices = "nvidia-l4,nvidia-a10,nvidia-t4,nvidia-a100-40gb-sxm/1g.5gb"
    argv = ("recommend", "gpt-2", "--target", "100", "--devices", devices, "--limit", "8")
    code, out, err = run(http, *argv, "--json")
    assert code == 0, err
    result = json.loads(out)
    rendered = recommendation_table(result)
    header = rendered.splitlines()[0]
    assert "fleet $/h (ranked)" in header
    assert "TTFT ms" in header
    assert "tokens/s" in header
    assert rendered.endswith("ranked: eligible first, then by fleet $/h (ascending)")
    eligible = [c["fleet_cost_usd_per_hour"] for c in result["candidates"] if c["eligible"]]
    assert len(eligible) >= 3
    assert eligible == sorted(eligible)
    per_million = [c["cost_usd_per_million"] for c in result["candidates"] if c["eligible"]]
    assert per_million != sorted(per_million), "the case must tell the two columns apart"
    assert run(http, *argv)[1].count("fleet $/h (ranked)") == 1

    for objective, column in (("latency", "latency ms (ranked)"), ("energy", "J/inf (ranked)")):
        code, out, _ = run(http, "recommend", "resnet-50", "--devices", "nvidia-l4,nvidia-t4",
                           "--objective", objective)  # fmt: skip
        assert code == 0
        assert column in out
    code, out, _ = run(http, "recommend", "resnet-50", "--devices", "nvidia-l4,nvidia-t4")
    assert "$/M (ranked)" in out


# -- decoder serving and multi-GPU flags, through the real app ---------------------------------

DECODER = ("recommend", "gpt-2", "--devices", "nvidia-l4", "--precision", "fp16",
           "--batch", "8", "--prompt-tokens", "256", "--generated-tokens", "64",
           "--objective", "latency")  # fmt: skip


def recommend_both(http: TestClient, *argv: str) -> tuple[str, Json]:
    """The table and the JSON answer of one recommend command line (both exit 0)."""
    code, out, err = run(http, *argv)
    assert code == 0, err
    code, answer, err = run(http, *argv, "--json")
    assert code == 0, err
    return out, json.loads(answer)


def serving(answer: Json) -> Json:
    block: Json = answer["candidates"][0]["decoder_serving"]
    return block


def test_prompt_tokens_mean_is_priced_under_continuous_batching(http: TestClient) -> None:
    out, answer = recommend_both(http, *DECODER, "--batching", "continuous",
                                 "--prompt-tokens-mean", "100")  # fmt: skip
    assert answer["workload"]["prompt_tokens_mean"] == 100
    assert serving(answer)["prompt_tokens"] == 100
    assert "prompt mean 100 / max 256 tokens (priced at the mean)" in out


def test_generated_tokens_mean_under_static_batching_runs_to_the_maximum(
    http: TestClient,
) -> None:
    out, answer = recommend_both(http, *DECODER, "--generated-tokens-mean", "20")
    assert answer["workload"]["generated_tokens_mean"] == 20
    assert serving(answer)["decode_steps"] == 63  # the batch waits for its longest output
    assert "decoder serving: static batching; prompt 256 tokens; generated mean 20 / max 64 " \
        "tokens (padded to the maximum)" in out  # fmt: skip


def test_continuous_batching_shows_the_concurrent_requests(http: TestClient) -> None:
    out, answer = recommend_both(http, *DECODER, "--batching", "continuous")
    assert serving(answer)["batching"] == "continuous"
    header, _, first = out.split("\n\n")[2].splitlines()[:3]
    assert header.split()[3:6] == ["concurrent", "max", "(KV)"]
    most = serving(answer)["max_concurrent_requests"]
    assert first.split()[3:5] == ["8", f"{most:,}"]
    assert "decoder serving: continuous batching;" in out
    assert "paged KV cache in blocks of 64 tokens" in out


def test_beam_width_runs_beams_per_request(http: TestClient) -> None:
    out, answer = recommend_both(http, *DECODER, "--beam-width", "3")
    assert serving(answer)["beam_width"] == 3
    assert serving(answer)["decode_sequences"] == 3 * serving(answer)["concurrent_requests"]
    assert "beam search, 3 beams per request" in out


def test_beams_copy_prompt_gives_every_beam_its_own_prompt_cache(http: TestClient) -> None:
    beams = (*DECODER, "--batching", "continuous", "--beam-width", "4")
    out, answer = recommend_both(http, *beams)
    assert answer["workload"]["beams_share_prompt"] is True
    # 256 prompt tokens: 4 full blocks shared, then 64 generated tokens per beam -> 1 block
    assert serving(answer)["kv_tokens_per_request"] == 64 * (4 + 4 * 1)
    assert "beam search, 4 beams per request; paged KV cache in blocks of 64 tokens; " \
        "the beams share the prompt's KV cache" in out  # fmt: skip
    out, answer = recommend_both(http, *beams, "--beams-copy-prompt")
    assert answer["workload"]["beams_share_prompt"] is False
    assert serving(answer)["kv_tokens_per_request"] == 4 * 64 * 5  # 320 tokens per beam
    assert "every beam holds its own copy of the prompt's KV cache" in out
    assert "beams share" not in out


def test_kv_block_tokens_sizes_the_paged_cache(http: TestClient) -> None:
    out, answer = recommend_both(http, *DECODER, "--batching", "continuous",
                                 "--kv-block-tokens", "16")  # fmt: skip
    assert answer["workload"]["kv_block_tokens"] == 16
    assert serving(answer)["kv_tokens_per_request"] % 16 == 0
    assert "paged KV cache in blocks of 16 tokens" in out


LARGE = ("recommend", "llama-3-8b", "--devices", "nvidia-t4", "--precision", "fp16",
         "--batch", "1", "--batch", "4", "--objective", "latency")  # fmt: skip


def test_parallelism_pipeline_offers_a_pipeline_group(http: TestClient) -> None:
    out, answer = recommend_both(http, *LARGE, "--parallelism", "pipeline")
    group = next(c for c in answer["candidates"] if c["pipeline"])
    assert (group["device"], group["gpus"], group["pipeline_parallel"]) == (
        "nvidia-t4 x2 (pipeline)", 2, 2)  # fmt: skip
    assert "nvidia-t4 x2 (pipeline)" in out
    line = out.split("pipeline groups (--json has every stage and phase):\n")[1].splitlines()[0]
    assert line.startswith(f"  #{group['rank']} nvidia-t4 x2 (pipeline): 2 stages of 16 blocks "
                           f"each, {group['pipeline']['micro_batches']} micro-batches")  # fmt: skip
    assert "GPipe bubble" in line


def test_pipeline_parallel_max_1_offers_no_pipeline_group(http: TestClient) -> None:
    code, out, err = run(http, *LARGE, "--parallelism", "pipeline", "--pipeline-parallel-max", "1")
    # the lone T4 does not fit, and no group is offered
    assert code == cli_output.EXIT_VERDICT_NO, err
    assert "(pipeline)" not in out
    assert "pipeline groups" not in out
    assert "does not fit" in out


# -- a closed pipe -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live_url(sqlite_databases: SqliteDatabases) -> Iterator[str]:
    """The app over HTTP on a migrated SQLite file with the catalog, for subprocesses."""
    with sqlite_databases.fresh() as url:
        app = create_app(settings_for(url))
        with live_server(app) as (host, port):
            yield f"http://{host}:{port}"
        app.state.engine.dispose()


def _with_closed_stdout(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run with the read end of stdout closed before the first byte: every write is EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, cwd=PROJECT_ROOT,
                              timeout=120, check=False)  # fmt: skip
    finally:
        os.close(write)


def test_a_closed_pipe_exits_141_without_a_traceback(live_url: str) -> None:
    for argv in (["--url", live_url, "hardware", "list"],
                 ["--url", live_url, "hardware", "show", "l4", "--json"]):  # fmt: skip
        done = _with_closed_stdout([*CAPPLAN, *argv])
        assert done.returncode == cli_output.EXIT_BROKEN_PIPE == 141, done.stderr
        assert done.stderr == b"", done.stderr
    # argparse prints --help itself and ignores a failed write (then 0), else main exits 141.
    done = _with_closed_stdout([*CAPPLAN, "--help"])
    assert (done.returncode in (0, 141), done.stderr) == (True, b"")
    shell = subprocess.run(
        f"{' '.join(CAPPLAN[:2])} '{CAPPLAN[2]}' --url {live_url} hardware list | head -1",
        shell=True, capture_output=True, cwd=PROJECT_ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert shell.returncode == 0
    assert shell.stdout.split() == [b"slug", b"vendor", b"name", b"kind", b"memory", b"MIG"]
    assert shell.stderr == b""


# -- the client package: no server code ----------------------------------------------------------

SERVER_PACKAGES = ("fastapi", "starlette", "pydantic", "pydantic_core", "pydantic_settings",
                   "sqlalchemy", "alembic", "psycopg", "uvicorn", "yaml", "onnx", "numpy",
                   "prometheus_client", "multipart", "torch")  # fmt: skip
# The command line's own modules: app/client/cli.py (the parser and main) and the cli_*.py
# modules of its commands; none of them may need the server's packages.
CLI_MODULES = tuple(
    sorted(f"app.client.{path.stem}" for path in (PROJECT_ROOT / "app" / "client").glob("cli*.py"))
)

BLOCKED_RUN = textwrap.dedent(
    """
    import importlib.abc, json, sys

    SERVER = set(sys.argv[1].split(","))
    ALLOWED_APP = {"app", "app.client", "app.client.transport", *CLI_MODULES}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in SERVER or (top == "app" and name not in ALLOWED_APP):
                raise ImportError(f"blocked: {name}")
            return None

    sys.meta_path.insert(0, Block())
    from app.client.cli import main
    codes = [main(argv) for argv in json.loads(sys.argv[2])]
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in SERVER | {"app"})
    print(json.dumps({"codes": codes, "loaded": loaded}), file=sys.stderr)
    """
).replace("CLI_MODULES", repr(CLI_MODULES))


def test_the_cli_runs_without_any_server_package(live_url: str) -> None:
    runs = [
        ["--url", live_url, "estimate", "gpt-2", "--seq", "64", "--gpu", "l4"],
        ["--url", live_url, "fit", "gpt-2", "--gpu", "a100-80gb-sxm", "--seq", "64"],
        ["--url", live_url, "hardware", "show", "l4"],
        [
            "--url",
            live_url,
            "recommend",
            "resnet-50",
            "--devices",
            "nvidia-l4",
            "--objective",
            "latency",
        ],
        ["--url", live_url, "--json", "models", "list"],
    ]
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, ",".join(SERVER_PACKAGES), json.dumps(runs)],
        capture_output=True, cwd=PROJECT_ROOT, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stderr.decode().splitlines()[-1])
    assert report["codes"] == [0, 0, 0, 0, 0]
    assert report["loaded"] == sorted(["app", "app.client", "app.client.transport", *CLI_MODULES])
    assert b"fits nvidia-l4" in done.stdout
    # The blocker itself works: the typed client does need the server's schemas.
    blocked = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN.replace("from app.client.cli import main",
                                                   "from app.client import CapacityPlannerClient"),
         ",".join(SERVER_PACKAGES), "[]"],
        capture_output=True, cwd=PROJECT_ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert blocked.returncode == 1
    assert b"needs the capacity-planner package" in blocked.stderr


def test_the_client_package_ships_what_the_cli_imports_and_needs_only_httpx() -> None:
    client = tomllib.loads((PROJECT_ROOT / "client" / "pyproject.toml").read_text())
    server = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    project = client["project"]
    assert project["name"] == "capacity-planner-client"
    assert project["version"] == server["project"]["version"]
    httpx_pin = next(d for d in server["project"]["dependencies"] if d.startswith("httpx"))
    assert project["dependencies"] == [httpx_pin]
    assert project["optional-dependencies"] == {
        "torch": server["project"]["optional-dependencies"]["torch"]
    }
    assert project["scripts"] == {"capplan": server["project"]["scripts"]["capplan"]}
    setuptools = client["tool"]["setuptools"]
    assert setuptools["packages"] == ["app.client"]  # no server module, not even app/__init__
    assert setuptools["package-dir"] == {"": ".."}
    for module in ("cli", "transport", "torch_import", "torch_graph"):
        assert (PROJECT_ROOT / "app" / "client" / f"{module}.py").is_file()
    assert "app.client.cli" in CLI_MODULES
    assert len(CLI_MODULES) > 1
