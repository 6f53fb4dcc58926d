"""The key/value cache a decoder returns with its output in training (``use_cache``), as the
previous step's ``outputs`` holds it through the next forward (``keep_outputs``).

transformers returns ``past_key_values`` from a causal LM's forward whenever ``use_cache`` is
on (pythia's and most decoders' config.json), gradient checkpointing aside. Each attention
layer returns its ``present = (key, value)``: by default one K and one V over the batch's tokens
in the activations' dtype, split like the KV cache (tensor and pipeline parallelism). A layer
whose op declares ``returned_cache`` (:class:`app.domain.graph.ops.core.OpResult`) keeps other
storages instead: GPT-NeoX as transformers wrote it in mid-2024 returns its fp32 rotated key
and a value that views the fused q/k/v output, so the whole fused storage stays alive
(``modeling_gpt_neox.py`` ``_attn_projections_and_rope``: ``present = (key, value)`` after
``key = torch.cat((key, key_pass), dim=-1)`` with fp32 cos/sin caches, ``value = qkv[...,
2 * head_size:].permute(0, 2, 1, 3)``). Measured against Hugging Face's published pythia-410m
SDPA training peaks (cluster B of ``cuda_published_calibration.yaml``, the loop holds
``outputs``): the estimate was low by 148,270 B a token; these two storages add
6 B x hidden x layers = 147,456 B a token for pythia-410m (hidden 1,024, 24 layers).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from app.domain.graph.analysis import GraphAnalysis
from app.domain.graph.ops.core import OpResult
from app.domain.memory.formulas import Sizer, kv_cache_bytes


@dataclass(frozen=True, slots=True)
class ReturnedCache:
    """The returned cache's tensors [B] (one per K / V storage) and its arithmetic."""

    tensors: list[int]
    words: str


def returned_cache(
    analysis: GraphAnalysis, sizer: Sizer, numel: int, element: int, layers: int, shard: int
) -> ReturnedCache:
    """The cache the model returns: ``numel`` K and V elements over ``layers`` attention layers
    at ``element`` B (the KV cache's dtype), split over ``shard`` ranks; a layer declaring
    ``returned_cache`` counts its storages instead, at their own dtypes."""
    declared: Counter[int] = Counter()
    by_id: dict[int, OpResult] = {}
    for layer in analysis.layers:
        if layer.result.kv_cache_numel and layer.result.returned_cache:
            declared[id(layer.result)] += 1
            by_id[id(layer.result)] = layer.result
    tensors: list[int] = []
    terms: list[str] = []
    for result_id, count in declared.items():
        result = by_id[result_id]
        numel -= count * result.kv_cache_numel
        layers -= count
        for saved in result.returned_cache:
            size = sizer.storage_bytes(1, saved.storage)
            tensors += [kv_cache_bytes(saved.numel, size, shard)] * count
            terms.append(
                f"{count} [layers] x ceil({saved.numel:,} [elements: {saved.label}] x {size} "
                f"[B: {saved.storage.value}] / {shard} [tensor x pipeline])"
            )
    if layers:
        cache = kv_cache_bytes(numel, element, shard)
        count = 2 * layers  # a K and a V per layer
        tensors += [cache // count] * (count - 1) + [cache - cache // count * (count - 1)]
        terms.append(
            f"ceil({numel:,} [elements: its returned key/value cache, 2 x layers x kv_heads x "
            f"head_dim x tokens] x {element} [B] / {shard} [tensor x pipeline])"
        )
    return ReturnedCache(tensors, " + ".join(terms))
