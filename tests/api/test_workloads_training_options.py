"""The training options of issue 32 in a stored workload's ``options``: the workload's memory
and its stored admission decisions are the estimate endpoint's for the same options, and a
contradictory combination is a 422 problem+json naming ``/options/<field>``, nothing written."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from app.db.models import AdmissionDecision, Hardware, Workload
from tests.api.helpers import assert_problem
from tests.support import ApiClient, db_session, table_counts

A100 = "nvidia-a100-80gb-sxm"
TRAIN: dict[str, Any] = {
    "model": "gpt-2",
    "mode": "training",
    "batch_size": 2,
    "sequence_length": 256,
    "precision": "mixed_bf16",
    "hardware": A100,
}
OPTION_SETS: list[dict[str, Any]] = [
    {"optimizer_in_backward": True, "loss_chunks": 8},
    {"keep_gradients": True, "tokens_per_batch": 512},
    {"activation_offload": True, "checkpointing": "none"},
    {"parallelism": {"data": 2, "zero_stage": 3, "cpu_offload": True}},
    {"compile": True},
    {"keep_outputs": True, "loss": "logits_sum"},
    {"loss": "logits_sum"},
    # DeepSpeed ZeRO-3 offload on one GPU, its reduce bucket resized
    {
        "parallelism": {
            "zero_stage": 3,
            "cpu_offload": True,
            "deepspeed": {
                "reduce_bucket_size": 100_000_000,
                "stage3_prefetch_bucket_size": 50_000_000,
                "stage3_max_live_parameters": 1_000_000_000,
                "stage3_max_reuse_distance": 0,
            },
        }
    },
]


def _stored(slug: str, options: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {"slug": slug, "name": slug, **TRAIN, **changes, "options": options}


@pytest.mark.parametrize("options", OPTION_SETS)
def test_stored_options_are_estimated_as_the_request_would_be(
    client: ApiClient, options: dict[str, Any]
) -> None:
    created = client.post("/v1/workloads", json=_stored("tuned", options))
    assert created.status_code == 201, created.text
    kept = created.json()["options"]
    for key, value in options.items():
        given = kept[key]
        assert ({k: given[k] for k in value} if isinstance(value, dict) else given) == value
    stored = client.get("/v1/workloads/tuned/memory")
    assert stored.status_code == 200, stored.text
    direct = client.post("/v1/estimates/memory", json={**TRAIN, **options})
    assert direct.status_code == 200, direct.text
    plain = client.post("/v1/estimates/memory", json=TRAIN)
    assert plain.status_code == 200, plain.text
    # the options change the estimate, and the stored workload's estimate is the request's
    assert direct.json()["peak_bytes"] != plain.json()["peak_bytes"]
    assert stored.json()["peak_bytes"] == direct.json()["peak_bytes"]
    assert stored.json()["host_memory"] == direct.json()["host_memory"]


def _decision(db_url: str, slug: str, gpu: str) -> AdmissionDecision:
    with db_session(db_url) as session:
        query = (
            select(AdmissionDecision)
            .join(Workload, Workload.id == AdmissionDecision.workload_id)
            .join(Hardware, Hardware.id == AdmissionDecision.hardware_id)
            .where(Workload.slug == slug, Hardware.slug == gpu)
        )
        found = session.scalars(query).one()
        session.expunge_all()
        return found


def test_stored_decisions_follow_the_options(client: ApiClient, db_url: str) -> None:
    options = {"optimizer_in_backward": True, "loss_chunks": 8}
    assert client.post("/v1/workloads", json=_stored("plain", {})).status_code == 201
    assert client.post("/v1/workloads", json=_stored("tuned", options)).status_code == 201
    plain, tuned = _decision(db_url, "plain", A100), _decision(db_url, "tuned", A100)
    assert (plain.outcome, tuned.outcome) == ("estimated", "estimated")
    assert tuned.required_bytes != plain.required_bytes  # decided with the options
    check = client.post(
        "/v1/admission/check",
        json={"workload": "tuned", "gpu_model": A100, "resource": "nvidia.com/gpu"},
    )
    assert check.status_code == 200, check.text
    assert check.json()["required_bytes"] == tuned.required_bytes


@pytest.mark.parametrize(
    ("changes", "options", "pointer"),
    [
        ({}, {"loss_chunks": 0}, "/options/loss_chunks"),
        ({}, {"loss": "logits_sum", "loss_chunks": 2}, "/options/loss"),
        ({"mode": "inference", "precision": "bf16"}, {"loss": "logits_sum"}, "/options/loss"),
        ({"mode": "inference", "precision": "bf16"}, {"loss_chunks": 2}, "/options/loss_chunks"),
        (
            {},
            {"micro_batch_size": 1, "optimizer_in_backward": True},
            "/options/optimizer_in_backward",
        ),
        ({}, {"optimizer_in_backward": True, "keep_gradients": True}, "/options/keep_gradients"),
        (
            {},
            {"optimizer_in_backward": True, "parallelism": {"data": 2, "zero_stage": 1}},
            "/options/optimizer_in_backward",
        ),
        ({}, {"tokens_per_batch": 128}, "/options/tokens_per_batch"),
        (
            {"hardware": "intel-xeon-e5-2698-v3", "precision": "fp32"},
            {"activation_offload": True},
            "/options/activation_offload",
        ),
        (
            {},
            {"parallelism": {"data": 2, "zero_stage": 1, "cpu_offload": True}},
            "/options/parallelism/cpu_offload",
        ),
    ],
)
def test_contradictory_stored_options_are_422(
    client: ApiClient,
    db_url: str,
    changes: dict[str, Any],
    options: dict[str, Any],
    pointer: str,
) -> None:
    before = table_counts(db_url)
    response = client.post("/v1/workloads", json=_stored("bad", options, **changes))
    problem = assert_problem(response, 422)
    assert pointer in [error["pointer"] for error in problem["errors"]], problem
    assert table_counts(db_url) == before


def test_only_options_away_from_their_defaults_are_stored(client: ApiClient, db_url: str) -> None:
    """A row stores the options a client set, not every default: the release before this one
    (its WorkloadOptions forbids unknown keys) can still read a workload that uses none of the
    options added since (rollback, rolling upgrade); reading fills the defaults back in."""
    assert client.post("/v1/workloads", json=_stored("plain", {})).status_code == 201
    tuned = client.post("/v1/workloads", json=_stored("tuned", {"compile": True}))
    assert tuned.status_code == 201, tuned.text
    with db_session(db_url) as session:
        rows = {row.slug: row.options for row in session.scalars(select(Workload))}
    assert rows == {"plain": {}, "tuned": {"compile": True}}
    read = client.get("/v1/workloads/plain")
    assert read.status_code == 200, read.text
    assert read.json()["options"]["compile"] is False
    assert read.json()["options"]["optimizer_impl"] == "auto"
