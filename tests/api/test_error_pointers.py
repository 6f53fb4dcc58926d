"""The JSON pointers of a 422 name the request's own fields, never pydantic's internals.

pydantic puts the member of a union it tried into an error's location
(``workload/function-after[_one_model(), function-after[_storable_text(), WorkloadInput]]/
architecture``, ``workload/constrained-str``); a pointer must name keys and indices of the
body only. When one member of a union took the input (an object where a workload slug or an
inline workload may go), the other member's "Input should be a valid string" is noise and is
left out; when none did, both members' complaints are kept.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi import FastAPI

from app.schemas.mig import MigFitRequest
from tests.api.helpers import TINY_MLP, assert_problem
from tests.support import ApiClient

GPU = "nvidia-a100-80gb-sxm"
BOTH = {"model": "llama-2-7b", "architecture": TINY_MLP, "mode": "inference", "batch_size": 1}
NEITHER = {"mode": "inference", "batch_size": 1}
BAD_BATCH = {"model": "llama-2-7b", "mode": "inference", "batch_size": "x"}
UNKNOWN_FIELD = {"model": "llama-2-7b", "mode": "inference", "batch_size": 1, "bogus": 1}
# A segment pydantic makes up: a class name, a validator, a type name or a bracketed form.
INTERNAL = re.compile(r"[\[\]()]|^[A-Z]|function-|constrained-|^(?:str|int|float|bool)$")


def _pointers(problem: dict[str, Any]) -> list[str]:
    return [error["pointer"] for error in problem["errors"]]


def _check_segments(pointers: list[str]) -> None:
    for pointer in pointers:
        for segment in pointer.split("/")[1:]:
            assert not INTERNAL.search(segment), pointer


CASES = [
    ("/v1/estimates/memory", BOTH, ["/architecture"]),
    ("/v1/estimates/memory", NEITHER, ["/model"]),
    (
        "/v1/recommendations/inference",
        {"model": "resnet-50", "architecture": TINY_MLP},
        ["/architecture"],
    ),
    ("/v1/mig/fit", {"workload": BOTH, "gpu": GPU}, ["/workload/architecture"]),
    ("/v1/mig/fit", {"workload": NEITHER, "gpu": GPU}, ["/workload/model"]),
    ("/v1/mig/fit", {"workload": BAD_BATCH, "gpu": GPU}, ["/workload/batch_size"]),
    ("/v1/mig/fit", {"workload": UNKNOWN_FIELD, "gpu": GPU}, ["/workload/bogus"]),
    # A string that is no slug: the slug member's complaint, not "should be an object".
    ("/v1/mig/fit", {"workload": "Chat Serving", "gpu": GPU}, ["/workload"]),
    (
        "/v1/mig/plan",
        {"gpu": GPU, "workloads": [{"name": "a", "replicas": 1, "workload": BOTH}]},
        ["/workloads/0/workload/architecture"],
    ),
    (
        "/v1/admission/check",
        {"workload": BOTH, "resource": "nvidia.com/gpu", "gpu_model": GPU},
        ["/workload/architecture"],
    ),
]


@pytest.mark.parametrize(("url", "body", "expected"), CASES)
def test_pointers_name_the_request_fields(
    client: ApiClient, url: str, body: dict[str, Any], expected: list[str]
) -> None:
    problem = assert_problem(client.post(url, json=body), 422)
    pointers = _pointers(problem)
    _check_segments(pointers)
    assert pointers == expected
    assert "function-after" not in problem["detail"]


def test_a_value_no_union_member_takes_keeps_both_complaints(client: ApiClient) -> None:
    """A list where a workload slug or an inline workload goes: neither member took it, so
    both say why (each at /workload)."""
    problem = assert_problem(client.post("/v1/mig/fit", json={"workload": [1], "gpu": GPU}), 422)
    assert _pointers(problem) == ["/workload", "/workload"]
    assert {e["type"] for e in problem["errors"]} == {"model_attributes_type", "string_type"}


def test_a_validation_error_escaping_a_service_has_no_union_tags(client: ApiClient) -> None:
    """The same cleaning when the body is not known (a model a service built)."""
    app: FastAPI = client.app

    async def endpoint() -> None:
        MigFitRequest.model_validate({"workload": BOTH, "gpu": GPU})

    app.add_api_route("/test/escape/union", endpoint, methods=["POST"])
    problem = assert_problem(client.post("/test/escape/union"), 422, "invalid-input")
    assert _pointers(problem) == ["/workload/architecture"]


def test_dict_keys_that_look_like_union_tags_are_kept(client: ApiClient) -> None:
    """Keys a client sent stay in the pointer, even hyphenated ones like a device slug."""
    body = {"model": "resnet-50", "prices_usd_per_hour": {"nvidia-a10": -1}}
    problem = assert_problem(client.post("/v1/recommendations/inference", json=body), 422)
    assert _pointers(problem) == ["/prices_usd_per_hour/nvidia-a10"]


BROKEN = {
    "inputs": TINY_MLP["inputs"],
    "layers": [*TINY_MLP["layers"][:2], {"name": "fc2", "op": "no-such-op"}],
}
INLINE_BROKEN = {"architecture": BROKEN, "mode": "inference", "batch_size": 1}
# GPT-2 has 1,024 positions: its stored graph cannot take the sequence (the detail names wpe)
TOO_LONG = {"model": "gpt-2", "mode": "inference", "batch_size": 1, "sequence_length": 100_000}


@pytest.mark.parametrize(
    ("path", "body", "pointer"),
    [
        ("/v1/estimates/memory", INLINE_BROKEN, "/architecture/layers/2/op"),
        (
            "/v1/mig/fit",
            {"workload": INLINE_BROKEN, "gpu": GPU},
            "/workload/architecture/layers/2/op",
        ),
        (
            "/v1/mig/plan",
            {"gpu": GPU, "workloads": [{"name": "a", "replicas": 1, "workload": INLINE_BROKEN}]},
            "/workloads/0/workload/architecture/layers/2/op",
        ),
        (
            "/v1/admission/check",
            {"workload": INLINE_BROKEN, "gpu_model": GPU, "resource": "nvidia.com/gpu"},
            "/workload/architecture/layers/2/op",
        ),
        (
            "/v1/recommendations/inference",
            {"architecture": BROKEN, "devices": ["nvidia-a10"]},
            "/architecture/layers/2/op",
        ),
        ("/v1/estimates/memory", TOO_LONG, "/model"),
        ("/v1/mig/fit", {"workload": TOO_LONG, "gpu": GPU}, "/workload/model"),
    ],
)
def test_problems_found_past_the_schema_point_into_the_request(
    client: ApiClient, path: str, body: dict[str, Any], pointer: str
) -> None:
    """The graph validator and the estimate point at a workload's own fields and at layers by
    name; the answer places them where the request holds them, layers by index."""
    problem = assert_problem(client.post(path, json=body), 422)
    assert _pointers(problem) == [pointer]
