"""The engine service's profile forward: the graph's peak, the formula only as a named fallback."""

from __future__ import annotations

import json

from app.config import PROJECT_ROOT
from app.domain.engines.vllm import (
    H100_80GB_CUDA_VISIBLE_BYTES,
    VllmOptions,
    forward_peak_bytes,
    resolve_options,
)
from app.importers.hf_config import import_hf_config
from app.services.engines import ServedGraph, hf_serving_model, profile_forward

CONFIG = json.loads((PROJECT_ROOT / "tests/fixtures/hf_configs/llama-3-8b.json").read_text())


def test_without_a_graph_the_formula_is_used_and_says_why() -> None:
    _, model, _ = hf_serving_model(CONFIG)
    resolved = resolve_options(VllmOptions(), model, H100_80GB_CUDA_VISIBLE_BYTES)
    forward = profile_forward(model, resolved, None)
    assert forward.source == "formula"
    assert forward.fallback_reason == "no graph"
    assert forward.graph_peak_bytes is None
    assert forward.forward_peak_bytes == forward_peak_bytes(model, 8192, 1, 2)
    assert forward.formula.endswith(f"= {forward.forward_peak_bytes:,} B")


def test_a_graph_that_cannot_be_laid_out_falls_back_with_its_reason() -> None:
    _, model, _ = hf_serving_model(CONFIG)
    resolved = resolve_options(VllmOptions(), model, H100_80GB_CUDA_VISIBLE_BYTES)
    imported = import_hf_config(CONFIG)
    no_tokens = ServedGraph((), imported.layers, imported.default_bindings)
    forward = profile_forward(model, resolved, no_tokens)
    assert forward.source == "formula"
    assert forward.fallback_reason is not None
    assert "found 0" in forward.fallback_reason
    graph = ServedGraph(imported.inputs, imported.layers, imported.default_bindings)
    from_graph = profile_forward(model, resolved, graph)
    assert from_graph.source == "graph"
    assert from_graph.formula.endswith(f"= {from_graph.forward_peak_bytes:,} B")
