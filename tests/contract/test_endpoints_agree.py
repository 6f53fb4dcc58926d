"""One workload, one answer: the memory estimate's fit, the MIG fit, the admission check and the
recommendations' memory fit give the same required bytes and the same verdict.

All four call the one requirement computation (app.domain.fit) with the same resolved workload
(the one default table); this test holds them to it through the real app, over a grid of
workloads x GPUs x every MIG profile of each GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import ApiClient

GPUS = ("nvidia-a100-80gb-sxm", "nvidia-h100-sxm", "nvidia-a30")
GENERATED = 128
# (workload, recommendation options): inference workloads are also asked of the recommender.
WORKLOADS: dict[str, dict[str, Any]] = {
    "bert-base inference": {
        "model": "bert-base", "mode": "inference", "batch_size": 8, "sequence_length": 128,
        "precision": "bf16",
    },
    "llama-3-8b serving": {
        "model": "llama-3-8b", "mode": "inference", "batch_size": 8, "sequence_length": 4096,
        "precision": "bf16",
    },
    "resnet-50 inference": {
        "model": "resnet-50", "mode": "inference", "batch_size": 64, "precision": "fp16",
    },
    "gpt-2 training": {
        "model": "gpt-2", "mode": "training", "batch_size": 8, "sequence_length": 1024,
        "precision": "amp_bf16",
    },
    "llama-2-7b defaults": {"model": "llama-2-7b", "mode": "inference", "batch_size": 4},
}  # fmt: skip


def _ok(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _recommendations(
    client: ApiClient, workload: dict[str, Any], gpu: str, profiles: list[str]
) -> dict[str, dict[str, Any]]:
    request: dict[str, Any] = {
        "model": workload["model"],
        "batch_sizes": [workload["batch_size"]],
        "precisions": [workload["precision"]],
        "devices": [gpu, *(f"{gpu}/{p}" for p in profiles)],
        "limit": 500,
    }
    if workload["model"] == "llama-3-8b":  # a decoder: prompt + generated tokens of context
        request["prompt_tokens"] = workload["sequence_length"] - GENERATED
        request["generated_tokens"] = GENERATED
    elif "sequence_length" in workload:
        request["sequence_length"] = workload["sequence_length"]
    body = _ok(client.post("/v1/recommendations/inference", json=request))
    return {row["device"]: row for row in body["candidates"]}


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_endpoint_gives_the_same_requirement_and_verdict(
    client: ApiClient, name: str, gpu: str
) -> None:
    workload = WORKLOADS[name]
    estimate = _ok(client.post("/v1/estimates/memory", json={**workload, "hardware": gpu}))
    fit = estimate["fit"]
    required = fit["required_bytes"]
    assert required == sum(line["bytes"] for line in fit["required"])
    assert fit["fits"] == (required <= estimate["fit"]["memory_bytes"])

    mig = _ok(client.post("/v1/mig/fit", json={"workload": workload, "gpu": gpu}))
    assert mig["required_bytes"] == required
    assert mig["required"] == fit["required"]
    assert mig["defaults_used"] == estimate["defaults_used"]
    profiles = {p["profile"]: p for p in mig["profiles"]}
    assert len(profiles) >= 4, profiles

    whole = _ok(
        client.post(
            "/v1/admission/check",
            json={"workload": workload, "gpu_model": gpu, "resource": "nvidia.com/gpu"},
        )
    )
    assert (whole["required_bytes"], whole["allowed"]) == (required, fit["fits"])
    for profile in profiles.values():
        check = _ok(
            client.post(
                "/v1/admission/check",
                json={
                    "workload": workload,
                    "gpu_model": gpu,
                    "resource": profile["kubernetes_resource"],
                },
            )
        )
        assert check["required_bytes"] == profile["required_bytes"] == required
        assert check["allowed"] == profile["fits"], (profile["profile"], check["message"])

    if workload["mode"] != "inference" or "precision" not in workload:
        return
    ranked = _recommendations(client, workload, gpu, sorted(profiles))
    assert gpu in ranked
    assert ranked[gpu]["memory_required_bytes"] == required
    assert ranked[gpu]["fits_in_memory"] == fit["fits"]
    for profile_name, profile in profiles.items():
        row = ranked[f"{gpu}/{profile_name}"]
        assert row["memory_required_bytes"] == required, profile_name
        assert row["fits_in_memory"] == profile["fits"], profile_name


def test_the_grid_has_both_verdicts(client: ApiClient) -> None:
    """Not a vacuous agreement: some profiles hold the Llama serving workload, others do not."""
    body = _ok(
        client.post(
            "/v1/mig/fit",
            json={"workload": WORKLOADS["llama-3-8b serving"], "gpu": "nvidia-a100-80gb-sxm"},
        )
    )
    verdicts = {p["profile"]: p["fits"] for p in body["profiles"]}
    assert verdicts["3g.40gb"] is True
    assert verdicts["1g.10gb"] is False
