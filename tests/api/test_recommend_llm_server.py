"""POST /v1/recommendations/inference, scenario server with TTFT / TPOT p99 bounds: decoder
serving under continuous batching, replicas and fleet cost in one request, an explicit
tensor-parallel degree, and the bad inputs it refuses (against the real app and database)."""

import math
from typing import Any

import pytest

from tests.api.helpers import assert_problem
from tests.support import ApiClient, table_counts

URL = "/v1/recommendations/inference"
BASE: dict[str, Any] = {
    "model": "gpt-2",
    "devices": ["nvidia-a10", "nvidia-l4"],
    "precisions": ["fp16"],
    "prompt_tokens": 512,
    "generated_tokens": 128,
    "batching": "continuous",
    "scenario": "server",
    "ttft_p99_ms": 2000,
    "tpot_p99_ms": 200,
}


def _post(client: ApiClient, **body: Any) -> dict[str, Any]:
    response = client.post(URL, json={**BASE, **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_each_candidate_carries_its_simulated_ttft_and_tpot_p99_within_the_bounds(
    client: ApiClient,
) -> None:
    answer = _post(client, throughput_target_per_s=50)
    assert len(answer["candidates"]) == 2
    for candidate in answer["candidates"]:
        load = candidate["llm_server"]
        assert load is not None, candidate["reasons"]
        assert load["ttft_p99_ms"] <= 2000
        assert load["tpot_p99_ms"] <= 200
        assert load["ttft_p99_bound_ms"] == 2000
        assert load["tpot_p99_bound_ms"] == 200
        assert load["stable"] is True
        assert load["p99_drift"] < 0.05
        assert load["requests_simulated"] == 2000
        # the KV pool's concurrency is the simulated engine's limit, not a fixed number
        assert load["max_num_seqs"] == min(
            256, candidate["decoder_serving"]["max_concurrent_requests"]
        )  # vLLM's default max_num_seqs under 70 GiB, or fewer when the KV pool holds fewer
        assert load["max_num_batched_tokens"] == 2048  # vLLM's default under 70 GiB
        assert candidate["throughput_per_s"] == pytest.approx(load["arrival_rate_per_s"])
        assert candidate["latency_ms"] == pytest.approx(load["ttft_p99_ms"])
        # replicas for 50 requests/s, and what they cost
        replicas = candidate["devices_needed"]
        assert replicas == math.ceil(50 / load["arrival_rate_per_s"])
        price = candidate["inputs"].get("price_usd_per_hour")
        if candidate["device"] == "nvidia-a10":  # the catalog prices the A10, not the L4
            assert price == 1.006
            assert candidate["fleet_cost_usd_per_hour"] == pytest.approx(replicas * price)
        else:
            assert price is None
            assert candidate.get("fleet_cost_usd_per_hour") is None
        assert "TTFT p99" in load["note"]
    assert any("continuous batching" in note for note in answer["assumptions"])


def test_a_tighter_tpot_bound_serves_fewer_requests_per_replica(client: ApiClient) -> None:
    loose = _post(client, devices=["nvidia-a10"])["candidates"][0]["llm_server"]
    tight = _post(client, devices=["nvidia-a10"], tpot_p99_ms=loose["tpot_p99_ms"] * 0.8)
    tight_load = tight["candidates"][0]["llm_server"]
    assert tight_load is not None
    assert tight_load["arrival_rate_per_s"] < loose["arrival_rate_per_s"]


def test_a_bound_a_lone_request_misses_is_a_reason_not_a_rate(client: ApiClient) -> None:
    answer = _post(client, devices=["nvidia-a10"], tpot_p99_ms=0.001)
    (candidate,) = answer["candidates"]
    assert "llm_server" not in candidate  # null fields are left out of the answer
    assert candidate["eligible"] is False
    assert any("a lone request misses the bounds" in r for r in candidate["reasons"])


def test_an_explicit_tensor_parallel_degree_adds_groups_for_a_model_that_fits_one_gpu(
    client: ApiClient,
) -> None:
    plain = _post(client, devices=["nvidia-a10"])
    assert [c["device"] for c in plain["candidates"]] == ["nvidia-a10"]
    grouped = _post(client, devices=["nvidia-a10"], tensor_parallel_size=2)
    devices = {c["device"] for c in grouped["candidates"]}
    assert devices == {"nvidia-a10", "nvidia-a10 x2"}
    group = next(c for c in grouped["candidates"] if c["device"] == "nvidia-a10 x2")
    assert group["tensor_parallel"] == 2


@pytest.mark.parametrize(
    ("change", "pointer"),
    [
        ({"tpot_p99_ms": None}, "/tpot_p99_ms"),
        ({"ttft_p99_ms": None}, "/ttft_p99_ms"),
        ({"ttft_p99_ms": 0}, "/ttft_p99_ms"),
        ({"tpot_p99_ms": -1}, "/tpot_p99_ms"),
        ({"scenario": "offline"}, "/scenario"),
        ({"batching": "static"}, "/batching"),
        ({"beam_width": 2}, "/beam_width"),
        ({"max_num_batched_tokens": 0}, "/max_num_batched_tokens"),
        ({"max_num_seqs": 0}, "/max_num_seqs"),
        ({"ttft_p99_ms": None, "tpot_p99_ms": None, "max_num_seqs": 8}, "/max_num_seqs"),
        ({"tensor_parallel_size": 3}, "/tensor_parallel_size"),
        ({"model": "resnet-50", "prompt_tokens": None, "generated_tokens": None}, "/ttft_p99_ms"),
    ],
)
def test_bad_input_is_a_422_naming_the_field_and_writes_nothing(
    client: ApiClient, db_url: str, change: dict[str, Any], pointer: str
) -> None:
    body = {**BASE, **change}
    body = {k: v for k, v in body.items() if v is not None}
    before = table_counts(db_url)
    response = client.post(URL, json=body)
    assert_problem(response, 422)
    pointers = [e.get("pointer") for e in response.json().get("errors", [])]
    assert pointer in pointers, response.json()
    assert table_counts(db_url) == before
