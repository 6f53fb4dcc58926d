"""decoder_sequence_length: an encoder-decoder's decoder length (the ``decoder_seq`` dim of an
imported T5), through the real app: it defaults to sequence_length, a shorter decoder needs
less memory, and a model without a decoder input or a bad value is a 422 naming the field."""

from __future__ import annotations

import json
from typing import Any

from app.config import PROJECT_ROOT
from tests.api.helpers import assert_problem
from tests.support import ApiClient, table_counts

HF_CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs"
TRAINING = {"mode": "training", "batch_size": 4, "sequence_length": 64, "precision": "fp32"}
# LoRA: the step's peak is in the backward, where the activations are (not the optimizer step)
LORA = {**TRAINING, "lora": {"r": 8, "target_modules": ["q", "v"]}}


def _import(client: ApiClient, slug: str, name: str) -> None:
    config = json.loads((HF_CONFIGS / f"{name}.json").read_text())
    response = client.post("/v1/models/import/hf-config", json={"slug": slug, "config": config})
    assert response.status_code == 201, response.text


def _estimate(client: ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/estimates/memory", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _lines(body: dict[str, Any]) -> dict[str, int]:
    return {line["key"]: line["bytes"] for line in body["breakdown"]}


def test_the_decoder_length_defaults_to_the_sequence_length(client: ApiClient) -> None:
    _import(client, "t5", "t5-small")
    default = _estimate(client, {"model": "t5", **TRAINING})
    same = _estimate(client, {"model": "t5", **TRAINING, "decoder_sequence_length": 64})
    assert default["peak_bytes"] == same["peak_bytes"]
    assert _lines(default) == _lines(same)
    echoed = {row["option"]: row["value"] for row in default["defaults_used"]}
    assert echoed["decoder_sequence_length"] == "64"
    assert "decoder_sequence_length" not in {row["option"] for row in same["defaults_used"]}


def test_a_shorter_decoder_keeps_fewer_activations(client: ApiClient) -> None:
    _import(client, "t5", "t5-small")
    default = _lines(_estimate(client, {"model": "t5", **LORA}))
    short = _lines(_estimate(client, {"model": "t5", **LORA, "decoder_sequence_length": 4}))
    assert short["weights"] == default["weights"]
    assert short["activations"] < default["activations"]
    # the loss's fp32 log-probabilities over the LM head's logits: 4 x 4 x 32,128 values
    # instead of 4 x 64 x 32,128 (the logits themselves are dropped before the backward)
    assert short["loss"] * 16 == default["loss"] == 4 * 64 * 32128 * 4


def test_decoder_length_on_a_model_without_a_decoder_is_a_422(client: ApiClient) -> None:
    _import(client, "t5-encoder", "t5-small-encoder")
    response = client.post(
        "/v1/estimates/memory",
        json={"model": "t5-encoder", **TRAINING, "decoder_sequence_length": 4},
    )
    body = assert_problem(response, 422)
    assert "decoder_sequence_length" in body["detail"]
    assert "/decoder_sequence_length" in [error["pointer"] for error in body["errors"]]
    decoder_only = client.post(
        "/v1/estimates/memory",
        json={"model": "gpt-2", **TRAINING, "decoder_sequence_length": 4},
    )
    assert "/decoder_sequence_length" in [
        error["pointer"] for error in assert_problem(decoder_only, 422)["errors"]
    ]


def test_a_decoder_length_below_one_is_a_422(client: ApiClient) -> None:
    _import(client, "t5", "t5-small")
    for bad in (0, -3, "long"):
        response = client.post(
            "/v1/estimates/memory",
            json={"model": "t5", **TRAINING, "decoder_sequence_length": bad},
        )
        body = assert_problem(response, 422)
        assert any("decoder_sequence_length" in error["pointer"] for error in body["errors"])


def test_the_query_form_takes_the_decoder_length(client: ApiClient) -> None:
    _import(client, "t5", "t5-small")
    query = {"model": "t5", "mode": "inference", "batch_size": 1, "sequence_length": 64}
    default = client.get("/v1/estimates/memory", params=query)
    short = client.get("/v1/estimates/memory", params={**query, "decoder_sequence_length": 1})
    assert default.status_code == short.status_code == 200, short.text
    assert short.json()["peak_bytes"] < default.json()["peak_bytes"]
    bad = client.get("/v1/estimates/memory", params={**query, "decoder_sequence_length": 0})
    body = assert_problem(bad, 422)
    assert any("decoder_sequence_length" in error["pointer"] for error in body["errors"])


def test_a_stored_workload_keeps_its_decoder_length(client: ApiClient) -> None:
    """``options.decoder_sequence_length`` of a stored workload: its memory is the estimate
    endpoint's with the same decoder length (and not the default's)."""
    _import(client, "t5", "t5-small")
    workload = {"slug": "t0-lora", "name": "T0 LoRA", "model": "t5", **TRAINING}
    created = client.post(
        "/v1/workloads", json={**workload, "options": {"decoder_sequence_length": 4}}
    )
    assert created.status_code == 201, created.text
    assert created.json()["options"]["decoder_sequence_length"] == 4
    stored = client.get("/v1/workloads/t0-lora/memory")
    assert stored.status_code == 200, stored.text
    direct = _estimate(client, {"model": "t5", **TRAINING, "decoder_sequence_length": 4})
    default = _estimate(client, {"model": "t5", **TRAINING})
    assert stored.json()["peak_bytes"] == direct["peak_bytes"] != default["peak_bytes"]


def test_a_stored_decoder_length_without_a_decoder_is_a_422(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    for bad in ({"model": "gpt-2"}, {"model": "gpt-2", "options": {"decoder_sequence_length": 0}}):
        body = {
            "slug": "bad",
            "name": "bad",
            **TRAINING,
            "options": {"decoder_sequence_length": 4},
            **bad,
        }
        problem = assert_problem(client.post("/v1/workloads", json=body), 422)
        pointers = [error["pointer"] for error in problem["errors"]]
        assert "/options/decoder_sequence_length" in pointers, problem
    assert table_counts(db_url) == before
