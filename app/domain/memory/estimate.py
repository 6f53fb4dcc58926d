"""Training and inference memory footprints with a breakdown, a peak phase and assumptions.

The model replays one step over the analysed graph (:mod:`app.domain.graph.analysis`):

* forward: every layer allocates its output (views and in-place ops do not) and keeps the
  tensors autograd saves; other values die after their last consumer;
* backward, layer by layer in reverse: the gradient of the output and of the inputs are live,
  parameter gradients accumulate, and saved tensors are freed after the backward of the
  earliest layer that kept them;
* optimizer step: weights + gradients + optimizer state + the step's temporaries.

The reported peak is the largest of those moments in steady state (optimizer state exists
from the second iteration on); the first iteration, when optimizer state is created in the
step, is reported beside it. Sizes are integer bytes.

This module runs an estimate; its parts live beside it in :mod:`app.domain.memory`:
``request`` and ``result`` (what is asked and answered), ``formulas`` (the closed-form rules:
weights, gradients, optimizer state, KV cache, ...), ``liveness`` (the storage plan and the
timeline walked forward and backward), ``moments`` (the step's moments, whose largest is the
peak), ``allocator_events``, ``cuda_allocator`` and ``cuda_runtime`` (the CUDA runtime's
lines), ``explain`` (assumptions and formulas), ``context`` and ``memo`` (what the parts share
within one estimate and across estimates).

References
----------
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022.
Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", 2020.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.memory.adapters import qlora_weights
from app.domain.memory.checkpoint import (
    check_checkpoint,
    checkpoint_weight_tensors,
    unquantized_dtype_bytes,
)
from app.domain.memory.context import Estimation
from app.domain.memory.cuda_allocator import ReplayMemo
from app.domain.memory.cuda_runtime import (
    MAX_REPLAYED_LAYERS,
    UNREPLAYED_FRAGMENTATION_FRACTION,
    cuda_lines,
    cuda_memory,
)
from app.domain.memory.explain import explain_peak, layer_view, request_assumptions
from app.domain.memory.formulas import (
    PrecisionPlan,
    Sizer,
    ceil_fraction,
    kv_cache_bytes,
    precision_plan,
)
from app.domain.memory.frozen import FrozenBase, frozen_base
from app.domain.memory.liveness import StoragePlan, build_plan, last_reads, seed_rule
from app.domain.memory.memo import LayerColumns, PlanMemo, layer_columns, layer_totals, memoised
from app.domain.memory.moments import inference_moments, training_moments
from app.domain.memory.rank_share import (
    RankShare,
    attention_heads,
    check_tensor_parallel_heads,
    request_rank_share,
)
from app.domain.memory.request import MemoryInputError, MemoryRequest
from app.domain.memory.reserve import explain_reserve
from app.domain.memory.result import (
    CudaMemory,
    KeptTensor,
    LayerMemory,
    MemoryEstimate,
    MemoryLine,
    breakdown,
)
from app.domain.peft import LoraPlan, lora_plan
from app.domain.peft.qlora import check_qlora, quantized_base
from app.domain.precision import CONVENTIONS, bytes_per_element, convention
from app.domain.workload import Logits, Mode, Parallelism, Runtime

__all__ = [
    "MAX_REPLAYED_LAYERS",
    "UNREPLAYED_FRAGMENTATION_FRACTION",
    "CudaMemory",
    "KeptTensor",
    "LayerMemory",
    "MemoryEstimate",
    "MemoryInputError",
    "MemoryLine",
    "MemoryRequest",
    "PlanMemo",
    "PrecisionPlan",
    "analyze_for",
    "check_tensor_parallel_heads",
    "estimate_memory",
    "inference_floor_bytes",
    "precision_plan",
]


def analyze_for(
    inputs: Sequence[InputDecl],
    layers: Sequence[Mapping[str, Any]],
    bindings: Mapping[str, int],
    request: MemoryRequest,
) -> GraphAnalysis:
    """The graph analysed the way ``request`` runs it: its mode, attention implementation
    (None: PyTorch SDPA's default for its runtime and precision), runtime, precision and
    logits. The analysis :func:`estimate_memory` expects for ``request``."""
    return analyze(
        inputs,
        layers,
        bindings,
        training=request.mode is Mode.TRAINING,
        attention=request.attention,
        runtime=request.runtime,
        precision=request.precision,
        logits=request.logits,
    )


def _check_analysis(analysis: GraphAnalysis, request: MemoryRequest) -> None:
    """The request's attention and logits options are the ones the graph was analysed with."""
    if request.attention is not None and analysis.attention_requested is not request.attention:
        asked = analysis.attention_requested
        raise MemoryInputError(
            f"the request asks for attention={request.attention.value} but the graph was "
            f"analysed with attention={asked.value if asked else 'default'}: analyse it with "
            "analyze_for(..., request)"
        )
    if request.logits is not analysis.logits_requested and request.logits is Logits.LAST:
        raise MemoryInputError(
            "the request asks for logits=last but the graph was analysed with logits="
            f"{analysis.logits_requested.value}: analyse it with analyze_for(..., request)"
        )


def estimate_memory(
    analysis: GraphAnalysis,
    request: MemoryRequest,
    *,
    per_layer: bool = False,
    replays: ReplayMemo | None = None,
    plans: PlanMemo | None = None,
    explain: bool = True,
) -> MemoryEstimate:
    """Peak memory per device for one training step or one inference forward pass.

    Parameters
    ----------
    analysis : GraphAnalysis
        The model analysed at the micro-batch size (batch per device per forward), with the
        request's attention implementation and logits (:func:`analyze_for`).
    request : MemoryRequest
        Mode, precision convention, optimizer, checkpointing, parallelism, runtime.
    per_layer : bool
        Whether to return the per-layer view.
    replays : ReplayMemo, optional
        A bounded cache the caller keeps across estimates: the CUDA allocator's state after the
        weights is replayed once per distinct weights (estimates of one model at several batch
        sizes or workspace sizes share it). Speed only: the result is the same without it.
    plans : PlanMemo, optional
        A bounded cache the caller keeps across estimates of the same analysis objects: the
        inference storage plan (per precision, runtime, tensor split and checkpointing), the
        forward's allocator events (per activation dtype and runtime) and the weights' events
        (per bytes per weight and model shard) are derived once. Speed only, as ``replays``.
    explain : bool
        False: the formulas that describe the moment of the peak (inputs, buffers,
        activations, transient, gradients, loss) are left as the line's key, for a caller that
        reads only the bytes (a fit). Speed only: every figure is the same.

    Returns
    -------
    MemoryEstimate
        Lines that add up to ``peak_bytes`` at ``peak_phase``, and the assumptions.

    Notes
    -----
    Weights: params x bytes(weight dtype) / (tensor x pipeline) / (data if ZeRO-3).
    Gradients: trainable params x bytes(grad dtype), sharded by ZeRO-2/3.
    Optimizer state: per trainable param (SGD 0, momentum 1, Adam/AdamW 2 slots of the state
    dtype; 8-bit Adam 2 B; Adafactor rows + cols), sharded by ZeRO-1+.
    KV cache (inference): 2 x layers x kv_heads x head_dim x seq x batch x bytes.
    """
    if request.checkpoint is not None:  # before the precision's own check
        qlora = request.lora is not None and request.lora.qlora is not None
        check_checkpoint(request.checkpoint, request.precision, request.mode, qlora=qlora)
    if request.lora is not None and request.lora.qlora is not None:
        check_qlora(request.lora.qlora, request.precision)  # before the precision's own check
    _check_request(analysis, request)
    training = request.mode is Mode.TRAINING
    plan = precision_plan(request.precision)
    sizer = Sizer(plan, request.runtime)
    assumptions = request_assumptions(analysis, request, plan)
    totals = layer_totals(plans, analysis)  # summed once per estimate (per analysis with plans)
    params = totals.params
    weights, weights_formula, weight_notes = _weights_line(analysis, request, plan, plans, params)
    if request.checkpoint is not None:  # the weights' own notes say what is quantized
        assumptions += [note for note in weight_notes if "checkpoint" in note or "B per" in note]
    lines_static: dict[str, int] = {"weights": weights}
    buffers = totals.buffers_bytes
    if buffers:
        lines_static["buffers"] = buffers
    lora = lora_plan(analysis.layers, request.lora) if request.lora is not None else None
    frozen = (
        request_frozen_base(analysis, request, plan, lora, params)
        if lora is not None and training
        else None
    )
    columns = layer_columns(plans, analysis)  # built once per estimate (per analysis, plans)
    storage_plan, plan_key = _storage_plan(analysis, request, sizer, plans, columns, frozen)
    e = Estimation(
        analysis=analysis,
        request=request,
        plan=plan,
        sizer=sizer,
        storage_plan=storage_plan,
        params=params,
        totals=totals,
        static=lines_static,
        inputs_bytes=sum(sizer.value_bytes(b.numel, b.kind) for b in analysis.inputs),
        formulas={"weights": weights_formula},
        notes={"weights": list(weight_notes)},
        assumptions=assumptions,
        replays=replays,
        plans=plans,
        plan_key=plan_key,
        columns=columns,
    )
    par = request.parallelism
    if request.checkpoint is not None and par.tensor * par.pipeline == 1 and par.zero_stage < 3:
        # the allocator replays the checkpoint's own tensors (unsharded: a rank's share of a
        # packed tensor is not modelled; sharded requests replay the 16-bit shapes)
        e.weight_tensors = checkpoint_weight_tensors(
            analysis, request.checkpoint, unquantized_dtype_bytes(request.precision)
        )
    if request.lora is not None:
        e.lora = lora
        if request.lora.qlora is not None:  # a 4-bit base: the weights line is its bytes
            qlora_weights(e)
    if training:
        first_moments, steady_moments = training_moments(e)
    else:
        first_moments, steady_moments = [], inference_moments(e)

    peak = max(steady_moments, key=lambda m: m.total)
    first_peak = max(first_moments, key=lambda m: m.total) if first_moments else None
    parts = dict(peak.parts)
    if e.adapter_early is not None and parts.get("adapter_activations") == e.adapter_early[0]:
        e.formulas["adapter_activations"] = e.adapter_early[1]  # a peak before any recompute
    if training and peak.phase == "backward":
        _split_output(e, parts)
    if request.runtime is Runtime.CUDA:
        cuda_lines(e, parts)
        if explain and e.allocator is not None and request.overhead.fragmentation_fraction is None:
            e.notes.setdefault("fragmentation_reserve", []).extend(
                explain_reserve(
                    *e.allocator,
                    expandable=request.overhead.expandable_segments,
                    workspace_bytes=parts["workspace"],
                )
            )
    if explain:
        explain_peak(e, peak, parts)
    lines = breakdown(parts, e.formulas, e.notes, training=training)
    layers_view = layer_view(e) if per_layer else ()
    phase_peaks: dict[str, int] = {}
    for moment in steady_moments:
        phase_peaks[moment.phase] = max(phase_peaks.get(moment.phase, 0), moment.total)
    extra = sum(parts.values()) - peak.total
    cuda = cuda_memory(e, parts, first_peak.total if first_peak else None)
    return MemoryEstimate(
        mode=request.mode,
        runtime=request.runtime,
        params=params,
        trainable_params=(
            (e.lora.trainable_params if e.lora is not None else params) if training else 0
        ),
        lines=lines,
        peak_bytes=sum(parts.values()),
        peak_phase=peak.phase,
        phase_peaks={k: v + extra for k, v in phase_peaks.items()},
        first_iteration_peak_bytes=first_peak.total + extra if first_peak else None,
        first_iteration_peak_phase=first_peak.phase if first_peak else None,
        seed_rule_bytes=(
            lines_static["weights"] + seed
            if (seed := seed_rule(analysis, sizer)) is not None
            else None
        ),
        layers=layers_view,
        assumptions=tuple(assumptions),
        cuda=cuda,
        host_lines=None
        if not e.host
        else tuple(
            MemoryLine(
                key=key,
                bytes=size,
                formula=e.formulas.get(key, key),
                assumptions=tuple(e.notes.get(key, [])),
            )
            for key, size in e.host.items()
        ),
    )


def _check_request(analysis: GraphAnalysis, request: MemoryRequest) -> None:
    """The request can be estimated: a trainable precision for training and the analysis made
    for it (:func:`_check_analysis`). ZeRO on one data rank is DeepSpeed's (ZeRO-Offload /
    ZeRO-Infinity on one GPU): nothing is sharded, DeepSpeed's buffers are charged."""
    precision = request.precision
    if request.mode is Mode.TRAINING and not convention(precision).trainable:
        trainable = ", ".join(p.value for p, row in CONVENTIONS.items() if row.trainable)
        raise MemoryInputError(
            f"precision '{precision.value}' is for inference (quantized weights); train in "
            f"{trainable}"
        )
    _check_analysis(analysis, request)


def _stored_weights_bytes(
    analysis: GraphAnalysis, request: MemoryRequest, plan: PrecisionPlan, plans: PlanMemo | None
) -> tuple[int, int, tuple[str, ...]]:
    """The weights every device stores (its tensor x pipeline share, the worst pipeline stage's:
    :func:`app.domain.memory.rank_share.rank_share`; and split over data ranks from ZeRO-3 on),
    the unsharded bytes and their notes (memoised per analysis and precision)."""
    par = request.parallelism
    share, weights_full, weight_notes = request_rank_share(analysis, request, plan, plans)
    weights = share.weights
    if par.zero_stage >= 3:
        weights = ceil_fraction(Fraction(weights, par.data))
    return weights, weights_full, weight_notes


def _weights_line(
    analysis: GraphAnalysis,
    request: MemoryRequest,
    plan: PrecisionPlan,
    plans: PlanMemo | None,
    params: int,
) -> tuple[int, str, tuple[str, ...]]:
    """The weights line of ``params`` parameters: its bytes, its formula and its notes."""
    weights, weights_full, weight_notes = _stored_weights_bytes(analysis, request, plan, plans)
    par = request.parallelism
    model_shard = par.tensor * par.pipeline
    if request.checkpoint is not None:
        expression = (
            f"{weights_full:,} [B: the {request.checkpoint.method} checkpoint's quantized "
            f"weights as stored, their scales, zero points and g_idx, and the rest at "
            f"{unquantized_dtype_bytes(request.precision)} B]"
        )
    elif convention(request.precision).quantized:
        expression = f"{weights_full:,} [B: quantized weights, scales and 16-bit rest]"
    else:
        expression = f"{params:,} [params] x {plan.weight} [B]"
    notes = list(weight_notes)
    if model_shard > 1:
        share, _, _ = request_rank_share(analysis, request, plan, plans)
        expression, share_notes = _share_words(
            expression,
            share,
            par.tensor,
            par.pipeline,
            plan.weight,
            heads=bool(
                memoised(plans, analysis, ("attention heads",), lambda: attention_heads(analysis))
            ),
        )
        notes += share_notes
    if par.zero_stage >= 3:
        expression = f"ceil({expression} / {par.data} [ZeRO-3 data ranks])"
    return weights, f"{expression} = {weights:,} B", tuple(notes)


def _fraction_words(value: Fraction) -> str:
    """``value`` as the formula grammar reads it: ``12`` or ``(25 / 2)``."""
    if value.denominator == 1:
        return f"{value.numerator:,}"
    return f"({value.numerator:,} / {value.denominator:,})"


def _share_words(
    expression: str, share: RankShare, tp: int, pp: int, weight: Fraction, *, heads: bool
) -> tuple[str, tuple[str, ...]]:
    """The weights formula of one rank's share (``weight``: bytes per weight) and the notes
    that say what each pipeline stage holds."""
    notes: list[str] = []
    stage = share.stages[share.worst]
    replicated = ""
    if stage.replicated:
        replicated = (
            f" + {_fraction_words(stage.replicated)} [elements: K/V projection rows of the KV "
            f"heads replicated over {tp} GPUs] x {weight} [B]"
            + (f" / {pp} [pipeline]" if not share.staged and pp > 1 else "")
        )
    if not share.staged:
        expression = f"ceil({expression} / {tp * pp} [tensor x pipeline]{replicated})"
        if pp > 1:
            notes.append("no repeated block to split into stages: each stage charged 1 / pipeline")
    else:
        worst = share.worst
        holds = [f"{stage.blocks} repeated blocks"]
        if worst == 0:
            holds.append("the layers before them (embeddings)")
        if worst == pp - 1:
            holds.append("the layers after them (final norm, output head)")
        expression = (
            f"ceil({stage.stored:,} [B: weights of pipeline stage {worst} of {pp}, the stage "
            f"holding the most: {', '.join(holds)}] / {tp} [tensor]{replicated})"
        )
        notes.append(
            "per pipeline stage (weights per GPU, KV cache elements per GPU, repeated blocks): "
            + "; ".join(
                f"stage {i}: {s.weights:,} B, {s.kv_numel:,}, {s.blocks}"
                for i, s in enumerate(share.stages)
            )
            + " (blocks split as vLLM's get_pp_indices; the layers before the first block on "
            "the first stage, those after the last on the last, a tied output head's weight "
            "copied there)"
        )
    if tp > 1 and heads:
        notes.append(
            f"tensor parallel {tp}: attention heads and MLP columns split (Megatron-style); "
            "KV heads split, one replicated per GPU when fewer than the GPUs (vLLM "
            "get_num_kv_heads)"
        )
    return expression, tuple(notes)


def request_frozen_base(
    analysis: GraphAnalysis,
    request: MemoryRequest,
    plan: PrecisionPlan,
    lora: LoraPlan,
    params: int,
) -> FrozenBase:
    """The frozen base of a LoRA training request (:mod:`app.domain.memory.frozen`): lora_A
    keeps the base layer's own input with an fp32 base, no autocast and no dropout (PEFT's
    ``_cast_input_dtype`` is then a no-op); under autocast every frozen weight matrix is cast
    per use: with a 4-bit base only the Linear layers bitsandbytes leaves unquantized (the output
    head, fp32 after prepare_model_for_kbit_training), whose dequantized weights are the QLoRA
    rules' (:func:`app.domain.memory.adapters.adapter_transient`)."""
    config = request.lora
    assert config is not None
    cast_layers = None
    if config.qlora is not None and plan.weight_cache:  # only the Linear layers kept unquantized
        quantized = quantized_base(
            analysis.layers, config.qlora, params=params, torch_dtype_bytes=int(plan.weight)
        )
        four_bit = {m.layer for m in quantized.modules}
        cast_layers = (
            frozenset(i for i, layer in enumerate(analysis.layers) if layer.op == "linear")
            - four_bit
        )
    return frozen_base(
        analysis.layers,
        lora,
        adapter_shares_input=plan.activation == 4 and not plan.weight_cache and not config.dropout,
        cast_bytes=plan.weight_cache,
        cast_layers=cast_layers,
        # DeepSpeed ZeRO-3: its Linear keeps the input whatever needs a gradient
        linear_keeps_input=request.parallelism.zero_stage == 3
        and request.parallelism.uses_deepspeed,
    )


def _storage_plan(
    analysis: GraphAnalysis,
    request: MemoryRequest,
    sizer: Sizer,
    plans: PlanMemo | None,
    columns: LayerColumns,
    frozen: FrozenBase | None = None,
) -> tuple[StoragePlan, tuple[object, ...]]:
    """The step's storage plan, and what an inference plan depends on (its memo key).

    An inference plan reads the activation bytes (bf16 = fp16) and the runtime only: the
    tensor split, checkpointing and weight bytes change what a layer keeps for backward, which
    inference never reads (no tensor is kept: reused (), adds {}). It is built for no
    checkpointing whatever the request's, and for the request's tensor-parallel degree (a rank
    holds its share of the column-parallel transients and the all-reduce's output).
    """
    training = request.mode is Mode.TRAINING
    plan_key: tuple[object, ...] = ("plan", sizer.plan.activation, request.runtime)
    if training:  # full checkpointing and the per-layer view edit a training plan
        return build_plan(analysis, sizer, request, training, None, frozen, columns), plan_key
    tp = request.parallelism.tensor
    plan_request = _INFERENCE_PLAN_REQUEST
    if tp > 1:  # a tensor-parallel rank holds its share of the column-parallel activations
        plan_key = (*plan_key, tp)
        plan_request = MemoryRequest(mode=Mode.INFERENCE, parallelism=Parallelism(tensor=tp))
    # an inference plan is only read (adds {}: its layer_saved is built once, the same)
    storage_plan = memoised(
        plans,
        analysis,
        plan_key,
        lambda: build_plan(
            analysis,
            sizer,
            plan_request,
            training,
            memoised(plans, analysis, ("last use",), lambda: last_reads(analysis)),
            columns=columns,
        ),
    )
    return storage_plan, plan_key


def _split_output(e: Estimation, parts: dict[str, int]) -> None:
    """At a backward peak, the model's output (the logits) is alive because the caller holds
    it, not because a layer kept it: its own line, out of the activations."""
    if not parts.get("activations", 0) or e.output_dropped:
        return
    analysis = e.analysis
    out_bytes = e.storage_plan.sizes.get(analysis.output_storage, 0)
    if 0 < out_bytes <= parts["activations"]:
        parts["activations"] -= out_bytes
        parts["outputs"] = out_bytes
        shape = "x".join(str(d) for d in analysis.output_shape)
        e.formulas["outputs"] = (
            f"{out_bytes:,} [B: the model's output, {shape}, returned to the caller] = "
            f"{out_bytes:,} B"
        )


# What an inference storage plan is built with besides the activation bytes and the runtime
# (the sizer's): one GPU, no checkpointing (see _storage_plan)
_INFERENCE_PLAN_REQUEST = MemoryRequest(mode=Mode.INFERENCE)


def inference_floor_bytes(
    analysis: GraphAnalysis, request: MemoryRequest, *, plans: PlanMemo | None = None
) -> int:
    """A floor under ``estimate_memory(analysis, request).peak_bytes`` at inference, found
    without replaying the step: the weights and the KV cache (as the estimate's lines have
    them), and on CUDA the cuBLAS workspace and the CUDA context; the estimate's other lines
    (inputs, activations, transients, allocator rounding and cached segments) are never
    negative. A caller that only needs to know whether a peak exceeds a budget can skip the
    estimate when this floor already does. ``plans``: as :func:`estimate_memory`'s."""
    if request.mode is not Mode.INFERENCE:
        raise MemoryInputError("inference_floor_bytes is for inference")
    precision = request.precision
    plan = precision_plan(precision)
    floor, _, _ = _stored_weights_bytes(analysis, request, plan, plans)
    if analysis.is_decoder and request.kv_cache is not False:
        share, _, _ = request_rank_share(analysis, request, plan, plans)
        kv_bytes = int(bytes_per_element(convention(precision).kv_cache_dtype))
        floor += kv_cache_bytes(share.kv_numel, kv_bytes, 1)
    if request.runtime is Runtime.CUDA:  # one cuBLAS handle at inference (_cublas_handles)
        floor += request.overhead.workspace_bytes + request.overhead.cuda_context_bytes
    return floor
