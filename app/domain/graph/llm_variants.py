"""Shapes of the attention and mixture-of-experts variants of served LLMs, for the graph ops.

* multi-head latent attention (MLA; DeepSeek-V2 section 2.1, transformers'
  ``DeepseekV2Attention`` / ``DeepseekV3Attention``): q through ``q_a_proj`` -> ``q_a_layernorm``
  -> ``q_b_proj`` (``q_lora_rank``) or one ``q_proj``; ``kv_a_proj_with_mqa`` to
  ``kv_lora_rank + qk_rope_head_dim``, ``kv_a_layernorm`` on the ``kv_lora_rank`` part,
  ``kv_b_proj`` to heads x ``(qk_nope_head_dim + v_head_dim)``; ``o_proj`` from heads x
  ``v_head_dim``. ``attention_bias`` puts biases on ``q_a_proj``, ``kv_a_proj_with_mqa`` and
  ``o_proj``. A serving engine caches the latent (``kv_lora_rank + qk_rope_head_dim`` values a
  token and layer, vLLM's ``MLAAttentionSpec``), not per-head keys and values.
* sliding-window attention: a causal query attends to the last ``window`` keys (itself
  included), and the KV cache keeps at most ``window`` tokens a sequence.
* MoE extras: a shared expert every token goes through (DeepSeek, Qwen2-MoE, Llama-4), its
  one-output gate (Qwen2-MoE ``shared_expert_gate``), a biased router (gpt-oss).

Pure functions of integers; :mod:`app.domain.graph.ops` calls them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Shape = tuple[int, ...]

MLA_KEYS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True, slots=True)
class Mla:
    """The geometry of one multi-head latent attention layer."""

    heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        """Query/key width a head: the no-RoPE part and the RoPE part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values a token and layer that the serving KV cache holds."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def mla_of(attrs: Mapping[str, Any], heads: int) -> Mla | None:
    """The MLA geometry an ``attention`` layer declares (``kv_lora_rank`` present), else None.

    Raises
    ------
    KeyError
        ``kv_lora_rank`` is given without one of :data:`MLA_KEYS` (the key is the missing one).
    """
    if "kv_lora_rank" not in attrs:
        return None
    for key in MLA_KEYS:
        if key not in attrs:
            raise KeyError(key)
    return Mla(
        heads=heads,
        q_lora_rank=attrs.get("q_lora_rank"),
        kv_lora_rank=attrs["kv_lora_rank"],
        qk_nope_head_dim=attrs["qk_nope_head_dim"],
        qk_rope_head_dim=attrs["qk_rope_head_dim"],
        v_head_dim=attrs["v_head_dim"],
    )


def mla_param_shapes(mla: Mla, hidden: int, *, bias: bool, out_bias: bool) -> list[Shape]:
    """Weights, norm weights and biases of one MLA layer, as transformers 5.23 builds them.

    The projection to the query heads comes first (``q_proj`` or ``q_b_proj``): the speed model
    reads the first matrix's rows as the attention's query width."""
    q_out = mla.heads * mla.qk_head_dim
    shapes: list[Shape] = []
    if mla.q_lora_rank is None:
        shapes.append((q_out, hidden))  # q_proj (never biased)
    else:  # q_b_proj, q_a_proj, q_a_layernorm
        shapes += [(q_out, mla.q_lora_rank), (mla.q_lora_rank, hidden), (mla.q_lora_rank,)]
        if bias:
            shapes.append((mla.q_lora_rank,))
    shapes += [
        (mla.latent_dim, hidden),  # kv_a_proj_with_mqa
        (mla.kv_lora_rank,),  # kv_a_layernorm
        (mla.heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank),  # kv_b_proj
        (hidden, mla.heads * mla.v_head_dim),  # o_proj
    ]
    if bias:
        shapes.append((mla.latent_dim,))
    if out_bias:
        shapes.append((hidden,))
    return shapes


def attended_pairs(batch: int, heads: int, seq: int, *, causal: bool, window: int | None) -> int:
    """(query, key) pairs that get a score: all of them, the causal half with the diagonal, or
    with a window each query's last ``window`` keys."""
    if not causal:
        return batch * heads * seq * seq
    per_sequence = seq * (seq + 1) // 2
    if window is not None and seq > window:
        per_sequence = window * (window + 1) // 2 + (seq - window) * window
    return batch * heads * per_sequence


def cached_tokens(seq: int, window: int | None) -> int:
    """Tokens a sequence's KV cache holds after ``seq`` tokens: all of them, or the window."""
    return seq if window is None else min(seq, window)


def moe_extra_param_shapes(
    hidden: int, experts: int, attrs: Mapping[str, Any], *, gated: bool
) -> list[Shape]:
    """The router bias, the shared expert (bias-free, gated like the routed ones) and its gate."""
    shapes: list[Shape] = []
    if attrs.get("router_bias", False):
        shapes.append((experts,))
    shared = attrs.get("shared_intermediate_size")
    if shared is not None:
        shapes += [(shared, hidden)] * (2 if gated else 1) + [(hidden, shared)]
        if attrs.get("shared_expert_gate", False):
            shapes.append((1, hidden))
    return shapes
