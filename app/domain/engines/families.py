"""Per-layer weights of the served decoder families beyond the Llama shape, as vLLM shards them.

* multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; vLLM 0.19
  ``vllm/model_executor/models/deepseek_v2.py`` ``DeepseekV2MLAAttention``): ``q_proj``
  (``q_lora_rank`` null) or ``q_a_proj`` + ``q_a_layernorm`` + ``q_b_proj``; ``kv_a_proj_with_mqa``
  and ``kv_a_layernorm``; ``kv_b_proj``; ``o_proj``. ``q_a_proj`` and ``kv_a_proj_with_mqa`` are
  ``ReplicatedLinear`` (whole on every tensor rank), ``q_proj`` / ``q_b_proj`` / ``kv_b_proj``
  column-parallel and ``o_proj`` row-parallel (split over TP), the norms replicated.
* DeepSeek MoE (``DeepseekV2MoE``): the routed experts split over TP (``FusedMoE``), the router
  ``gate`` replicated (``ReplicatedLinear``), the shared experts one ``DeepseekV2MLP`` of
  ``n_shared_experts x moe_intermediate_size`` split over TP; the first
  ``first_k_dense_replace`` layers a dense MLP of ``intermediate_size`` split over TP. The same
  terms serve Qwen2-MoE's shared expert (its one-output gate replicated) and Llama-4's.

Pure stdlib; parameters are element counts on one tensor rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.domain.parallel import kv_heads_per_rank

if TYPE_CHECKING:
    from app.domain.engines.vllm import ServingModel


@dataclass(frozen=True)
class MlaGeometry:
    """Multi-head latent attention sizes, with the HF config's names."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    @property
    def latent_dim(self) -> int:
        """What the KV cache holds a token and layer: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def mla_attention_params(mla: MlaGeometry, heads: int, hidden: int, tp: int) -> int:
    """One MLA layer's attention weights (norms included) on one tensor rank."""
    q_out = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) // tp
    if mla.q_lora_rank is None:
        params = hidden * q_out
    else:
        params = hidden * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * q_out
    params += hidden * mla.latent_dim + mla.kv_lora_rank
    params += mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim) // tp
    return params + heads * mla.v_head_dim * hidden // tp


def decoder_layers_params(model: ServingModel, tp: int, llama_layer: int) -> tuple[int, ...]:
    """Parameters of each decoder layer on one tensor rank, first to last.

    ``llama_layer`` is the caller's count for a Llama-style layer (GQA attention, gated MLP or
    Mixtral MoE, norms); it is every layer's count unless the model has MLA, a shared expert or
    dense layers among its MoE layers, whose terms this function puts in its place.
    """
    special = model.mla is not None or model.shared_expert_intermediate_size or model.dense_layers
    if not special:
        return (llama_layer,) * model.layers
    h = model.hidden_size
    if model.mla is None:
        q_dim = model.attention_heads * model.head_dim
        kv_dim = kv_heads_per_rank(model.kv_heads, tp) * model.head_dim
        attn = h * q_dim // tp * 2 + 2 * h * kv_dim
        if model.qkv_bias:
            attn += q_dim // tp + 2 * kv_dim
    else:
        attn = mla_attention_params(model.mla, model.attention_heads, h, tp)
    norms = model.norms_per_layer * h
    shared = model.shared_expert_intermediate_size
    moe = model.experts * 3 * h * model.intermediate_size // tp + h * model.experts
    if shared:
        moe += 3 * h * shared // tp + (h if model.shared_expert_gate else 0)
    dense_inner = model.dense_intermediate_size or model.intermediate_size
    dense = 3 * h * dense_inner // tp
    dense_at = frozenset(model.dense_layers)
    return tuple(attn + norms + (dense if i in dense_at else moe) for i in range(model.layers))
