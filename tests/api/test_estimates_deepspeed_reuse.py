"""parallelism.deepspeed.stage3_max_reuse_distance through the real app: DeepSpeed's default
(1e9 elements) keeps a small model's parameters gathered from the forward into the backward,
0 releases each layer after use, and a bad value is a 422 naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.helpers import assert_problem
from tests.support import ApiClient

# four Linear(1024, 1024) without bias: 4 x 1,048,576 parameters, under 5e8: all reused
ARCH = {
    "inputs": [{"name": "x", "shape": ["batch", 1024], "dtype": "float"}],
    "layers": [
        {"name": f"fc{i}", "op": "linear", "out_features": 1024, "bias": False} for i in range(4)
    ],
}
BODY = {
    "architecture": ARCH,
    "mode": "training",
    "batch_size": 8,
    "precision": "fp32",
    "runtime": "pytorch_cuda",
}


def _gathered(client: ApiClient, deepspeed: dict[str, Any] | None) -> tuple[int, str]:
    par: dict[str, Any] = {"zero_stage": 3, "cpu_offload": True}
    if deepspeed is not None:
        par["deepspeed"] = deepspeed
    response = client.post("/v1/estimates/memory", json={**BODY, "parallelism": par})
    assert response.status_code == 200, response.text
    lines = {line["key"]: line for line in response.json()["breakdown"]}
    line = lines["zero_gathered_params"]
    return line["bytes"], line["formula"]


def test_the_reuse_distance_keeps_a_small_model_gathered(client: ApiClient) -> None:
    # default: the 4,194,304 parameters kept + min(5e7, 1e9 - 4,194,304) prefetched + the
    # prefetch's GPU copy of its host partitions (offload_param), x 4 B
    kept, formula = _gathered(client, None)
    assert kept == (4 * 1_048_576 + 2 * 50_000_000) * 4 == 416_777_216
    assert "kept gathered for reuse" in formula
    assert "GPU copy of the host partition" in formula
    # 0: the largest layer, gathered whole to run, + the prefetch and its copy
    released, formula = _gathered(client, {"stage3_max_reuse_distance": 0})
    assert released == (1_048_576 + 2 * 50_000_000) * 4 == 404_194_304
    assert "largest layer" in formula


@pytest.mark.parametrize("bad", [-1, "far", 1 << 41])
def test_a_bad_reuse_distance_is_a_422(client: ApiClient, bad: object) -> None:
    par = {"zero_stage": 3, "cpu_offload": True, "deepspeed": {"stage3_max_reuse_distance": bad}}
    response = client.post("/v1/estimates/memory", json={**BODY, "parallelism": par})
    body = assert_problem(response, 422)
    pointers = [error["pointer"] for error in body["errors"]]
    assert "/parallelism/deepspeed/stage3_max_reuse_distance" in pointers
