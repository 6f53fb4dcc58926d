"""The estimate-run cache (app.services.pipeline) keeps runs of graphs up to
``CACHED_RUN_MAX_LAYERS`` executed layers only: an entry holds its graph analysis, so its memory
grows with the layers (a 90,001-layer model's decisions on every GPU took a served process to
880 MiB, over the deploy kit's 512 Mi)."""

from __future__ import annotations

from typing import Any

import pytest

from app.services import pipeline
from tests.support import ApiClient

GPT2: dict[str, Any] = {  # gpt-2's graph analysis has 101 layers
    "model": "gpt-2",
    "mode": "inference",
    "batch_size": 1,
    "sequence_length": 128,
    "precision": "bf16",
}


def test_runs_over_the_layer_bound_are_not_cached(
    client: ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline._CACHE.clear()
    monkeypatch.setattr(pipeline, "CACHED_RUN_MAX_LAYERS", 100)
    assert client.post("/v1/estimates/memory", json=GPT2).status_code == 200
    assert len(pipeline._CACHE) == 0
    monkeypatch.setattr(pipeline, "CACHED_RUN_MAX_LAYERS", 101)  # at the bound: kept
    assert client.post("/v1/estimates/memory", json=GPT2).status_code == 200
    assert len(pipeline._CACHE) == 1
