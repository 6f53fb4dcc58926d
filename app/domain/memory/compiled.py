"""``torch.compile`` (TorchInductor, mode "default") as a rule over what a layer keeps for
backward and what it allocates only inside its forward.

Under ``torch.compile`` AOTAutograd traces the forward and backward into one joint graph and
Inductor's partitioner, ``min_cut_rematerialization_partition`` (PyTorch 2.x
torch/_functorch/partitioners.py, with torch/_functorch/config.py's defaults
``ban_recompute_not_in_allowlist``, ``ban_recompute_materialized_backward`` and
``ban_recompute_reductions`` all True), chooses the tensors the forward hands to the backward
as a minimum cut: whatever it does not save, the backward recomputes. What it may recompute:

* pointwise ops (``pointwise_ops()``: every aten op tagged ``torch.Tag.pointwise``), dtype
  conversions (``prims.convert_element_type``, ``aten._to_copy``) and views;
* never a compute-intensive op (``compute_intensive_ops``: mm, bmm, addmm, convolution, the
  flash / memory-efficient SDPA kernels): their outputs are saved when the backward needs them;
* never a random op (``random_ops = [aten.native_dropout, aten.rand_like, aten.randn_like]``):
  a dropout mask is saved as in eager mode (1 byte per element on CUDA);
* never a reduction whose output is over 4 times smaller than its input
  (``ban_recompute_reductions``): a norm's per-row statistic is saved;
* never a tensor that a backward op which cannot be fused reads (``is_materialized_backwards``
  with ``ban_recompute_materialized_backward``): the input of a matmul, which its weight
  gradient reads, is saved.

So what a layer keeps under compile is what eager mode keeps minus the outputs of pointwise
chains between matmuls that only pointwise backward ops read. On this service's graph ops:

* ``mlp``, gated (SwiGLU / GeGLU): eager keeps gate, act(gate), up and act(gate) x up; compile
  keeps gate and up (matmul outputs) and the product (the down projection's weight gradient
  reads it); act(gate) is recomputed from gate: :func:`mlp_kept`;
* ``mlp`` with a composite activation (Hugging Face ``gelu_new``: pow / mul / add / tanh): the
  chain's intermediates are recomputed from the pre-activation; the pre-activation and the
  activation (read by the down projection's weight gradient) stay: :func:`mlp_kept`;
* ``rmsnorm`` (Hugging Face Llama's, computed in fp32): eager keeps an fp32 copy of the input
  and the normalized tensor; compile keeps the input itself (the 16-bit tensor the fp32 copy
  is recomputed from) and the fp32 per-row statistic: :func:`rmsnorm_kept`.

Every other op keeps what eager mode keeps: layer norm (input, mean, rstd), dropout (mask),
attention (its projections, output and log-sum-exp; eager attention's S x S tensors), linear
and convolution inputs, standalone activations (whose input is a matmul output the backward
needs anyway). Approximations, stated: the cut is taken per layer, on the layer's own tensors;
the partitioner's heuristics across layers (``ban_recompute_used_far_apart``, long fusible
chains, ``max_dist_from_bw``) and an attention pattern Inductor may rewrite into SDPA
(torch/_inductor/fx_passes/fuse_attention.py) are not modelled, nor CUDA graphs (modes
"reduce-overhead" and "max-autotune" keep a private memory pool).

Transients: fused kernels never materialise the intermediates of a pointwise chain. The one such
intermediate the estimate charges is Hugging Face's fp32 upcast of the logits before its
cross-entropy (``logits.float()``), which Inductor fuses into the log-softmax reduction
(its generated kernels read the 16-bit logits: "Original ATen: [aten._log_softmax,
aten._to_copy]"): :func:`loss_upcast_bytes`.
"""

from __future__ import annotations

from app.domain.graph.ops import Saved

COMPILE_SOURCE = (
    "PyTorch torch/_functorch/partitioners.py min_cut_rematerialization_partition (pointwise "
    "ops recomputed; matmul, SDPA, random ops and row reductions saved)"
)

# What Inductor recomputes of a feed-forward network (see the module docstring): the
# activation of a gated MLP's gate, and a composite activation's intermediates.
_MLP_RECOMPUTED_PREFIXES = ("activated_gate", "activation_part")


def mlp_kept(saved: tuple[Saved, ...]) -> tuple[Saved, ...]:
    """An ``mlp`` layer's kept tensors under compile: eager's minus act(gate) (gated) and a
    composite activation's intermediates, recomputed in backward from the matmul outputs.
    Under autocast eager keeps no 16-bit pre-activation (``gelu_new``'s ``pow`` keeps its fp32
    cast instead); the partitioner saves the up projection's 16-bit output to recompute from."""
    kept = tuple(item for item in saved if not item.label.startswith(_MLP_RECOMPUTED_PREFIXES))
    parts = [item for item in saved if item.label.startswith("activation_part")]
    if parts and not any(item.label == "pre_activation" for item in kept):
        kept += (Saved(label="pre_activation", source="new", numel=parts[0].numel),)
    return kept


def rmsnorm_kept(saved: tuple[Saved, ...]) -> tuple[Saved, ...]:
    """An ``rmsnorm`` layer's kept tensors under compile: its input in its own dtype (instead
    of eager's fp32 copy) and the fp32 per-row statistic; the normalized tensor (pointwise of
    the input and the statistic) is recomputed."""
    kept: list[Saved] = []
    for item in saved:
        if item.source == "in0_fp32":
            kept.append(Saved(label="input", source="in0", numel=item.numel))
        elif item.label != "normalized":
            kept.append(item)
    return tuple(kept)


def compiled_kept(op: str, saved: tuple[Saved, ...]) -> tuple[Saved, ...]:
    """What a layer of ``op`` keeps for backward under ``torch.compile`` (``saved``: what it
    keeps in eager mode)."""
    if op == "mlp":
        return mlp_kept(saved)
    if op == "rmsnorm":
        return rmsnorm_kept(saved)
    return saved


def loss_upcast_bytes(rows: int, vocab: int, *, upcast: bool, compiled: bool) -> int:
    """The fp32 copy of the logits Hugging Face's ``ForCausalLMLoss`` makes before its
    cross-entropy (``logits = logits.float()``, transformers 4.46+ src/transformers/
    loss/loss_utils.py) [B].

    Parameters
    ----------
    rows : int
        Token positions the loss reads [tokens].
    vocab : int
        Logits per position [classes].
    upcast : bool
        The logits are 16-bit (``Tensor.float()`` of an fp32 tensor returns it: no copy).
    compiled : bool
        The loss runs under ``torch.compile``: the upcast is fused into the log-softmax kernel.

    Notes
    -----
    ``rows x vocab x 4`` when ``upcast`` and not ``compiled``, else 0.
    """
    if not upcast or compiled:
        return 0
    return rows * vocab * 4


__all__ = [
    "COMPILE_SOURCE",
    "compiled_kept",
    "loss_upcast_bytes",
    "mlp_kept",
    "rmsnorm_kept",
]
