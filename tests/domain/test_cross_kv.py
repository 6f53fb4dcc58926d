"""An encoder-decoder's KV cache holds each decoder layer's cross-attention keys and values
(app.domain.memory.cross_kv): golden bytes on T5-small and Flan-T5-base, evaluable formulas."""

from __future__ import annotations

import json

import pytest

from app.config import PROJECT_ROOT
from app.domain.memory.cross_kv import cross_attention_kv_numel
from app.domain.memory.estimate import MemoryEstimate, MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import Mode, Parallelism
from app.importers.hf_config import import_hf_config
from tests.domain.test_formulas import evaluate

HF_CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs"


def _estimate(slug: str, request: MemoryRequest, *, batch: int, seq: int) -> MemoryEstimate:
    graph = import_hf_config(json.loads((HF_CONFIGS / f"{slug}.json").read_text()))
    bindings = {**graph.default_bindings, "batch": batch, "seq": seq}
    return estimate_memory(analyze_for(graph.inputs, graph.layers, bindings, request), request)


def _kv(slug: str, request: MemoryRequest, *, batch: int, seq: int) -> tuple[int, str]:
    lines = {line.key: line for line in _estimate(slug, request, batch=batch, seq=seq).lines}
    return lines["kv_cache"].bytes, lines["kv_cache"].formula


@pytest.mark.parametrize(
    ("slug", "layers", "heads", "d_kv"),
    [("t5-small", 6, 8, 64), ("flan-t5-base", 12, 12, 64)],
)
def test_t5_caches_cross_attention_keys_and_values(
    slug: str, layers: int, heads: int, d_kv: int
) -> None:
    request = MemoryRequest(mode=Mode.INFERENCE, precision=Precision.BF16)
    batch, seq = 2, 512
    kv, formula = _kv(slug, request, batch=batch, seq=seq)
    # the decoder's causal self-attention (the encoder's caches nothing) and, per decoder
    # layer, EncDecAttention's k and v of the encoder's 512 tokens: 2 B each (bf16)
    self_attention = 2 * layers * heads * d_kv * seq * batch
    cross = 2 * layers * batch * seq * heads * d_kv
    assert kv == (self_attention + cross) * 2
    value, stated = evaluate(formula)
    assert value == stated == kv
    assert "cross-attention" in formula


def test_t5_small_golden_bytes() -> None:
    request = MemoryRequest(mode=Mode.INFERENCE, precision=Precision.BF16)
    kv, _ = _kv("t5-small", request, batch=1, seq=512)
    # 6 layers x 2 x 8 heads x 64 x 512 tokens = 3,145,728 elements x 2 B = 6,291,456 B for
    # the self-attention, as many for the cross-attention (the previous figure: the first)
    assert kv == 12_582_912 == 2 * 3_145_728 * 2


def test_cross_kv_is_the_encoder_length_output_of_k_and_v() -> None:
    graph = import_hf_config(json.loads((HF_CONFIGS / "t5-small.json").read_text()))
    request = MemoryRequest(mode=Mode.INFERENCE)
    bindings = {**graph.default_bindings, "batch": 3, "seq": 100}
    analysis = analyze_for(graph.inputs, graph.layers, bindings, request)
    assert cross_attention_kv_numel(analysis) == 6 * 2 * 3 * 100 * 512
    encoder_only = import_hf_config(json.loads((HF_CONFIGS / "t5-small-encoder.json").read_text()))
    analysis = analyze_for(encoder_only.inputs, encoder_only.layers, bindings, request)
    assert cross_attention_kv_numel(analysis) == 0


def test_sharded_cross_kv_keeps_an_evaluable_formula() -> None:
    request = MemoryRequest(
        mode=Mode.INFERENCE, precision=Precision.BF16, parallelism=Parallelism(tensor=2)
    )
    kv, formula = _kv("t5-small", request, batch=1, seq=512)
    value, stated = evaluate(formula)
    assert value == stated == kv
    # 8 heads over 2 GPUs: each caches half of the self- and of the cross-attention
    assert kv == 12_582_912 // 2


def test_kv_cache_false_caches_nothing() -> None:
    request = MemoryRequest(mode=Mode.INFERENCE, precision=Precision.BF16, kv_cache=False)
    lines = {line.key for line in _estimate("t5-small", request, batch=1, seq=64).lines}
    assert "kv_cache" not in lines
