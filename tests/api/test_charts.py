"""GET /v1/recommendations/roofline.svg and GET /v1/estimates/memory.svg."""

import xml.etree.ElementTree as ET

import httpx
import pytest

from tests.api.helpers import assert_problem
from tests.support import ApiClient, table_counts
from tests.test_charts import assert_no_overlap

NS = "{http://www.w3.org/2000/svg}"
ROOFLINE = "/v1/recommendations/roofline.svg"
MEMORY = "/v1/estimates/memory.svg"


def _svg(response: httpx.Response) -> ET.Element:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/svg+xml"
    root = ET.fromstring(response.content)
    assert root.tag == f"{NS}svg"
    return root


def _texts(root: ET.Element) -> list[str]:
    return ["".join(node.itertext()) for node in root.iter(f"{NS}text")]


def test_roofline_of_resnet50_on_a_gpu_and_a_cpu(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    root = _svg(
        client.get(
            ROOFLINE,
            params={
                "model": "resnet-50",
                "devices": "nvidia-a100-80gb-sxm,intel-xeon-platinum-8480plus",
                "precision": "int8",
                "batch_size": 4,
            },
        )
    )
    assert table_counts(db_url) == before
    texts = _texts(root)
    # every binding the kernels were evaluated at is in the title
    assert root.findtext(f"{NS}title") == "Roofline: resnet-50, int8, batch 4, image size 224"
    assert "operational intensity [FLOP/byte of DRAM traffic]" in texts
    assert "attainable performance [FLOP/s]" in texts
    assert {"0.1", "1", "10", "100", "1 k"} <= set(texts)  # log-decade ticks
    assert any(t.endswith("TFLOP/s") for t in texts)
    assert "NVIDIA A100 80GB SXM4, int8" in texts
    assert any(t.startswith("Intel Xeon Platinum 8480+") for t in texts)
    ridges = [t for t in texts if t.startswith("ridge ")]
    assert len(ridges) == 2
    assert all(t.endswith(" FLOP/B") for t in ridges)
    # one solid and one dashed roof per device; every kernel (56 per device) a point
    assert len(root.findall(f".//{NS}polyline")) == 4
    tips = [node.text or "" for node in root.iter(f"{NS}title")][1:]
    points = [t for t in tips if t.startswith("forward ")]
    assert len(points) == 2 * 56
    assert any(t.startswith("forward stem (conv2d+batchnorm2d+relu): ") for t in points)


def test_roofline_of_a_decoder_draws_decode_kernels_and_mig_slices(client: ApiClient) -> None:
    root = _svg(
        client.get(
            ROOFLINE,
            params={
                "model": "gpt-2",
                "devices": "nvidia-a100-80gb-sxm/1g.10gb, nvidia-v100-32gb-sxm2",
                "precision": "int8",
                "prompt_tokens": 64,
                "generated_tokens": 8,
            },
        )
    )
    texts = _texts(root)
    assert root.findtext(f"{NS}title") == (
        "Roofline: gpt-2, int8, batch 1, prompt 64 + 8 generated tokens"
    )
    assert "NVIDIA A100 80GB SXM4 MIG 1g.10gb, int8" in texts
    assert any("not drawn: nvidia-v100-32gb-sxm2 (no int8 peak" in t for t in texts)
    assert root.findall(f".//{NS}polygon")  # decode-step kernels are triangles
    tips = [node.text or "" for node in root.iter(f"{NS}title")]
    assert any(t.startswith("prefill ") for t in tips)
    assert any(t.startswith("decode ") for t in tips)


@pytest.mark.parametrize(
    ("params", "status", "detail"),
    [
        ({"model": "resnet-50", "devices": "no-such-gpu"}, 404, "'no-such-gpu' does not exist"),
        ({"model": "no-such-model", "devices": "nvidia-a10"}, 404, "'no-such-model'"),
        ({"model": "resnet-50", "devices": "nvidia-v100-32gb-sxm2"}, 422, "no named device"),
        ({"model": "resnet-50", "devices": ",".join(["nvidia-a10"] * 9)}, 422, "at most 8"),
        ({"model": "resnet-50", "devices": " , "}, 422, "at least one device"),
        ({"model": "resnet-50", "devices": "nvidia-a10", "batch_size": 0}, 422, "batch_size"),
        ({"model": "resnet-50", "devices": "nvidia-a10", "precision": "int3"}, 422, "precision"),
        ({"model": "resnet-50"}, 422, "devices"),
    ],
)
def test_roofline_bad_input(
    client: ApiClient, params: dict[str, object], status: int, detail: str
) -> None:
    body = assert_problem(client.get(ROOFLINE, params=params), status)
    assert detail in body["detail"]


def test_memory_breakdown_chart(client: ApiClient) -> None:
    params = {
        "model": "llama-2-7b",
        "mode": "inference",
        "batch_size": 2,
        "sequence_length": 2048,
        "precision": "bf16",
        "hardware": "nvidia-a10",
    }
    estimate = client.get("/v1/estimates/memory", params=params).json()
    root = _svg(client.get(MEMORY, params=params))
    texts = _texts(root)
    assert root.findtext(f"{NS}title") == (
        "Memory: llama-2-7b, inference, batch 2, sequence length 2048, bf16"
    )
    assert estimate["bindings"] == {"batch": 2, "seq": 2048}
    shown = [line for line in estimate["breakdown"] if line["bytes"] > 0]
    for line in shown:
        assert line["key"] in texts
        assert f"{line['bytes'] / 2**30:.3f} GiB" in texts
    assert "total (peak)" in texts
    assert f"{estimate['peak_bytes'] / 2**30:.3f} GiB" in texts
    fit = estimate["fit"]
    assert "nvidia-a10 usable 24 GiB" in texts
    assert f"required (+{fit['safety_margin_fraction']:g} margin)" in texts
    assert f"{fit['required_bytes'] / 2**30:.3f} GiB" in texts
    assert "memory [GiB]" in texts
    # background, lines, total, requirement
    assert len(root.findall(f".//{NS}rect")) == 1 + len(shown) + 2


def test_the_memory_chart_says_the_verdict_the_estimate_and_the_cli_give(
    client: ApiClient,
) -> None:
    """A peak just under the device's memory that does not fit once context, workspace and
    margin are added: the chart's verdict, requirement and usable line are the fit's numbers."""
    params = {
        "model": "llama-3-8b", "mode": "inference", "batch_size": 8, "sequence_length": 4096,
        "precision": "bf16", "hardware": "nvidia-a10",
    }  # fmt: skip
    fit = client.get("/v1/estimates/memory", params=params).json()["fit"]
    assert not fit["fits"]
    texts = _texts(_svg(client.get(MEMORY, params=params)))
    gib = 2**30
    assert (
        f"does NOT fit nvidia-a10: needs {fit['required_bytes'] / gib:,.2f} GiB of "
        f"{fit['usable_bytes'] / gib:,.2f} GiB usable, headroom "
        f"{fit['headroom_bytes'] / gib:,.2f} GiB"
    ) in texts
    assert f"nvidia-a10 usable {fit['usable_bytes'] / gib:.3g} GiB" in texts
    assert_no_overlap(client.get(MEMORY, params=params).content)


def test_the_memory_chart_of_a_mig_slice_uses_the_slice_memory(client: ApiClient) -> None:
    params = {
        "model": "gpt-2", "mode": "inference", "batch_size": 1,
        "hardware": "nvidia-a100-80gb-sxm/1g.10gb",
    }  # fmt: skip
    fit = client.get("/v1/estimates/memory", params=params).json()["fit"]
    assert fit["hardware"] == "nvidia-a100-80gb-sxm/1g.10gb"
    texts = _texts(_svg(client.get(MEMORY, params=params)))
    assert any(t.startswith("fits nvidia-a100-80gb-sxm/1g.10gb: needs ") for t in texts)
    assert f"nvidia-a100-80gb-sxm/1g.10gb usable {fit['usable_bytes'] / 2**30:.3g} GiB" in texts


def test_memory_chart_bad_input(client: ApiClient) -> None:
    base = {"model": "resnet-50", "mode": "training", "batch_size": 4}
    assert_problem(client.get(MEMORY, params={**base, "model": "nope"}), 404)
    assert_problem(client.get(MEMORY, params={**base, "mode": "serving"}), 422)
    body = assert_problem(client.get(MEMORY, params={**base, "micro_batch_size": 3}), 422)
    assert "micro_batch_size 3 must divide batch_size 4" in body["detail"]
    assert body["errors"][0]["location"] == "query"


def test_the_json_query_form_rejects_inconsistent_queries_with_422(client: ApiClient) -> None:
    response = client.get(
        "/v1/estimates/memory",
        params={"model": "resnet-50", "mode": "training", "batch_size": 4, "micro_batch_size": 3},
    )
    assert_problem(response, 422, "validation-error")


@pytest.mark.parametrize(
    ("params", "title"),
    [
        (  # the model's default sequence length is a binding too
            {"model": "gpt-2", "mode": "training", "batch_size": 8, "micro_batch_size": 2},
            "Memory: gpt-2, training, batch 8 (micro-batch 2), sequence length 1024, amp_bf16",
        ),
        (
            {"model": "resnet-50", "mode": "inference", "batch_size": 16, "precision": "fp16"},
            "Memory: resnet-50, inference, batch 16, image size 224, fp16",
        ),
    ],
)
def test_memory_chart_titles_carry_every_binding(
    client: ApiClient, params: dict[str, object], title: str
) -> None:
    root = _svg(client.get(MEMORY, params=params))
    assert root.findtext(f"{NS}title") == title
    shown = [t.text or "" for t in root.iter(f"{NS}text") if t.attrib["font-size"] == "18"]
    assert " ".join(shown) == title  # drawn in full, wrapped to the chart's width
