"""The words of an estimate: the runtime and logits assumptions, the formulas of the lines that
depend on the moment of the peak, and the per-layer view of what each layer keeps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from app.domain.graph.analysis import GraphAnalysis, LayerAnalysis
from app.domain.graph.ops import Storage
from app.domain.graph.traits import INTERNAL_TENSOR_OPS
from app.domain.memory.compiled import COMPILE_SOURCE
from app.domain.memory.context import Estimation, Moment
from app.domain.memory.formulas import PrecisionPlan, Sizer
from app.domain.memory.liveness import (
    ATTENTION_MATRICES,
    TRANSPOSED_CONV_OPS,
    checkpoint_unit,
    kept_storages,
    saved_for_backward,
    transient_numel,
)
from app.domain.memory.request import MemoryRequest
from app.domain.memory.result import KeptTensor, LayerMemory
from app.domain.precision import convention
from app.domain.workload import Checkpointing, Logits, Mode, Runtime

RUNTIME_NOTES: Mapping[Runtime, str] = {
    Runtime.CPU: (
        "runtime pytorch_cpu, calibrated on PyTorch 2.13 CPU measurements "
        "(benchmarks/fidelity): dropout masks in the activation dtype; oneDNN convolutions "
        "hold a buffer the size of the larger of their input and output in forward (transposed "
        "ones: two of their output); backward kernel buffers in outputs: conv 2, "
        "batch norm 1, ReLU/ReLU6 1, RMSNorm 3, LSTM 5; GRU and RNN run PyTorch's native "
        "cell step by step (input gates, per-step tensors, h_n, a seq-first input copy); in-place "
        "ReLU6 keeps an input clone; SDPA with dropout runs the math kernel; default optimizer "
        "step: for-loop"
    ),
    Runtime.CUDA: (
        "runtime pytorch_cuda, rules read from PyTorch 2.13's source, not yet measured on a "
        "GPU: allocator_rounding and fragmentation_reserve replay the caching allocator "
        "(c10/cuda/CUDACachingAllocator.cpp); workspace: one cuBLAS workspace per handle and "
        "stream, two in training (aten/src/ATen/cuda/CublasHandlePool.cpp); dropout masks are "
        "1-byte bool (aten native_dropout); flash / memory-efficient attention keep the output "
        "and an fp32 log-sum-exp, padded to 32 rows by the memory-efficient kernel "
        "(aten/src/ATen/native/transformers/cuda/attention.cu); autocast caches 16-bit copies "
        "of fp32 weights until it exits (aten/src/ATen/autocast_mode.cpp); the default "
        "optimizer step is foreach (torch/optim/adamw.py: one parameter-sized temporary list), "
        "fused for mixed_*; DDP buckets (torch/csrc/distributed/c10d/reducer.cpp); the CUDA "
        "context is a documented default; cuDNN convolutions and RNNs take a work space from "
        "the allocator per call, forward and backward (aten/src/ATen/native/cudnn/Conv_v8.cpp "
        "run_conv_plan, RNN.cpp _cudnn_rnn; sizes measured on an H100), depthwise convolutions "
        "run PyTorch's own kernel"
    ),
}


def request_assumptions(
    analysis: GraphAnalysis, request: MemoryRequest, plan: PrecisionPlan
) -> list[str]:
    """The assumptions every estimate of ``request`` starts with: the precision convention, the
    runtime's rules, the attention each layer runs, the logits, and a batch norm an export may
    have folded away."""
    training = request.mode is Mode.TRAINING
    assumptions: list[str] = [plan.convention, RUNTIME_NOTES[request.runtime]]
    assumptions += [f"attention: {impl.value} ({why})" for impl, why in analysis.attention_used]
    if analysis.is_decoder and not training:
        assumptions.append(logits_note(analysis))
    elif training and request.logits is Logits.LAST:
        assumptions.append("logits: every position (training: the loss reads every position)")
    if request.training_options.compile:
        assumptions.append(compile_note(training=training))
    if training and analysis.batchnorm_folded:
        assumptions.append(
            f"cannot see batch norm: {analysis.batchnorm_folded} convolution(s) of this graph "
            "may carry a batch norm that an eval-mode export folded into their weights; a "
            "training step keeps batch norm's inputs and statistics, which this estimate "
            "misses (export with training=torch.onnx.TrainingMode.TRAINING, or with dynamo=True, "
            "whose provenance lets the importer restore the batch norm)"
        )
    return assumptions


def compile_note(*, training: bool) -> str:
    """What ``compile`` changes, as the estimate's assumption."""
    if not training:
        return (
            "compile: torch.compile at inference changes no line: nothing is kept for backward, "
            "and the transients this graph charges are matmul and attention outputs Inductor "
            "materialises as eager mode does (CUDA graphs of mode reduce-overhead not modelled)"
        )
    return (
        f"compile: torch.compile (Inductor, mode default; {COMPILE_SOURCE}): a gated MLP keeps "
        "gate, up and their product, not act(gate); a composite activation's intermediates are "
        "recomputed; RMSNorm keeps its input in the activation dtype and the fp32 per-row "
        "statistic, not the fp32 copy and the normalized tensor. Dropout masks, norms' "
        "statistics, matmul inputs and attention's tensors are kept as in eager mode (random "
        "ops, reductions and compute-intensive ops are never recomputed). Approximated: the "
        "cut is taken per layer; cross-layer heuristics, attention patterns rewritten into SDPA "
        "and CUDA graphs are not modelled"
    )


def _term(size: int, words: str, times: int = 1) -> tuple[int, str]:
    """A term of a sum: its value and its text, ``[times x ]size [words]``."""
    return size * times, (f"{times} x " if times != 1 else "") + f"{size:,} [{words}]"


def _sum(terms: Sequence[tuple[int, str]], total: int, empty: str) -> str:
    """``a [words] + b [words] = total B`` over the non-zero terms (``0 [empty]`` if none)."""
    shown = [text for value, text in terms if value]
    return f"{' + '.join(shown) or f'0 [{empty}]'} = {total:,} B"


def _live_groups(e: Estimation, at: str, index: int, exclude: int | None) -> list[tuple[int, str]]:
    """The tensors live at a moment of the step, summed per producing op (largest first).

    ``at``: "forward" (during layer ``index``: what earlier layers allocated and that is still
    read or kept, and what the layer allocates), "end" (of forward) or "backward" (during the
    backward of layer ``index``: tensors kept by layers up to it, the caller's output, and the
    block being recomputed). The same storages the timeline adds and frees, so the sum is the
    activations of the moment; the model's inputs are the ``inputs`` line, not among them.
    """
    analysis, plan = e.analysis, e.storage_plan
    layers = analysis.layers
    sites: dict[int, int] = {}
    for position, layer in enumerate(layers):
        if layer.allocates_output:
            sites[layer.output_storage] = position
    for position, keys in (plan.adds or {}).items():
        sites.update(dict.fromkeys(keys, position))
    kept, pinned, sizes, last_use = plan.first_saver, plan.pinned, plan.sizes, plan.last_use
    groups: dict[str, list[int]] = {}  # producing op -> [bytes, tensors]
    for storage, site in sites.items():
        size = sizes[storage]
        if not size or storage == exclude:
            continue
        freed = last_use.get(storage) if storage not in kept and storage not in pinned else None
        if at == "forward":
            if site > index or (freed is not None and freed < index):
                continue
        elif freed is not None:
            continue
        elif at == "backward" and storage not in pinned and kept.get(storage, -1) > index:
            continue
        group = groups.get(layers[site].op)
        if group is None:
            group = groups[layers[site].op] = [0, 0]
        group[0] += size
        group[1] += 1
    if plan.adds is None:  # each layer's new kept tensors, freed after its own backward
        for position, op in enumerate(plan.op_sizes):
            if op.new_total and (at == "end" or position <= index):
                group = groups.setdefault(layers[position].op, [0, 0])
                group[0] += op.new_total
                group[1] += len(op.new_kept)
    terms = [
        _term(size, f"B: {count:,} tensor{'s' if count > 1 else ''} from {op} layers")
        for op, (size, count) in sorted(groups.items(), key=lambda item: -item[1][0])
    ]
    if at == "backward" and e.recompute:
        unit = checkpoint_unit(layers[index].name) or ""
        if e.recompute.get(unit):
            terms.append(_term(e.recompute[unit], f"B: block '{unit}' recomputed"))
    return terms


def _transient_terms(e: Estimation, at: str, index: int) -> list[tuple[int, str]]:
    """The temporaries of layer ``index`` in its forward or backward."""
    if at not in ("forward", "backward"):
        return []
    layer, op = e.analysis.layers[index], e.storage_plan.op_sizes[index]
    name = layer.name
    if at == "forward":
        tp = e.request.parallelism.tensor
        terms = []
        for t in layer.result.transients:
            if t.storage is Storage.CAUSAL_MASK and e.request.runtime is not Runtime.CUDA:
                continue  # not counted on CPU (the measured rule)
            numel = transient_numel(layer, t, tp)
            share = f", 1/{tp} per GPU (tensor parallel)" if numel != t.numel else ""
            terms.append(
                _term(e.sizer.storage_bytes(numel, t.storage), f"B: '{name}' {t.label}{share}")
            )
        extra = op.forward_transient - sum(size for size, _ in terms)
        if extra and tp > 1 and layer.op in INTERNAL_TENSOR_OPS:
            # the row-parallel partial sum and the all-reduced output coexist
            terms.append(_term(extra, f"B: '{name}' tensor-parallel all-reduce output"))
        elif extra:  # oneDNN convolutions hold a buffer while they run (CPU)
            kind = (
                "2 x its output"
                if layer.op in TRANSPOSED_CONV_OPS
                else "the larger of its input and output"
            )
            terms.append(_term(extra, f"B: '{name}' oneDNN buffer, {kind}"))
        return terms
    step = []
    if e.in_backward_step is not None and e.in_backward_step[1]:
        step = [
            _term(
                e.in_backward_step[1],
                f"B: optimizer step temporaries of {e.in_backward_step[2]}, in its gradient hook",
            )
        ]
    return [
        *step,
        _term(op.output, f"B: gradient of the output of '{name}'"),
        _term(
            op.backward_internal,
            f"B: gradients of the largest internal tensor of '{name}' and of its input",
            times=2,
        ),
        _term(
            op.backward_extra,
            "B: CPU backward kernel buffers"
            if e.request.runtime is Runtime.CPU
            else f"B: '{name}' cuDNN backward work space",
        ),
        _term(e.storage_plan.grad_in[index], f"B: gradients of the inputs of '{name}'"),
    ]


def explain_peak(e: Estimation, peak: Moment, parts: Mapping[str, int]) -> None:
    """Formulas of the lines that depend on the moment of the peak, from their components."""
    analysis, sizer, formulas = e.analysis, e.sizer, e.formulas
    training = e.request.mode is Mode.TRAINING
    where = (
        f"during the {peak.at} of '{analysis.layers[peak.index].name}'"
        if peak.index >= 0
        else {
            "end": "at the end of forward",
            "loss": "in the loss's backward"
            + (" (its first chunk)" if e.request.training_options.loss_chunks else ""),
            "step": "in the optimizer step",
        }[peak.at]
    )
    inputs = [
        f"{bound.numel:,} [{bound.name} elements] x {sizer.value_bytes(1, bound.kind)} [B]"
        for bound in analysis.inputs
    ]
    if training:
        inputs.append(f"{e.labels_rows:,} [int64 labels] x 8 [B]")
    formulas["inputs"] = f"{' + '.join(inputs) or '0'} = {parts['inputs']:,} B"
    if "buffers" in parts:
        buffers: dict[str, list[int]] = {}
        for layer in analysis.layers:
            if layer.result.buffers_bytes:
                group = buffers.setdefault(layer.op, [0, 0])
                group[0] += layer.result.buffers_bytes
                group[1] += 1
        formulas["buffers"] = _sum(
            [
                _term(
                    size, f"B: {count:,} {op} layer{'s' if count > 1 else ''}: running statistics"
                )
                for op, (size, count) in buffers.items()
            ],
            parts["buffers"],
            "B",
        )
    cached = parts.get("weight_cast_cache", 0)
    if e.cast_cache_bytes > cached and "weight_cast_cache" in parts:  # some GEMMs' backward ran
        base = formulas["weight_cast_cache"].rsplit(" = ", 1)[0]
        formulas["weight_cast_cache"] = (
            f"{base} - {e.cast_cache_bytes - cached:,} [B: copies of the layers whose backward "
            f"ran before this moment ({where}): their GEMM's saved 16-bit weight released] "
            f"= {cached:,} B"
        )
    offload = e.offload_terms.get(peak.at) or e.offload_terms.get(
        "end" if peak.at == "loss" else ""
    )
    if "activations" in parts and offload is not None:
        held = list(offload)
        if "outputs" in parts:  # the output is its own line at a backward peak (0 B remain)
            held[0] = (held[0][0] - parts["outputs"], "B: held by the caller besides the output")
        formulas["activations"] = f"[{where}, activation_offload] " + _sum(
            [_term(size, words) for size, words in held], parts["activations"], "B: none"
        )
    elif "activations" in parts:
        dropped = e.output_dropped and peak.at in ("backward", "loss")
        exclude = analysis.output_storage if "outputs" in parts or dropped else None
        formulas["activations"] = f"[{where}] " + _sum(
            _live_groups(e, "end" if peak.at == "loss" else peak.at, peak.index, exclude),
            parts["activations"],
            "B: none",
        )
    if "transient" in parts:
        if peak.at == "step":
            formulas["transient"] = f"{e.step_transient} = {parts['transient']:,} B"
        elif peak.at in e.loss_transient:
            size, words = e.loss_transient[peak.at]
            formulas["transient"] = f"[{where}] " + _sum(
                [(size, words)], parts["transient"], "B: none"
            )
        else:
            formulas["transient"] = f"[{where}] " + _sum(
                _transient_terms(e, peak.at, peak.index), parts["transient"], "B: none"
            )
    if training and peak.at != "step":
        terms = [f"{e.held_grads} [{e.held_words}]"] if e.held_grads else []
        if e.in_backward_step is not None and peak.at == "backward":
            grad, _, label = e.in_backward_step
            terms.append(f"{grad:,} [B: gradient of {label}, freed by its optimizer hook]")
        if peak.at == "backward":
            grads = Counter(
                layer.result.params
                for layer, size in zip(
                    analysis.layers[peak.index :], e.grad_layers[peak.index :], strict=True
                )
                if size
            )
            terms += [
                f"{count:,} [layers] x {e.grad_term.format(params=params)}"
                for params, count in sorted(grads.items(), key=lambda item: -item[0])
            ]
        ran = (
            f"[{where}: gradients of the layers whose backward ran] "
            if peak.at == "backward"
            else f"[{where}: no backward has run yet] "
        )
        formulas["gradients"] = f"{ran}{' + '.join(terms) or '0'} = {parts['gradients']:,} B"
    if "loss" in parts:
        formulas["loss"] = f"{e.loss} = {parts['loss']:,} B"


def layer_view(e: Estimation) -> tuple[LayerMemory, ...]:
    """Per layer: output, parameters, FLOPs and what it keeps for backward."""
    analysis, request, sizer, storage_plan = e.analysis, e.request, e.sizer, e.storage_plan
    training = request.mode is Mode.TRAINING
    layers_view: list[LayerMemory] = []
    first_saver = storage_plan.first_saver
    layer_saved = kept_storages(storage_plan)
    for index, layer in enumerate(analysis.layers):
        new_saved = sum(
            storage_plan.sizes.get(key, 0)
            for key in layer_saved[index]
            if first_saver.get(key) == index
        )
        layers_view.append(
            LayerMemory(
                name=layer.name,
                op=layer.op,
                output_shape=layer.output_shape,
                params=layer.params,
                flops=layer.flops,
                output_bytes=sizer.value_bytes(layer.output_numel, layer.output_kind),
                saved_bytes=new_saved,
                kept=_kept_tensors(layer, sizer, request) if training else (),
            )
        )
    return tuple(layers_view)


def logits_note(analysis: GraphAnalysis) -> str:
    """Which positions a decoder's output head computed at inference."""
    if analysis.logits is not Logits.LAST:
        if analysis.logits_requested is Logits.LAST:
            return (
                "logits: every position (logits=last asked for, but no linear output head reads "
                "a [N, S, D] hidden state at the top level)"
            )
        return "logits: every position"
    shape = ", ".join(f"{d:,}" for d in analysis.output_shape)
    return (
        f"logits: last position only: '{analysis.logits_head}' runs on hidden[:, -1:, :] and "
        f"outputs [{shape}], as serving stacks do (logits=last)"
    )


_SOURCES = {"in0": "input", "in0_fp32": "input", "out": "output", "new": "new"}


def _kept_tensors(
    layer: LayerAnalysis, sizer: Sizer, request: MemoryRequest
) -> tuple[KeptTensor, ...]:
    """What a layer keeps for backward, with storage dtypes for this precision and runtime."""
    act = convention(request.precision).activation_dtype.value
    kept = []
    for item in saved_for_backward(layer, request):
        if request.checkpointing is Checkpointing.SELECTIVE and item.label in ATTENTION_MATRICES:
            continue
        source = _SOURCES.get(item.source, "new")
        storage = item.storage
        if item.source == "in0_fp32" and act != "fp32":
            source = "new"  # a fp32 copy of a 16-bit input
        if storage is Storage.ACT:
            dtype = act
        elif storage is Storage.MASK:
            dtype = "bool" if request.runtime is Runtime.CUDA else act
        else:
            dtype = storage.value
        kept.append(
            KeptTensor(
                label=item.label,
                source=source,
                elements=item.numel,
                dtype=dtype,
                bytes=sizer.storage_bytes(item.numel, storage),
            )
        )
    return tuple(kept)
