"""Pipeline-parallel candidates through the real app: offered when asked for a model no GPU
holds, labelled, priced as the group, with every number of the pipeline; bad input is a 422."""

from typing import Any

import pytest

from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.precision import Precision
from tests.api.helpers import assert_problem
from tests.support import ApiClient, table_counts

URL = "/v1/recommendations/inference"
GPT3 = {
    "model": "gpt-3-175b",
    "precisions": ["fp8"],
    "batch_sizes": [1, 8],
    "prompt_tokens": 128,
    "generated_tokens": 16,
}
GPT3_HIDDEN = 12288
GPT3_LAYERS = 96


def _recommend(client: ApiClient, **body: Any) -> dict[str, Any]:
    response = client.post(URL, json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _by_device(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["device"]: c for c in body["candidates"]}


def test_a_model_no_gpu_holds_gets_a_pipeline_group_when_asked(client: ApiClient) -> None:
    """GPT-3 175B at fp8 fits no 80 GB GPU: with parallelism pipeline the smallest pipeline
    group whose per-GPU peak fits is offered (4 stages of 24 blocks), priced and powered as 4
    GPUs, its sends over NVLink (SXM) or PCIe, and no tensor group."""
    body = _recommend(
        client, **GPT3, devices=["nvidia-h100-sxm", "nvidia-h100-pcie"], parallelism="pipeline"
    )
    found = _by_device(body)
    assert not found["nvidia-h100-sxm"]["fits_in_memory"]
    assert "nvidia-h100-sxm x4" not in found  # no tensor group when pipeline is asked for
    group = found["nvidia-h100-sxm x4 (pipeline)"]
    assert group["device_name"] == "4 x NVIDIA H100 SXM5 80GB (pipeline parallel)"
    assert (group["gpus"], group["tensor_parallel"], group["pipeline_parallel"]) == (4, 1, 4)
    assert group["fits_in_memory"]
    assert group["inputs"]["price_usd_per_hour"] == pytest.approx(
        4 * found["nvidia-h100-sxm"]["inputs"]["price_usd_per_hour"]
    )
    assert "pipeline parallel over 4 stages" in group["memory_detail"]
    assert group["memory_required_bytes"] < found["nvidia-h100-sxm"]["memory_required_bytes"] / 3
    pipe = group["pipeline"]
    assert pipe["stages"] == 4
    assert pipe["link"] == "the catalog's GPU link (NVLink)"
    assert [s["blocks"] for s in pipe["stage_layout"]] == [24, 24, 24, 24]
    layout = [(s["first_kernel"], s["last_kernel"], s["kernels"]) for s in pipe["stage_layout"]]
    assert layout == [
        ("wte", "h.23.mlp", 98),  # + token and position embeddings
        ("h.24.ln_1", "h.47.mlp", 96),
        ("h.48.ln_1", "h.71.mlp", 96),
        ("h.72.ln_1", "lm_head", 98),  # + final norm and LM head
    ]
    batch = group["batch_size"]
    m = min(batch, 4)
    assert (pipe["micro_batches"], pipe["micro_batch_size"]) == (m, -(-batch // m))
    activation = PRECISION_SCHEMES[Precision.FP8].activation_bytes
    prefill, decode = pipe["phases"]
    mu = pipe["micro_batch_size"]
    assert prefill["send_bytes"] == [mu * 128 * GPT3_HIDDEN * activation] * 3
    assert decode["send_bytes"] == [mu * 1 * GPT3_HIDDEN * activation] * 3
    for phase in (prefill, decode):
        sends = [
            pipe["transfer_latency_s"] + b / pipe["link_bytes_per_s"] for b in phase["send_bytes"]
        ]
        assert phase["send_s"] == pytest.approx(sends)
        trip = sum(phase["stage_s"]) + sum(sends)
        slot = max(t + x for t, x in zip(phase["stage_s"], [*sends, 0.0], strict=True))
        assert phase["round_trip_s"] == pytest.approx(trip)
        assert phase["cycle_s"] == pytest.approx(max(m * slot, trip))
        assert phase["gpipe_bubble_fraction"] == pytest.approx(3 / (m + 3))
        assert phase["idle_fraction"] == pytest.approx(
            1 - m * sum(phase["stage_s"]) / (4 * phase["cycle_s"])
        )
    step = group["phases"][-1]
    assert step["pipeline_transfer_s"] == pytest.approx(sum(decode["send_s"]))
    assert group["per_token_latency_ms"] == pytest.approx(
        (decode["cycle_s"] + step["h2d_s"] + step["d2h_s"]) * 1e3
    )
    assert found["nvidia-h100-pcie x4 (pipeline)"]["pipeline"]["link"].startswith("the host link")
    assert any(a.startswith("pipeline parallel:") for a in body["assumptions"])


def test_the_default_answer_has_no_pipeline_group_and_both_offers_all(client: ApiClient) -> None:
    default = _recommend(client, **GPT3, devices=["nvidia-h100-sxm"])
    assert set(_by_device(default)) == {"nvidia-h100-sxm", "nvidia-h100-sxm x4"}
    assert all(c.get("pipeline") is None for c in default["candidates"])
    assert not any(a.startswith("pipeline parallel:") for a in default["assumptions"])
    both = _recommend(client, **GPT3, devices=["nvidia-h100-sxm"], parallelism="both")
    found = _by_device(both)
    assert set(found) == {
        "nvidia-h100-sxm",
        "nvidia-h100-sxm x4",
        "nvidia-h100-sxm x4 (pipeline)",
        "nvidia-h100-sxm x4 (tensor 2 x pipeline 2)",
    }
    hybrid = found["nvidia-h100-sxm x4 (tensor 2 x pipeline 2)"]
    assert (hybrid["tensor_parallel"], hybrid["pipeline_parallel"]) == (2, 2)
    assert hybrid["phases"][-1]["allreduces"] == 2 * GPT3_LAYERS  # every stage's own layers
    assert [s["blocks"] for s in hybrid["pipeline"]["stage_layout"]] == [48, 48]
    capped = _recommend(
        client, **GPT3, devices=["nvidia-h100-sxm"], parallelism="pipeline", pipeline_parallel_max=2
    )
    assert set(_by_device(capped)) == {"nvidia-h100-sxm"}  # 2 stages do not hold it


def test_a_model_that_fits_gets_no_pipeline_group(client: ApiClient) -> None:
    body = _recommend(
        client, model="gpt-2", devices=["nvidia-h100-sxm"], batch_sizes=[1], parallelism="both"
    )
    assert {c["gpus"] for c in body["candidates"]} == {1}


@pytest.mark.parametrize(
    ("change", "pointer"),
    [
        ({"parallelism": "data"}, "/parallelism"),
        ({"parallelism": ["pipeline"]}, "/parallelism"),
        ({"pipeline_parallel_max": 0}, "/pipeline_parallel_max"),
        ({"pipeline_parallel_max": 16}, "/pipeline_parallel_max"),
        ({"pipeline_parallel_max": "four"}, "/pipeline_parallel_max"),
    ],
)
def test_bad_pipeline_options_are_422(
    client: ApiClient, db_url: str, change: dict[str, Any], pointer: str
) -> None:
    before = table_counts(db_url)
    response = client.post(URL, json={"model": "resnet-50", **change})
    body = assert_problem(response, 422, "validation-error")
    assert response.headers["content-type"].startswith("application/problem+json")
    assert pointer in [error["pointer"] for error in body["errors"]], body["errors"]
    assert table_counts(db_url) == before
