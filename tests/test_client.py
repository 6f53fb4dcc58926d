"""The Python client and the `capplan` CLI against the real app on SQLite and PostgreSQL."""

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.client import ApiError, CapacityPlannerClient
from app.client.cli import main
from app.client.cli_output import ProgressBar, table
from app.config import PROJECT_ROOT
from app.main import create_app
from tests.api.helpers import MODEL, hardware
from tests.importers import onnx_models
from tests.support import settings_for, table_counts

HF_CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs"


@pytest.fixture
def http(db_url: str) -> Iterator[TestClient]:
    app = create_app(settings_for(db_url, api_keys="key-1"))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    app.state.engine.dispose()


@pytest.fixture
def api(http: TestClient) -> CapacityPlannerClient:
    return CapacityPlannerClient(api_key="key-1", http=http)


def run(http: TestClient, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*argv, "--api-key", "key-1"] if argv[:1] != ("--help",) else list(argv),
                http=http, out=out, err=err)  # fmt: skip
    return code, out.getvalue(), err.getvalue()


def test_client_covers_models_hardware_estimates_mig_workloads_admission(
    api: CapacityPlannerClient,
) -> None:
    assert api.health() == {"status": "ok"}
    assert api.ready()["status"] == "ready"
    assert "capplan_http_requests_total" in api.metrics()
    gpus = api.list_hardware(kind="gpu", mig_capable=True, limit=500)
    assert gpus.total > 0
    assert all(item.mig is not None for item in gpus.items)
    created = api.create_hardware(hardware())
    assert api.get_hardware("lab-gpu-1") == created
    replaced = api.replace_hardware(
        "lab-gpu-1", {k: v for k, v in hardware(name="Renamed").items() if k != "slug"},
        if_match=created.version,
    )  # fmt: skip
    assert replaced.name == "Renamed"
    assert [p.name for p in api.mig_profiles("lab-gpu-1").profiles] == ["1g.3gb", "7g.24gb"]

    model = api.create_model(MODEL)
    assert api.get_model("tiny-cnn").version == model.version == 1
    assert api.model_summary("tiny-cnn", batch_size=2).total_params == model_params()
    assert [m.slug for m in api.list_models(provenance="user").items] == ["tiny-cnn"]
    estimate = api.estimate_memory({"model": "tiny-cnn", "mode": "training", "batch_size": 4})
    assert estimate.peak_bytes == sum(line.bytes for line in estimate.breakdown)

    workload = api.create_workload(
        {"slug": "cnn-serving", "name": "CNN", "model": "tiny-cnn", "mode": "inference",
         "batch_size": 8, "precision": "fp32"}
    )  # fmt: skip
    assert api.get_workload("cnn-serving") == workload
    assert api.list_workloads(model="tiny-cnn").total == 1
    assert api.workload_memory("cnn-serving").peak_bytes > 0
    fit = api.mig_fit({"workload": "cnn-serving", "gpu": "lab-gpu-1"})
    assert fit.smallest_fitting_profile == "1g.3gb"
    layout = api.validate_layout(
        {"gpu": "lab-gpu-1", "instances": [{"profile": "7g.24gb", "start": 0},
                                           {"profile": "1g.3gb", "start": 0}]}
    )  # fmt: skip
    assert not layout.valid
    served = {"name": "cnn", "workload": "cnn-serving", "replicas": 3}
    plan = api.mig_plan({"gpu": "lab-gpu-1", "workloads": [served]})
    assert plan.gpu_count == 1
    check = api.admission_check(
        {"workload": "cnn-serving", "resource": "nvidia.com/mig-1g.3gb", "gpu_model": "lab-gpu-1"}
    )
    assert check.allowed
    review = api.admission_review({"kind": "AdmissionReview"})
    assert review["response"]["allowed"] is False

    with pytest.raises(ApiError) as stale:
        api.delete_workload("cnn-serving", if_match=7)
    assert stale.value.status == 412
    api.replace_workload(
        "cnn-serving",
        {"name": "CNN", "model": "tiny-cnn", "mode": "inference", "batch_size": 4,
         "precision": "fp32"},
        if_match='"1"',
    )  # fmt: skip
    api.delete_workload("cnn-serving", if_match=2)
    api.replace_model("tiny-cnn", {k: v for k, v in MODEL.items() if k != "slug"}, if_match=1)
    api.delete_model("tiny-cnn", if_match=2)
    api.delete_hardware("lab-gpu-1", if_match=replaced.version)


def model_params() -> int:
    return 3 * 16 * 9 + 16 + 16 * 10 + 10


def test_client_imports_and_reports_problems(api: CapacityPlannerClient, db_url: str) -> None:
    config = json.loads((HF_CONFIGS / "qwen2-0.5b.json").read_text())
    imported = api.import_hf_config({"slug": "qwen", "config": config})
    assert imported.report.parameter_count == 494_032_768
    seen: list[tuple[int, int]] = []
    uploaded = api.import_onnx(
        onnx_models.small_cnn(), slug="small-cnn", progress=lambda a, b: seen.append((a, b))
    )
    assert uploaded.report.parameter_count == 2_970
    assert seen[-1][0] == seen[-1][1] > 0
    before = table_counts(db_url)
    with pytest.raises(ApiError) as caught:
        api.import_onnx(onnx_models.with_unsupported(), slug="odd")
    assert caught.value.status == 422
    assert caught.value.problem["type"] == "/problems/unsupported-onnx-ops"
    assert len(caught.value.errors) == 2
    assert table_counts(db_url) == before
    unauthenticated = CapacityPlannerClient(http=api.http)
    unauthenticated.http.headers.pop("Authorization")
    with pytest.raises(ApiError) as denied:
        unauthenticated.create_model(MODEL)
    assert denied.value.status == 401


def test_cli_estimate_fit_and_json(http: TestClient) -> None:
    code, out, err = run(http, "estimate", "gpt-2", "--mode", "inference", "--batch", "8",
                         "--precision", "bf16", "--seq", "128")  # fmt: skip
    assert code == 0, err
    assert "gpt-2: inference, batch 8, bf16 (124,439,808 parameters)" in out
    assert "weights" in out
    assert "peak " in out
    assert "on CUDA: max_memory_allocated " in out  # allocated, reserved and device total

    # Left out, the sequence length, precision, attention and logits come from the server's
    # default table, and the header says so.
    code, out, err = run(http, "estimate", "llama-3-8b", "--batch", "8")
    assert code == 0, err
    assert "llama-3-8b: inference, batch 8, bf16 " in out
    assert "seq=8192" in out
    assert "  sequence_length = 8192 (the model's default `seq`)" in out
    assert "  precision = bf16 (inference on pytorch_cuda)" in out
    assert "  logits = last (" in out
    assert "attention: flash: " in out

    code, out, err = run(http, "estimate", "gpt-2", "--batch", "2", "--seq", "64", "--json")
    assert code == 0, err
    assert json.loads(out)["params"] == 124_439_808

    code, out, err = run(http, "fit", "llama-3-8b", "--gpu", "h100-sxm-80gb", "--mode", "inference",
                         "--batch", "1", "--precision", "bf16", "--seq", "512")  # fmt: skip
    assert code == 0, err
    assert "nvidia.com/mig-" in out
    assert "smallest fit: " in out

    code, out, err = run(http, "fit", "gpt-2", "--gpu", "nvidia", "--seq", "64")
    assert code == 2
    assert "ambiguous" in err


def test_cli_import_list_show_delete(http: TestClient, tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "cnn.onnx"
    path.write_bytes(onnx_models.small_cnn())
    code, out, err = run(http, "import", "onnx", str(path), "--slug", "cnn", "--family", "cnn")
    assert code == 0, err
    assert "parameters: 2,970 (ONNX initializers)" in out
    assert "Conv" in out
    assert "conv2d" in out

    config = tmp_path / "config.json"
    config.write_text((HF_CONFIGS / "gpt2.json").read_text())
    code, out, err = run(http, "import", "hf-config", str(config), "--slug", "gpt", "--json")
    assert code == 0, err
    assert json.loads(out)["report"]["parameter_count"] == 124_439_808

    code, out, _ = run(http, "models", "list", "--provenance", "onnx")
    assert code == 0
    assert "cnn" in out.splitlines()[2]
    code, out, _ = run(http, "models", "show", "cnn")
    assert "2,970 parameters" in out
    code, out, _ = run(http, "models", "delete", "cnn")
    assert (code, out) == (0, "deleted cnn\n")

    before = table_counts(db_url)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage\xff" * 50)
    code, out, err = run(http, "import", "onnx", str(bad), "--slug", "bad")
    assert code == 3
    assert "error 422: not a valid ONNX file" in err
    assert table_counts(db_url) == before


def test_cli_hardware_mig_workloads_admission_health(http: TestClient, tmp_path: Path) -> None:
    code, out, _ = run(http, "hardware", "list", "--kind", "gpu")
    assert code == 0
    assert "nvidia-a100-80gb-sxm" in out
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"gpu": "nvidia-a100-80gb-sxm", "workloads": [
        {"name": "small", "profile": "1g.10gb", "replicas": 3}]}))  # fmt: skip
    code, out, err = run(http, "mig", "plan", str(plan))
    assert code == 0, err
    assert "1 x nvidia-a100-80gb-sxm" in out
    assert "mig-configs" in out
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"gpu": "nvidia-a100-80gb-sxm",
                                  "instances": [{"profile": "7g.80gb", "start": 0}]}))  # fmt: skip
    assert run(http, "mig", "validate", str(layout))[1] == "valid\n"
    assert run(http, "workloads", "list")[0] == 0
    check = tmp_path / "check.json"
    check.write_text(json.dumps({"workload": {"model": "gpt-2", "mode": "inference",
                                              "batch_size": 1, "sequence_length": 64},
                                 "resource": "nvidia.com/mig-1g.10gb",
                                 "gpu_model": "nvidia-a100-80gb-sxm"}))  # fmt: skip
    code, out, _ = run(http, "admission", str(check))
    assert out.startswith("ALLOWED")
    assert run(http, "health") == (0, "ready\n", "")


def test_client_recommendations_and_charts(api: CapacityPlannerClient) -> None:
    devices = ["intel-xeon-platinum-8480plus", "nvidia-a100-40gb-sxm/1g.5gb", "nvidia-l4"]
    result = api.recommend_inference(
        {"model": "resnet-50", "batch_sizes": [1, 8], "precisions": ["int8"],
         "devices": devices, "latency_slo_ms": 20, "objective": "latency"}
    )  # fmt: skip
    assert {c.device for c in result.candidates} <= set(devices)
    assert result.candidates[0].rank == 1
    latencies = [c.latency_ms for c in result.candidates if c.eligible]
    assert latencies == sorted(latencies)  # objective latency: fastest first
    svg = api.roofline_svg("resnet-50", ["nvidia-l4", "intel-xeon-platinum-8480plus"])
    assert svg.lstrip().startswith("<")
    assert "</svg>" in svg
    chart = api.memory_svg(model="gpt-2", mode="inference", batch_size=1, sequence_length=64)
    assert "GiB" in chart
    assert "</svg>" in chart
    with pytest.raises(ApiError) as unknown:
        api.recommend_inference({"model": "resnet-50", "devices": ["nvidia-x9"]})
    assert unknown.value.status == 404


def test_cli_recommend(http: TestClient, tmp_path: Path) -> None:
    svg = tmp_path / "roofline.svg"
    code, out, err = run(http, "recommend", "resnet-50", "--batch", "1", "--batch", "4",
                         "--precision", "int8", "--slo-ms", "20", "--target", "500",
                         "--devices", "intel-xeon-platinum-8480plus,nvidia-l4,nvidia-t4",
                         "--price", "intel-xeon-platinum-8480plus=0.3",
                         "--svg", str(svg))  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("Run resnet-50 on ")  # the recommendation paragraph comes first
    assert any(line.startswith("#  device") for line in lines)
    assert "bindings: batch=1, image=224" in out  # the header echoes bindings and defaults
    assert "  image_size = 224 (the model's default)" in out
    assert "candidates eligible" in out
    assert "</svg>" in svg.read_text()
    code, out, err = run(http, "recommend", "resnet-50", "--batch", "2", "--precision", "fp32",
                         "--devices", "nvidia-l4", "--json")  # fmt: skip
    assert code == 1, err  # the L4 has no catalog price: not eligible for cost, exit 1
    assert json.loads(out)["candidates"][0]["device"] == "nvidia-l4"
    assert run(http, "recommend", "resnet-50", "--price", "oops")[0] == 2
    code, _, err = run(http, "recommend", "resnet-50", "--slo-ms", "0")
    assert code == 3
    assert "error 422" in err


def test_cli_usage_errors_exit_2(http: TestClient, tmp_path: Path) -> None:
    assert run(http, "estimate")[0] == 2
    assert run(http, "models", "show")[0] == 2
    assert run(http, "mig", "plan", str(tmp_path / "missing.json"))[0] == 2
    assert run(http, "import", "onnx", str(tmp_path / "missing.onnx"), "--slug", "x")[0] == 2
    assert run(http, "--help")[0] == 0
    code, _, err = run(http, "models", "show", "nope")
    assert code == 3
    assert "error 404" in err


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_bar_shows_only_after_a_second() -> None:
    stream, clock = io.StringIO(), _Clock()
    bar = ProgressBar("uploading", stream, clock=clock, enabled=True)
    bar.update(10, 100)
    assert stream.getvalue() == ""
    clock.now = 1.5
    bar.update(50, 100)
    bar.close()
    assert "[###############---------------]  50.0%" in stream.getvalue()
    assert stream.getvalue().endswith("\n")
    quiet = io.StringIO()
    ProgressBar("x", quiet, clock=clock, enabled=False).update(1, 2)
    assert quiet.getvalue() == ""


def test_table_aligns_numbers_right() -> None:
    rendered: Any = table([("a", 1), ("bb", 1000)], ["name", "n"])
    assert rendered.splitlines() == ["name      n", "----  -----", "a         1", "bb    1,000"]
