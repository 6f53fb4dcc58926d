"""What autograd keeps for backward when the base model is frozen (LoRA / QLoRA training):
the storage plan's rules for layers whose weights need no gradient.

Three rules of PyTorch's autograd, each checked on the CPU against ``saved_tensors_hooks`` /
the graph's saved tensors (benchmarks/peft_params/frozen_saved.py, frozen_results.md):

1. **A tensor kept only for a weight's gradient is not kept when the weight is frozen.** The
   autograd code generator saves an input of a derivative formula only when an input whose
   formula reads it needs a gradient: ``tools/autograd/gen_variable_type.py`` ``guard_for``
   guards a saved variable used by a single derivative with
   ``grad_fn->should_compute_output(i)``; ``mm`` / ``addmm`` (``derivatives.yaml``:
   ``mat2: mm_mat2_backward(grad, self, ...)``, ``self`` read by ``mat2``'s formula only)
   keep a Linear's input only for its weight's gradient, and ``mul`` keeps each operand only
   for the other's (``self: mul_tensor_backward(grad, other, ...)``, ``other:
   mul_tensor_backward(grad, self, ...)``): RMSNorm's ``weight * hidden.to(dtype)`` keeps the
   normalized hidden states only for the weight, ``embedding`` its indices only for its
   table. Per op: :data:`WEIGHT_GRAD_LABELS`. LayerNorm (``native_layer_norm``: one formula
   for input, weight and bias), softmax, GELU and SDPA keep theirs whenever any input needs a
   gradient.
2. **Layers before the first trainable tensor keep nothing**: their inputs need no gradient
   (the embedding is frozen), so no derivative is computed for them and nothing is saved
   (``compute_requires_grad`` false: the codegen skips the ``grad_fn`` entirely).
3. **Under autocast a frozen weight is cast at every use, and the cast is kept**: autocast's
   cast cache only holds leaf tensors that require grad (``aten/src/ATen/autocast_mode.cpp``
   ``cached_cast``: ``arg.requires_grad() && arg.is_leaf() && !arg.is_view()``), so each
   frozen Linear weight is cast to 16 bits in the forward and ``mm`` keeps that cast
   (``mat2``) for its input's gradient until the layer's backward, when that input needs a
   gradient (a trainable weight's cast is the cache's, counted once in
   ``weight_cast_cache``).

A LoRA adapter keeps its own input (``lora_A``'s ``mm`` keeps ``mat1`` for its trainable
weight): with an fp32 base, no autocast and no dropout that is the base layer's input itself,
so the frozen layer's input stays kept (:attr:`FrozenBase.kept`); otherwise the adapter keeps
a copy, counted by :func:`app.domain.memory.moments._lora_saved`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from app.domain.graph.analysis import LayerAnalysis
from app.domain.memory.formulas import (
    PrecisionPlan,
    StepTemporaries,
    TemporariesLayout,
    gradient_bytes,
    optimizer_state_bytes,
    optimizer_step_temporaries,
)
from app.domain.memory.request import MemoryRequest
from app.domain.peft import LoraModule, LoraPlan, linear_modules

# Per op, the saved tensors (app.domain.graph.ops labels) kept only for the gradient of the
# op's weights: a Linear's input (``mm`` / ``addmm``'s ``mat1``), the attention's block input
# (q / k / v projections) and context (o projection), the MLP's input (up / gate) and the down
# projection's input (the gated product, the activation's output: GELU / SiLU keep their own
# input, ``pre_activation`` / ``gate``), RMSNorm's normalized hidden states (the weight's
# ``mul``), an embedding's indices.
# Of those, the inputs of Linear layers (``F.linear``), as opposed to RMSNorm's and embeddings'
_LINEAR_INPUT_LABELS = frozenset({"input", "context", "product", "activated"})
WEIGHT_GRAD_LABELS: Mapping[str, frozenset[str]] = {
    "linear": frozenset({"input"}),
    "attention": frozenset({"input", "context"}),
    "mlp": frozenset({"input", "product", "activated"}),
    "rmsnorm": frozenset({"normalized"}),
    "embedding": frozenset({"indices"}),
}
# Ops whose weight matrices run as a Linear's ``mm`` (cast at each use under autocast)
_LINEAR_OPS = frozenset({"linear", "attention", "mlp"})


@dataclass(frozen=True, slots=True)
class FrozenBase:
    """The storage plan's view of a frozen base.

    ``first_trainable``: the first layer with a trainable tensor (adapters, trainable biases,
    modules_to_save copies); the layers before it keep nothing. ``trainable``: layers whose
    weights train (modules_to_save): they keep what full training keeps. ``kept``: per layer,
    the weight-gradient tensors an adapter keeps as they are (its input, uncopied).
    ``cast_numel``: per layer, the elements of frozen weight matrices cast to 16 bits and kept
    under autocast (rule 3; empty without autocast).
    """

    first_trainable: int
    trainable: frozenset[int]
    kept: Mapping[int, frozenset[str]]
    cast_numel: Mapping[int, int]

    def variant(self, index: int) -> tuple[object, ...] | None:
        """What distinguishes layer ``index``'s storage sizes from an unfrozen layer's: None
        when it keeps what full training keeps."""
        if index < self.first_trainable:
            return ("nothing",)
        if index in self.trainable:
            return None
        return ("frozen", self.kept.get(index, frozenset()), self.cast_numel.get(index, 0))


def adapter_input_label(module: LoraModule, modules_of_layer: Sequence[LoraModule]) -> str:
    """The saved tensor of its layer that an adapted module reads: the attention's and the
    MLP's output projection (the layer's last module) read ``context`` / the down input,
    every other module the layer's input."""
    last = modules_of_layer[-1].name == module.name and len(modules_of_layer) > 1
    if module.kind == "attention" and last:
        return "context"
    if module.kind == "mlp" and last:
        return "down_input"
    return "input"


def frozen_base(
    layers: Sequence[LayerAnalysis],
    lora: LoraPlan,
    *,
    adapter_shares_input: bool,
    cast_bytes: int,
    cast_layers: frozenset[int] | None = None,
    linear_keeps_input: bool = False,
) -> FrozenBase:
    """The frozen base of ``lora`` on ``layers``.

    Parameters
    ----------
    adapter_shares_input : bool
        Whether lora_A keeps the base layer's input itself (fp32 base, no autocast, no
        dropout) rather than a copy.
    cast_bytes : int
        Bytes per element of autocast's 16-bit weight casts; 0 without autocast.
    cast_layers : frozenset of int, optional
        The layers whose frozen weights autocast casts (None: every Linear-like layer; a
        4-bit base: only those kept unquantized).
    linear_keeps_input : bool
        Whether every Linear keeps its input whatever needs a gradient: DeepSpeed ZeRO-3's
        ``LinearFunctionForZeroStage3`` (``deepspeed/runtime/zero/linear.py``:
        ``ctx.save_for_backward(input, weight, bias)``), which ``zero.Init`` installs as
        ``torch.nn.functional.linear`` ("This will persist unless manually reset",
        ``partition_parameters.py``; transformers' ``from_pretrained`` builds a model under
        ``zero.Init`` when ZeRO-3 is on). Rule 1 then holds for RMSNorm and embeddings only.
    """
    trainable = set(lora.saved_layers)
    starts = [m.layer for m in lora.modules] + list(trainable) + list(lora.bias_layers)
    first = min(starts, default=len(layers))
    by_layer: dict[int, list[LoraModule]] = {}
    for module in _all_modules(layers, lora):
        by_layer.setdefault(module.layer, []).append(module)
    kept: dict[int, frozenset[str]] = {}
    if adapter_shares_input:
        for module in lora.modules:
            if module.embedding or module.experts:
                continue
            label = adapter_input_label(module, by_layer.get(module.layer, [module]))
            labels = {"product", "activated"} if label == "down_input" else {label}
            kept[module.layer] = kept.get(module.layer, frozenset()) | labels
    if linear_keeps_input:
        for index, layer in enumerate(layers):
            inputs = WEIGHT_GRAD_LABELS.get(layer.op, frozenset()) & _LINEAR_INPUT_LABELS
            if index >= first and index not in trainable and inputs:
                kept[index] = kept.get(index, frozenset()) | inputs
    casts: dict[int, int] = {}
    if cast_bytes:
        for index, layer in enumerate(layers):
            if index < first or index in trainable or layer.op not in _LINEAR_OPS:
                continue
            if cast_layers is not None and index not in cast_layers:
                continue
            # the first trainable layer's input needs no gradient: only the projection after
            # its adapters (attention's o, the MLP's down) reads a tensor that does
            numel = _output_matrix_numel(layer) if index == first else frozen_matrix_numel(layer)
            if numel:
                casts[index] = numel
    return FrozenBase(
        first_trainable=first, trainable=frozenset(trainable), kept=kept, cast_numel=casts
    )


def _all_modules(layers: Sequence[LayerAnalysis], lora: LoraPlan) -> list[LoraModule]:
    """Every Linear module of the adapted layers, in order (which one is a layer's last)."""
    adapted = {m.layer for m in lora.modules}
    return [m for m in linear_modules(layers) if m.layer in adapted]


def _output_matrix_numel(layer: LayerAnalysis) -> int:
    """Elements of a composite layer's last weight matrix (attention's o projection, the
    MLP's down projection); 0 for a single Linear."""
    if layer.op == "linear":
        return 0
    matrices = [math.prod(s) for s in layer.result.param_shapes if len(s) == 2]
    return matrices[-1] if matrices else 0


def frozen_matrix_numel(layer: LayerAnalysis) -> int:
    """Elements of the weight matrices a Linear-like layer multiplies by (a tied output
    head's borrowed table included: in x out from its FLOPs)."""
    matrices = sum(math.prod(s) for s in layer.result.param_shapes if len(s) == 2)
    if layer.op == "linear" and not matrices:  # tied: the weight is another layer's
        rows = math.prod(layer.output_shape[:-1]) if layer.output_shape else 1
        out = layer.output_shape[-1] if layer.output_shape else 0
        return layer.flops // (2 * rows) if rows and out else 0
    return matrices


@dataclass(frozen=True, slots=True)
class TrainableLines:
    """The gradients, optimizer state and step temporaries of LoRA's trainable tensors
    (unsharded but the gradients), with modules_to_save copies at the base's dtype."""

    grad_bytes: int
    grad_words: str
    state_bytes: int
    state_note: str
    temporaries: StepTemporaries


def trainable_lines(
    lora: LoraPlan,
    request: MemoryRequest,
    adapter_plan: PrecisionPlan,
    base_plan: PrecisionPlan,
    grad_shard: int,
) -> TrainableLines:
    """Adapters (and DoRA magnitudes, trainable biases) train in fp32 (``adapter_plan``); the
    trainable copies of ``modules_to_save`` keep the base module's dtype (PEFT
    ``ModulesToSaveWrapper``: ``copy.deepcopy(module)``), so their gradients are
    ``base_plan.grad`` bytes and their optimizer state the base precision's slots (torch's
    optimizers create state ``zeros_like(param)``). The step's temporaries are the sum of both
    groups' (one foreach list each), the larger of the two for a for-loop step."""
    copy_shapes = [shape for shapes in lora.saved_shapes for shape in shapes]
    adapter_shapes = list(lora.adapter_shapes[: len(lora.adapter_shapes) - len(copy_shapes)])
    copies = lora.saved_params
    adapters = lora.trainable_params - copies
    copy_plan = replace(base_plan, master=0)
    grads = gradient_bytes(adapters, adapter_plan.grad, grad_shard)
    grads += gradient_bytes(copies, copy_plan.grad, grad_shard)
    words = (
        f"ceil({adapters:,} [adapter params] x {adapter_plan.grad} [B] / {grad_shard} [shard]) + "
        f"ceil({copies:,} [params of the modules_to_save copies] x {copy_plan.grad} [B, the "
        f"base's dtype] / {grad_shard} [shard])"
    )
    state_a, note_a = optimizer_state_bytes(
        adapter_shapes, adapters, request.optimizer, adapter_plan
    )
    state_c, note_c = optimizer_state_bytes(copy_shapes, copies, request.optimizer, copy_plan)
    temp_a = optimizer_step_temporaries(adapter_shapes, adapters, request, adapter_plan)
    temp_c = optimizer_step_temporaries(copy_shapes, copies, request, copy_plan)
    if temp_a.layout is TemporariesLayout.LARGEST_TWICE:
        temp_bytes = max(temp_a.bytes, temp_c.bytes)
    else:
        temp_bytes = temp_a.bytes + temp_c.bytes
    temporaries = StepTemporaries(
        temp_bytes, temp_a.layout, f"adapters: {temp_a.note}; modules_to_save copies: {temp_c.note}"
    )
    return TrainableLines(
        grad_bytes=grads,
        grad_words=words,
        state_bytes=state_a + state_c,
        state_note=f"adapters: {note_a}; modules_to_save copies: {note_c}",
        temporaries=temporaries,
    )
