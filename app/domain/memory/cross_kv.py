"""The cross-attention part of an encoder-decoder's KV cache.

transformers' ``models/t5/modeling_t5.py`` ``T5Attention.forward`` (``is_cross_attention``):
with a cache (``EncoderDecoderCache``, what ``generate`` passes) each decoder layer's
``EncDecAttention`` projects the encoder output to keys and values once, ``k(hidden)`` and
``v(hidden)`` of shape ``[batch, n_heads, encoder length, d_kv]``, and stores them in
``past_key_values.cross_attention_cache``; every later step reads them from there
(``is_updated``), so they live as long as the self-attention's cache: ``2 x decoder layers x
batch x encoder length x n_heads x d_kv`` elements beside it. The graph writes cross-attention
out as ops (:mod:`app.importers.hf_t5`), so the elements are the outputs of the decoder
blocks' ``EncDecAttention.k`` and ``EncDecAttention.v`` Linear layers, whose rows are the
encoder's tokens (the input's length, whatever the decoder's). Standard library only.
"""

from __future__ import annotations

from app.domain.graph.analysis import GraphAnalysis

__all__ = ["CROSS_KV_LAYERS", "cross_attention_kv_numel"]

CROSS_KV_LAYERS = ("EncDecAttention.k", "EncDecAttention.v")  # app/importers/hf_t5.py


def cross_attention_kv_numel(analysis: GraphAnalysis) -> int:
    """Cached cross-attention keys and values of every decoder layer [elements]: the output
    elements of each ``EncDecAttention.k`` / ``.v`` Linear (batch x encoder length x n_heads x
    d_kv each); 0 without cross-attention."""
    return sum(
        layer.output_numel
        for layer in analysis.layers
        if layer.op == "linear" and layer.name.endswith(CROSS_KV_LAYERS)
    )
