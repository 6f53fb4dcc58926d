"""The memory lines of a QLoRA base and of DoRA adapters (LoRA's own lines are in
:mod:`app.domain.memory.moments`): the 4-bit base's weights, the per-layer transient of a
dequantized weight and of DoRA's weight norm, and what DoRA keeps for backward."""

from __future__ import annotations

import math
from dataclasses import replace

from app.domain.memory.context import Estimation
from app.domain.memory.liveness import checkpoint_unit
from app.domain.peft import LoraError, LoraModule, LoraPlan, linear_modules, module_naming
from app.domain.peft.qlora import (
    BNB_BLOCKSIZE,
    BNB_NESTED_BLOCKSIZE,
    QuantizedBase,
    dequant_transient_bytes,
    linear4bit_tensors,
    quantized_base,
)
from app.domain.workload import Mode


def qlora_weights(e: Estimation) -> None:
    """Replace the weights line by the 4-bit base's (:func:`app.domain.peft.qlora.
    quantized_base`): every Linear but the output head as bitsandbytes' Linear4bit stores it,
    every other parameter (embeddings, norms, biases, the head) at fp32 after
    prepare_model_for_kbit_training, else at the precision's weight bytes.

    Raises
    ------
    LoraError
        The request shards the model (tensor / pipeline parallel, ZeRO-3), which a
        bitsandbytes 4-bit base does not model here (field ``/parallelism``).
    """
    config = e.request.lora
    assert config is not None
    assert config.qlora is not None
    qlora = config.qlora
    par = e.request.parallelism
    if par.tensor > 1 or par.pipeline > 1 or par.zero_stage >= 3:
        raise LoraError(
            "qlora is estimated on an unsharded 4-bit base: tensor and pipeline degrees 1, "
            "ZeRO stage below 3 (data parallel replicas are fine)",
            "/parallelism",
        )
    if e.request.mode is not Mode.TRAINING:  # prepare_model_for_kbit_training: training only
        qlora = replace(qlora, prepare_kbit_training=False)
    base = quantized_base(
        e.analysis.layers, qlora, params=e.params, torch_dtype_bytes=int(e.plan.weight)
    )
    e.qlora = base
    e.weight_tensors = _base_tensors(e, base, qlora.double_quant)
    blocks = f"per {BNB_BLOCKSIZE}-element block"
    if qlora.double_quant:
        scales = (
            f"1 B uint8 absmax {blocks} + 4 B fp32 per {BNB_NESTED_BLOCKSIZE} blocks + 4 B "
            "offset + 1,024 B 8-bit code book (double quantization)"
        )
    else:
        scales = f"4 B fp32 absmax {blocks}"
    why = (
        "fp32: prepare_model_for_kbit_training casts them"
        if qlora.prepare_kbit_training
        else "the precision's weight dtype"
    )
    total = base.weights_bytes
    e.static["weights"] = total
    e.formulas["weights"] = (
        f"{base.quantized_bytes:,} [B: {len(base.modules):,} Linear4bit weights, "
        f"{base.quantized_params:,} elements: ceil(n / 2) packed uint8 + {scales} + 64 B "
        f"{qlora.quant_type.value} code book each] + {base.other_params:,} [params not "
        f"quantized: embeddings, norms, biases, output head] x {base.other_bytes_per_param} "
        f"[B: {why}]"
        + (
            f" + {base.fp32_params:,} [params of _keep_in_fp32_modules] x 4 [B fp32]"
            if base.fp32_params
            else ""
        )
        + f" = {total:,} B"
    )
    e.notes["weights"] = [
        f"QLoRA: a bitsandbytes 4-bit ({qlora.quant_type.value}) base; transformers' "
        "replace_with_bnb_linear quantizes every Linear except the output head "
        "(get_keys_to_not_convert) and llm_int8_skip_modules"
    ]


def _base_tensors(e: Estimation, base: QuantizedBase, double_quant: bool) -> list[list[int]]:
    """Per layer, the 4-bit base's tensors as the allocator sees them: each Linear4bit's
    (:func:`app.domain.peft.qlora.linear4bit_tensors`), the layer's other parameters at the
    unquantized bytes, its buffers."""
    per_param = base.other_bytes_per_param
    by_layer: dict[int, list[LoraModule]] = {}
    for module in base.modules:
        by_layer.setdefault(module.layer, []).append(module)
    keep = module_naming(e.analysis.layers).keep_in_fp32
    fp32_layers = {
        m.layer
        for m in linear_modules(e.analysis.layers)
        if any(m.name.endswith("." + k) for k in keep)
    }
    tensors: list[list[int]] = []
    for index, layer in enumerate(e.analysis.layers):
        modules = by_layer.get(index, [])
        sizes = [
            size
            for m in modules
            for size in linear4bit_tensors(m.in_features, m.out_features, double_quant=double_quant)
        ]
        quantized = sum(m.in_features * m.out_features for m in modules)
        matrices = sum(math.prod(s) for s in layer.result.param_shapes if len(s) == 2)
        for shape in layer.result.param_shapes:
            if len(shape) != 2 or not modules:
                sizes.append(math.prod(shape) * per_param)
        if modules and matrices > quantized:  # matrices kept unquantized in the layer
            kept = matrices - quantized  # _keep_in_fp32_modules (T5's wo) stay fp32
            sizes.append(kept * (4 if index in fp32_layers else per_param))
        if layer.result.buffers_bytes:
            sizes.append(layer.result.buffers_bytes)
        tensors.append(sizes)
    return tensors


def adapter_transient(e: Estimation, lora: LoraPlan) -> int:
    """The largest per-layer temporary of a 4-bit base or of DoRA adapters, live while one
    layer runs in forward or backward [B]:

    * a 4-bit base: the Linear4bit's weight dequantized to bnb_4bit_compute_dtype
      (bitsandbytes/autograd/_functions.py ``MatMul4Bit``: ``dequantize_4bit(B).to(A.dtype)``
      in forward and again for grad_A in backward), the widest such layer's;
    * DoRA (src/peft/tuners/lora/dora.py ``DoraLinearLayer.forward``): the identity
      ``x_eye`` (in x in), ``lora_weight = lora_B(lora_A(x_eye)).T`` (out x in) and
      ``weight + scaling * lora_weight`` (out x in) for ``get_weight_norm``, plus the base
      weight dequantized or cast to x's dtype (out x in) when it is not stored in fp32; all
      at 4 B, since PEFT casts x to the adapters' fp32 (``_cast_input_dtype``) and the sum
      promotes to fp32 (lora_weight is 16-bit under autocast: 4 B is its upper bound); the
      widest adapted layer's.
    """
    config = e.request.lora
    assert config is not None
    words: list[str] = []
    largest = 0
    if e.qlora is not None and config.qlora is not None:
        dequant = dequant_transient_bytes(e.qlora, config.qlora.compute_dtype)
        module = e.qlora.largest
        words.append(
            f"{dequant:,} [B: {module.name} dequantized, {module.out_features:,} x "
            f"{module.in_features:,} x {dequant // (module.out_features * module.in_features)} "
            f"B {config.qlora.compute_dtype.value}]"
        )
        largest = dequant
    if config.use_dora:
        copied = e.qlora is not None or e.plan.weight != 4
        cast_words = " + out x in [base weight cast]" if copied else ""
        dora = 0
        name = ""
        for module in lora.modules:
            size = module.in_features**2 + 2 * module.out_features * module.in_features
            if copied:
                size += module.out_features * module.in_features
            if size * 4 > dora:
                dora, name = size * 4, module.name
        words.append(
            f"{dora:,} [B: DoRA weight norm of {name}: (in^2 [x_eye] + 2 x out x in "
            f"[lora_weight, weight + scaled lora_weight]{cast_words}) x 4 B]"
        )
        largest = max(largest, dora)
    if largest:
        e.formulas["adapter_transient"] = f"max({', '.join(words)}) = {largest:,} B"
    return largest


DORA_VECTORS = 3  # weight_norm, mag_norm_scale, mag_norm_scale - 1: out elements each, fp32


def dora_saved(
    e: Estimation, lora: LoraPlan, recompute: dict[str, int]
) -> tuple[int, str, dict[int, int]]:
    """What DoRA keeps for backward beyond LoRA's tensors, per adapted Linear of ``rows``
    tokens (src/peft/tuners/lora/dora.py ``DoraLinearLayer.forward``, peft 0.21.0:
    ``weight_norm = get_weight_norm(...).detach()``, ``mag_norm_scale = (magnitude /
    weight_norm).view(1, -1)``, ``result_dora = (mag_norm_scale - 1) * base_result +
    mag_norm_scale * lora_result * scaling``, the magnitude trainable):

    * each product keeps its other operand: ``base_result`` (rows x out at the activation
      dtype) and ``lora_result`` (rows x out at the adapters' compute dtype), and the
      out-element vectors ``mag_norm_scale - 1`` and ``mag_norm_scale``; the division keeps
      its divisor ``weight_norm`` (out elements; the dividend is the parameter). All three
      vectors are fp32: x is cast to the fp32 adapters' dtype (``_cast_input_dtype``), so
      ``weight.to(x.dtype)`` and its norm are, and the division by the fp32 magnitude is
      (measured: benchmarks/peft_params/saved_results.md; the first adapted layer's
      ``mag_norm_scale - 1`` is not kept when its input needs no grad, out x 4 B less);
    * the magnitude-scaled LoRA output ``mag_norm_scale * lora_result`` is not kept: its
      product by ``scaling`` (a Python float) keeps only the scalar, the sum keeps nothing;
      ``lora_weight`` (``lora_B(lora_A(x_eye))``) enters only detached, so its graph is freed
      at the end of the forward (a transient: :func:`adapter_transient`);
    * with lora_dropout > 0 the base is recomputed as ``F.linear(x, weight)`` on the dropped
      input, which keeps ``weight`` - a new out x in tensor when the base weight is
      dequantized or cast (a 4-bit base, autocast, a 16-bit base under fp32 adapters).

    Under full checkpointing only the largest recomputed block's, beside those outside
    repeated blocks. Returns the bytes, the formula's terms and the bytes per layer (the
    allocator replay's ``adapter_saved``)."""
    config = e.request.lora
    assert config is not None
    compute = _adapter_compute_bytes(e)
    activation = int(e.plan.activation)
    weight_kept = config.dropout > 0 and _dora_weight_copy(e)
    per_layer: dict[int, int] = {}
    for module in lora.modules:
        kept = module.rows * module.out_features * (activation + compute)
        kept += DORA_VECTORS * module.out_features * 4
        if weight_kept:
            kept += module.out_features * module.in_features * compute
        per_layer[module.layer] = per_layer.get(module.layer, 0) + kept
    if recompute:
        units: dict[str, int] = {}
        outside = 0
        for index, kept in per_layer.items():
            unit = checkpoint_unit(e.analysis.layers[index].name)
            if unit is None:
                outside += kept
            else:
                units[unit] = units.get(unit, 0) + kept
        total = outside + max(units.values(), default=0)
    else:
        total = sum(per_layer.values())
    terms = (
        f"rows x out x ({activation} [B: base_result] + {compute} [B: lora_result]) + out x "
        f"{DORA_VECTORS} x 4 [B: weight_norm, mag_norm_scale, mag_norm_scale - 1] [DoRA]"
    )
    if weight_kept:
        terms += f" + out x in x {compute} [B: DoRA's F.linear keeps the cast base weight]"
    return total, terms, per_layer


def _adapter_compute_bytes(e: Estimation) -> int:
    """Bytes per element the adapters compute in: 16-bit under autocast, else fp32 (PEFT
    keeps adapters in fp32 and casts their input to it)."""
    cache = e.plan.weight_cache
    return int(cache) if cache else 4


def _dora_weight_copy(e: Estimation) -> bool:
    """Whether the weight DoRA's ``F.linear(x, weight)`` keeps is a new tensor: dequantized
    (a 4-bit base), cast by autocast, or cast to x's fp32 (a base not stored in fp32)."""
    return e.qlora is not None or bool(e.plan.weight_cache) or e.plan.weight != 4


def inference_adapters(e: Estimation, lora: LoraPlan) -> dict[str, int]:
    """The lines LoRA adds to an inference forward.

    * merged (PEFT ``merge_and_unload``: ``W += lora_B @ lora_A * scaling``, the adapters
      removed; on a bitsandbytes 4-bit base ``Linear4bit.merge`` dequantizes, adds and
      quantizes again): none, the base's weights are the model's;
    * not merged: the adapters' weights in fp32 (``autocast_adapter_dtype=True`` upcasts
      them over a 16-bit base), DoRA's magnitude with them, and the largest adapted layer's
      forward temporaries (src/peft/tuners/lora/layer.py ``Linear.forward``: x cast to fp32,
      ``lora_A``'s rows x r output, ``lora_B``'s rows x out output, its product by the
      scaling, and ``result`` promoted to fp32 by the sum: rows x (4 in + 4 r + 3 x 4 out));
      a 4-bit base's dequantized weight or DoRA's weight norm (:func:`adapter_transient`)
      when larger; a ParamWrapper (DeepSeek's routed experts) materializes its parametrized
      weight ``W + B @ A`` (experts x out x in at the weight's bytes) every forward.
    """
    config = e.request.lora
    assert config is not None
    if config.merged:
        e.assumptions.append(
            "LoRA merged into the base (merge_and_unload): the base's weights only, no adapter "
            "tensors or temporaries"
        )
        return {}
    r = config.r
    adapter = lora.adapter_params + lora.magnitude_params
    weights = adapter * 4
    e.formulas["adapter_weights"] = (
        f"{adapter:,} [adapter params: r x (in + out) per adapted layer"
        f"{', + out for DoRA' if lora.magnitude_params else ''}] x 4 [B fp32] = {weights:,} B"
    )
    e.notes["adapter_weights"] = [
        f"LoRA r={r} on {len(lora.modules):,} modules, not merged: the adapters run beside "
        "the base in fp32 (PEFT autocast_adapter_dtype=True)"
    ]
    largest, name, wrapped = 0, "", False
    for module in lora.modules:
        if module.experts:  # a ParamWrapper: W + B @ A materialized whole, W's dtype
            size = module.experts * module.in_features * module.out_features * int(e.plan.weight)
        elif module.embedding:
            size = module.rows * (r + module.out_features) * 4
        else:
            size = module.rows * (module.in_features + r + 3 * module.out_features) * 4
        if size > largest:
            largest, name, wrapped = size, module.name, bool(module.experts)
    lines = {"adapter_weights": weights}
    path = "experts x out x in, W + B @ A" if wrapped else "rows x (4 in + 4 r + 3 x 4 out)"
    words = f"{largest:,} [B: {name}: {path}, the adapter path]"
    other = adapter_transient(e, lora)  # a 4-bit base's dequantized weight, DoRA's norm
    if other:
        words += f", {e.formulas['adapter_transient']}"
        largest = max(largest, other)
    e.formulas["adapter_transient"] = f"max({words}) = {largest:,} B"
    lines["adapter_transient"] = largest
    return lines


def adapters_outside_units(e: Estimation, adapter_saved: int) -> int:
    """Under full checkpointing, what the adapters outside checkpointed units keep: a unit's
    adapter tensors exist only while the backward recomputes it (the forward keeps none,
    app.domain.memory.allocator_events), so the forward and the loss's backward hold these
    alone; the formula for them replaces the line's when the peak is there."""
    layers = e.analysis.layers
    outside = sum(
        kept
        for index, kept in e.adapter_saved.items()
        if checkpoint_unit(layers[index].name) is None
    )
    if outside != adapter_saved:
        e.adapter_early = (
            outside,
            f"{outside:,} [B: the adapters outside checkpointed units; a unit's are recomputed "
            f"in its backward] = {outside:,} B",
        )
    return outside


def offloaded_adapters(e: Estimation, recompute: dict[str, int]) -> dict[int, int]:
    """With ``activation_offload``, what the LoRA adapters keep for backward per layer that
    goes to pinned host memory with the layers' own kept tensors (torch.autograd.graph
    ``save_on_cpu`` and torchtune 0.6 ``OffloadActivations`` pack every saved tensor that is
    not an ``nn.Parameter``: lora_A's output, its input copy, the dropout mask, DoRA's
    vectors): every adapted layer outside a checkpointed unit (inside one, its tensors are
    recomputed in backward and stay on the GPU, as without offload)."""
    if not recompute:
        return {index: kept for index, kept in e.adapter_saved.items() if kept}
    layers = e.analysis.layers
    return {
        index: kept
        for index, kept in e.adapter_saved.items()
        if kept and checkpoint_unit(layers[index].name) not in recompute
    }


def adapters_on_gpu(e: Estimation, total: int, offloaded: dict[int, int]) -> int:
    """The adapter_activations line once ``offloaded`` (:func:`offloaded_adapters`) is on the
    host: the recomputed block's only (0 without checkpointing); its formula says so."""
    moved = sum(offloaded.values())
    left = total - moved
    before = e.formulas["adapter_activations"].rsplit(" = ", 1)[0]
    e.formulas["adapter_activations"] = (
        f"{total:,} [B: {before.replace('[', '(').replace(']', ')')}] - {moved:,} [B: the "
        f"adapters' tensors outside checkpointed units, offloaded to pinned host memory "
        f"(activation_offload)] = {left:,} B"
    )
    return left
