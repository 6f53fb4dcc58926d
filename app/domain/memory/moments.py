"""The moments of a step whose largest is the peak: a training step (forward, backward,
optimizer step; first and steady iteration) or an inference forward with its KV cache."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction

from app.domain.memory.adapters import (
    adapter_transient,
    adapters_on_gpu,
    adapters_outside_units,
    dora_saved,
    inference_adapters,
)
from app.domain.memory.adapters import offloaded_adapters as offloaded_adapters_of
from app.domain.memory.casts import released_casts, uncast_copies
from app.domain.memory.context import Estimation, Moment, StepTensors, moment_at
from app.domain.memory.cross_kv import cross_attention_kv_numel
from app.domain.memory.deepspeed import deepspeed_buffers
from app.domain.memory.formulas import (
    PrecisionPlan,
    TemporariesLayout,
    bnb_adamw_state,
    ceil_fraction,
    ddp_bucket_sizes_bytes,
    fsdp_buffer_bytes,
    gradient_bytes,
    kv_cache_bytes,
    loss_bytes,
    loss_expression,
    optimizer_state_bytes,
    optimizer_step_temporaries,
)
from app.domain.memory.frozen import trainable_lines
from app.domain.memory.liveness import (
    UNCAST_OPS,
    Peak,
    apply_full_checkpointing,
    backward_peak,
    build_timeline,
    cast_params,
    checkpoint_unit,
    forward_peak,
    layer_gradient_bytes,
    offload_peaks,
)
from app.domain.memory.loss import NO_LOSS, LossTensors, chunk_sizes, chunked_loss, loss_tensors
from app.domain.memory.loss import SOURCE as LOSS_SOURCE
from app.domain.memory.memo import memoised
from app.domain.memory.rank_share import request_rank_share
from app.domain.memory.returned_cache import returned_cache
from app.domain.peft import LoraPlan
from app.domain.precision import bytes_per_element, convention
from app.domain.workload import (
    Checkpointing,
    LossKind,
    Optimizer,
    Parallelism,
)


def training_moments(e: Estimation) -> tuple[list[Moment], list[Moment]]:
    """First-iteration and steady-state moments of one training step."""
    analysis, request, plan, sizer = e.analysis, e.request, e.plan, e.sizer
    storage_plan, lines_static, inputs_bytes = e.storage_plan, e.static, e.inputs_bytes
    formulas, notes, assumptions = e.formulas, e.notes, e.assumptions
    par = request.parallelism
    model_shard = par.tensor * par.pipeline
    params, shapes = e.params, analysis.param_shapes
    lora = e.lora
    if lora is not None:  # a frozen base: only the adapters (and modules_to_save) train
        params, shapes = lora.trainable_params, list(lora.adapter_shapes)
        plan = _lora_plan(plan)
    first_moments: list[Moment] = []
    steady_moments: list[Moment] = []
    grad_shard = model_shard * (par.data if par.zero_stage >= 2 else 1)
    grad_element = plan.grad
    if plan.master and request.fp32_grad_buffer:
        # Megatron's main_grad: gradients accumulate straight into an fp32 buffer.
        grad_element = Fraction(4)
        assumptions.append("gradients accumulate in an fp32 buffer (Megatron main_grad)")
    grad_bytes = gradient_bytes(params, grad_element, grad_shard)
    state_full, state_note = optimizer_state_bytes(shapes, params, request.optimizer, plan)
    state_shard = model_shard * (par.data if par.zero_stage >= 1 else 1)
    state_bytes = ceil_fraction(Fraction(state_full, state_shard))
    master = ceil_fraction(Fraction(params * plan.master, state_shard))
    labels_rows = math.prod(analysis.output_shape[:-1]) if analysis.output_shape else 1
    labels_bytes = labels_rows * 8
    step_temporaries = optimizer_step_temporaries(shapes, params, request, plan)
    copies = trainable_lines(lora, request, plan, e.plan, grad_shard) if lora else None
    if copies is not None and lora is not None and lora.saved_params:  # at the base's dtype
        grad_bytes, state_full, state_note = (
            copies.grad_bytes,
            copies.state_bytes,
            copies.state_note,
        )
        state_bytes = ceil_fraction(Fraction(state_full, state_shard))
        step_temporaries = copies.temporaries
    temporaries_full, temp_note = step_temporaries.bytes, step_temporaries.note
    shard_words = _shard_words(par)
    temporaries = ceil_fraction(Fraction(temporaries_full, state_shard))
    options = request.training_options
    loss = 0 if options.loss is LossKind.LOGITS_SUM else loss_bytes(analysis, sizer)
    logits_bytes = storage_plan.sizes.get(analysis.output_storage, 0)
    loss_parts = NO_LOSS if options.loss_chunks else loss_tensors(analysis, logits_bytes, loss)
    chunk_grad = chunk_upcast = 0
    if options.loss_chunks is not None:
        chunk_grad, chunk_upcast = chunk_sizes(e, loss, options.loss_chunks, logits_bytes)
    e.step = StepTensors(
        grad_element=grad_element,
        grad_shard=grad_shard,
        state_total=state_bytes,
        master_total=master,
        cache_total=params * plan.weight_cache // model_shard if plan.weight_cache else 0,
        labels_bytes=labels_bytes,
        loss_bytes=loss,
        loss_upcast_bytes=loss_parts.upcast_bytes or chunk_upcast,
        loss_grad_bytes=loss_parts.grad_bytes,
        loss_chunk_bytes=chunk_grad,
        temporaries_total=ceil_fraction(Fraction(temporaries_full, state_shard)),
        temporaries_largest=step_temporaries.layout is TemporariesLayout.LARGEST_TWICE,
        accumulate=request.accumulation_steps > 1 or request.training_options.keep_gradients,
        in_backward=request.training_options.optimizer_in_backward,
    )
    e.step_transient = (
        f"ceil({temporaries_full:,} [B: {temp_note}] / {state_shard} [{shard_words(1)}])"
    )
    cache = params * plan.weight_cache // model_shard if plan.weight_cache else 0
    cast_words = f"{params:,} [params]"
    if cache and lora is None:  # the layers autocast casts a weight for (cast_params)
        casting = sum(cast_params(analysis))
        cache = casting * plan.weight_cache // model_shard
        cast_words = f"{casting:,} [params autocast casts: all but embeddings and norms]"
    elif cache and lora is not None and (uncast := uncast_copies(e, lora)):
        cache = (params - uncast) * plan.weight_cache // model_shard
        cast_words = (
            f"({params:,} [params] - {uncast:,} [modules_to_save copies of embeddings and "
            "norms: autocast casts none])"
        )
    recompute: dict[str, int] = {}
    if request.checkpointing is Checkpointing.FULL:
        recompute = apply_full_checkpointing(analysis, storage_plan)
        if not recompute:
            assumptions.append("full checkpointing: the graph has no repeated blocks; no effect")
    offloaded = par.cpu_offload  # ZeRO-2/3 CPU offload: the partitions live on the host
    host_master = master
    if offloaded and par.zero_stage >= 3:
        e.host["offloaded_weights"] = lines_static["weights"]
        formulas["offloaded_weights"] = formulas["weights"]
        lines_static = {**lines_static, "weights": 0}
        gathers = "zero_gathered_params" if par.uses_deepspeed else "fsdp_buffers"
        formulas["weights"] = (
            "0 [B: the ZeRO-3 shard lives in host memory (parallelism.cpu_offload); the GPU "
            f"gathers what runs: {gathers}] = 0 B"
        )
    if offloaded:
        master = 0
    base = {**lines_static, "inputs": inputs_bytes + labels_bytes}
    if master:
        base["master_weights"] = master
    if cache:
        base["weight_cast_cache"] = cache
    buckets = _ddp_buckets(e, grad_bytes)
    if buckets:
        base["ddp_buckets"] = buckets
    gathered = _fsdp_buffers(e, grad_element)
    if gathered:
        base["fsdp_buffers"] = gathered
    base.update(deepspeed_buffers(e))
    in_backward = options.optimizer_in_backward
    accumulate = (request.accumulation_steps > 1 or options.keep_gradients) and not in_backward
    _paged_state(e, shapes, state_shard, shard_words(1))
    adapter_saved = adapter_temp = 0
    if lora is not None:
        adapter_weights = _lora_static(e, lora, grad_element, grad_shard, model_shard)
        base["adapter_weights"] = adapter_weights
        lines_static = {**lines_static, "adapter_weights": adapter_weights}
        adapter_saved = _lora_saved(e, lora, recompute)
        adapter_temp = adapter_transient(e, lora)  # QLoRA dequantization, DoRA weight norm
    adapter_early = adapters_outside_units(e, adapter_saved) if recompute else adapter_saved
    if accumulate or in_backward or offloaded:
        grad_layers = [0] * len(analysis.layers)
    elif e.grad_tensors is not None:  # LoRA: each layer's trainable tensors (set_to_none)
        grad_layers = [sum(tensors) for tensors in e.grad_tensors]
    else:
        grad_layers = layer_gradient_bytes(analysis, grad_element, grad_shard)
    timeline = build_timeline(storage_plan)
    fwd_peak, end_bytes = forward_peak(storage_plan, timeline)
    fwd_end = Peak(activations=end_bytes)
    # the loop keeps the loss, not the output: the logits die once the loss is computed
    # (Trainer.compute_loss returns the loss alone, torchtune's recipes ``del logits``)
    e.output_dropped = (
        bool(loss_parts.grad_bytes or chunk_grad)
        and _output_droppable(e)
        and not options.keep_outputs
    )
    dropped = storage_plan.sizes.get(analysis.output_storage, 0) if e.output_dropped else 0
    casts = e.released_casts = released_casts(e, cache, model_shard)
    e.cast_cache_bytes = cache
    bwd_peak = backward_peak(
        analysis, storage_plan, timeline, end_bytes - dropped, grad_layers, recompute, casts
    )
    if options.activation_offload:
        offloaded_adapters = offloaded_adapters_of(e, recompute) if lora is not None else {}
        if offloaded_adapters:  # on the host: what stays is the recomputed block's only
            adapter_saved = adapters_on_gpu(e, adapter_saved, offloaded_adapters)
            adapter_early = max(0, adapter_early - sum(offloaded_adapters.values()))
            e.offloaded_adapters, e.adapter_early = offloaded_adapters, None
        off = offload_peaks(
            analysis, storage_plan, grad_layers, recompute, offloaded_adapters, dropped
        )
        fwd_peak, fwd_end, bwd_peak = off.forward, off.end, off.backward
        end_bytes = off.end.activations
        e.offload_terms = off.terms
        if off.host_bytes:
            e.host["offloaded_activations"] = off.host_bytes
            e.formulas["offloaded_activations"] = (
                f"{off.host_bytes:,} [B: pinned host copies of the {off.offloaded:,} tensors "
                f"kept for backward] = {off.host_bytes:,} B"
            )
            e.notes["offloaded_activations"] = [
                "torchtune OffloadActivations (use_pin_memory=True): pinned CPU memory, held "
                "from the forward until each tensor's backward; not GPU memory"
            ]
        assumptions.append(
            "activation_offload: tensors kept for backward are copied to pinned host memory "
            "(torchtune OffloadActivations / torch.autograd.graph.save_on_cpu), the LoRA "
            "adapters' too; on the GPU a "
            "kept tensor stays while the forward reads it and one layer more (the copy in "
            "flight), and comes back for the backward of the layer after its last keeper "
            "(prefetch) until its earliest keeper's backward; the allocator replay "
            "(allocator_rounding, fragmentation_reserve) frees and copies back on the same "
            "schedule"
        )
    loss_moments: list[Peak] = []
    if options.loss_chunks is not None:
        fwd_end, loss_moments = chunked_loss(e, end_bytes, dropped, chunk_grad, chunk_upcast)
    elif loss_parts.grad_bytes:
        fwd_end, loss_moments = _hf_loss(e, fwd_end, loss_parts, dropped)
    if in_backward:
        bwd_peak = _in_backward(e, bwd_peak, shapes, grad_element, grad_shard, state_shard)
    held_grads = {"gradients": grad_bytes} if accumulate and not offloaded else {}
    previous = _previous_outputs(e, logits_bytes) if options.keep_outputs else 0
    step_parts = {
        **lines_static,
        **({"ddp_buckets": buckets} if buckets else {}),
        "inputs": inputs_bytes + labels_bytes,
        **({"master_weights": master} if master else {}),
        "gradients": grad_bytes,
        "optimizer_state": state_bytes,
        "transient": temporaries,
    }
    saved = {"adapter_activations": adapter_saved} if adapter_saved else {}
    early = {"adapter_activations": adapter_early} if adapter_early else {}
    # a layer's temporary (DoRA's weight norm, a 4-bit weight dequantized) exists while a
    # layer runs, not at the end of the forward nor in the loss's backward
    temp = {"adapter_transient": adapter_temp} if adapter_temp else {}
    for steady in (False, True):
        static = {**base, **held_grads}
        if steady and not offloaded:
            static["optimizer_state"] = state_bytes
        if in_backward:  # the state is created in the first backward's hooks: as steady state
            static["optimizer_state"] = state_bytes
        kept = {**static, **saved, **temp}
        # before the backward recomputes a checkpointed unit, only the adapters outside keep
        between = {**static, **early}
        # keep_outputs: the previous step's outputs live until this forward returns
        previous_parts = {"previous_outputs": previous} if steady and previous else {}
        moments = [
            moment_at("forward", {**between, **temp, **previous_parts}, fwd_peak, 0),
            moment_at("forward", {**between, **previous_parts}, fwd_end, loss),
            *(moment_at("backward", between, peak, loss) for peak in loss_moments),
            # the log-probabilities die with LogSoftmaxBackward (the loss moment's), chunked
            # too: every chunk's loss backward runs before the output head's
            moment_at("backward", kept, bwd_peak, 0),
        ]
        if not in_backward and not offloaded:  # in backward / on the host: no GPU step
            moments.append(Moment(phase="optimizer_step", parts=dict(step_parts)))
        (steady_moments if steady else first_moments).extend(moments)
    grad_expression = (
        f"ceil({params:,} [trainable params] x {grad_element} [B] / {grad_shard} "
        f"[{shard_words(2)}])"
    )
    if copies is not None and lora is not None and lora.saved_params:
        grad_expression = copies.grad_words
    e.grad_layers = grad_layers
    e.grad_term = (
        f"ceil({{params:,}} [params] x {grad_element} [B] / {grad_shard} [{shard_words(2)}])"
    )
    e.held_grads = grad_expression if accumulate else ""
    if options.keep_gradients and request.accumulation_steps == 1:
        e.held_words = "kept between steps: zero_grad(set_to_none=False)"
    e.recompute = recompute
    e.labels_rows = labels_rows
    e.loss = loss_expression(analysis, sizer)
    if options.loss_chunks is not None:
        e.loss = e.loss.replace(
            "HF ForCausalLMLoss",
            f"kept by log_softmax for every one of {options.loss_chunks} chunks",
        )
    formulas.update(
        gradients=f"{grad_expression} = {grad_bytes:,} B",
        optimizer_state=f"ceil({state_full:,} [B: {state_note}] / {state_shard} "
        f"[{shard_words(1)}]) = {state_bytes:,} B",
        master_weights=f"ceil({params:,} [params] x {plan.master} [B fp32 master copy] / "
        f"{state_shard} [{shard_words(1)}]) = {host_master:,} B",
        weight_cast_cache=f"floor({cast_words} x {plan.weight_cache} [B autocast weight "
        f"copy] / {model_shard} [tensor x pipeline]) = {cache:,} B",
    )
    notes["transient"] = [temp_note]
    if offloaded:
        _host_state(e, grad_bytes, state_bytes, host_master)
    if request.accumulation_steps > 1:
        assumptions.append(
            f"gradient accumulation over {request.accumulation_steps} micro-batches: "
            "gradients persist across micro-batches; activations are per micro-batch"
        )
    if options.keep_gradients:
        assumptions.append(
            "keep_gradients: zero_grad(set_to_none=False) zeroes the gradients in place "
            "(torch/optim/optimizer.py Optimizer.zero_grad): every gradient stays allocated "
            "through the next step's forward"
        )
    if options.tokens_per_batch is not None:
        assumptions.append(
            f"packed sequences: each micro-batch is one row of {options.tokens_per_batch:,} "
            "tokens (documents concatenated, position ids restarting, flash-attention varlen "
            "with cu_seqlens: no padding). Activations, logits, loss and a fused attention's "
            "output and log-sum-exp scale with the tokens; the longest document bounds only "
            "the attention FLOPs (sum of squared document lengths, here counted as one "
            "document of all the tokens: an upper bound); eager / sdpa_math attention "
            "materialises the row's block-causal tokens x tokens scores (torchtune "
            "packed_block_causal_mask)"
        )
    if request.checkpointing is Checkpointing.SELECTIVE:
        assumptions.append("selective checkpointing: attention S x S tensors recomputed")
    if request.checkpointing is Checkpointing.FULL and recompute:
        assumptions.append(
            f"full checkpointing over {len(recompute)} repeated blocks: block inputs kept, one "
            "block recomputed at a time in backward"
        )
    return first_moments, steady_moments


def _host_state(e: Estimation, grad_bytes: int, state_bytes: int, master: int) -> None:
    """ZeRO-3 / FSDP CPU offload (PyTorch 2.13 torch/distributed/fsdp ``CPUOffload(
    offload_params=True)``: sharded parameters and their gradients on the CPU, the optimizer
    stepping there; DeepSpeed ``offload_param`` + ``offload_optimizer``): the weights,
    gradients, optimizer state and master weights shards are host lines; the GPU keeps the
    gathered units (fsdp_buffers), the activations and the step's transients."""
    formulas = e.formulas
    for key, size, formula_key in (
        ("offloaded_gradients", grad_bytes, "gradients"),
        ("offloaded_optimizer_state", state_bytes, "optimizer_state"),
        ("offloaded_master_weights", master, "master_weights"),
    ):
        if size:
            e.host[key] = size
            formulas[key] = formulas[formula_key]
    par = e.request.parallelism
    if par.zero_stage == 2:
        e.assumptions.append(
            "parallelism.cpu_offload with ZeRO-2: DeepSpeed offload_optimizer: the gradient, "
            "optimizer-state and master-weight partitions live in host memory and the "
            "optimizer steps there; the 16-bit weights stay on the GPU, each gradient passes "
            "through the reduce bucket (zero_reduce_bucket); no optimizer_step phase on the "
            "GPU; the allocator replay (rounding, cached segments) allocates no gradient, "
            "state or master weight on the GPU either"
        )
        return
    holds = (
        "the gathered parameters (zero_gathered_params) and the reduce bucket (zero_reduce_bucket)"
        if par.uses_deepspeed
        else "each unit's gathered parameters and unsharded gradients (fsdp_buffers)"
    )
    e.assumptions.append(
        "parallelism.cpu_offload: the ZeRO-3 shards of the weights, gradients, optimizer state "
        "and master weights live in host memory and the optimizer steps there (FSDP "
        "CPUOffload(offload_params=True), DeepSpeed offload_param + offload_optimizer); the "
        f"GPU holds {holds} while it runs, so no optimizer_step phase on the GPU; the "
        "allocator replay (rounding, cached segments) allocates on the GPU only those (and "
        "the buffers, activations and transients)"
    )


def _paged_state(
    e: Estimation, shapes: list[tuple[int, ...]], state_shard: int, shard_words: str
) -> None:
    """A paged bitsandbytes optimizer's state1/state2 of large tensors: unified memory
    (``cudaMallocManaged``) outside PyTorch's caching allocator, resident on the GPU while
    there is room and evicted page by page to the host under pressure (bitsandbytes 0.45+,
    bitsandbytes/functional.py ``get_paged``, optim/optimizer.py ``get_state_buffer``): it
    never raises an out-of-memory error, so it is a host line, not part of the GPU peak."""
    optimizer = e.request.optimizer
    if optimizer not in (Optimizer.PAGED_ADAMW_8BIT, Optimizer.PAGED_ADAMW_32BIT):
        return
    paged = bnb_adamw_state(shapes, optimizer).paged_bytes
    if not paged:
        return
    share = ceil_fraction(Fraction(paged, state_shard))
    e.host["paged_optimizer_state"] = share
    e.formulas["paged_optimizer_state"] = (
        f"ceil({paged:,} [B: state1 + state2 of tensors of >= 100,000 elements, paged by "
        f"{optimizer.value}] / {state_shard} [{shard_words}]) = {share:,} B"
    )
    e.notes["paged_optimizer_state"] = [
        "unified memory (cudaMallocManaged): not in torch.cuda.memory_allocated; on the GPU "
        "while it fits, evicted to host RAM when the GPU runs short (no out-of-memory error); "
        "the figure is what the host may have to hold"
    ]


def _in_backward(
    e: Estimation,
    bwd_peak: Peak,
    shapes: list[tuple[int, ...]],
    grad_element: Fraction,
    grad_shard: int,
    state_shard: int,
) -> Peak:
    """Optimizer step fused into backward (torchtune ``optimizer_in_bwd``: one optimizer per
    parameter stepped in ``Tensor.register_post_accumulate_grad_hook``, then
    ``zero_grad(set_to_none=True)``; PyTorch 2.13 torch/_tensor.py, torchtune
    training/_memory.py ``register_optim_in_bwd_hooks``): a gradient lives from its
    accumulation to its hook, so backward holds at most one parameter's gradient and that
    parameter's step temporaries at a time. The peak is bounded by the largest parameter's:
    ``ceil(largest x grad bytes / shard)`` + the step's temporaries over that one tensor."""
    request = e.request
    if not shapes:
        return bwd_peak
    largest = max(shapes, key=math.prod)
    numel = math.prod(largest)
    grad = ceil_fraction(numel * grad_element / grad_shard)
    one = optimizer_step_temporaries([largest], numel, request, e.plan)
    temporaries = ceil_fraction(Fraction(one.bytes, state_shard))
    shape = "x".join(str(d) for d in largest)
    e.in_backward_step = (grad, temporaries, f"the largest parameter ({shape})")
    e.assumptions.append(
        "optimizer_in_backward: each parameter is stepped by its own optimizer in its "
        "post-accumulate-grad hook and its gradient freed (torchtune optimizer_in_bwd); "
        f"backward holds at most one gradient, the largest parameter's ({shape}: {grad:,} B), "
        f"and its step temporaries ({one.note}: {temporaries:,} B); no optimizer_step phase"
    )
    return replace(
        bwd_peak,
        gradients=bwd_peak.gradients + grad,
        transient=bwd_peak.transient + temporaries,
    )


def _previous_outputs(e: Estimation, logits_bytes: int) -> int:
    """keep_outputs: what the previous step's ``outputs`` holds through this step's forward
    (Python rebinds ``outputs = model(**batch)`` once the call returns): the logits, and a
    decoder's returned key/value cache (transformers returns one in training when
    ``use_cache`` is on, which its models turn off under gradient checkpointing), one K and one
    V per layer over the batch's tokens in the activations' dtype, split like the KV cache.
    Stated approximation: in the step that made them the cached keys and values are charged
    with the tensors the attention saves, freed at that layer's backward (the cache keeps them
    to the step's end)."""
    request, analysis = e.request, e.analysis
    words = [f"{logits_bytes:,} [B: the previous step's logits]"]
    total = logits_bytes
    tensors = [logits_bytes]
    if analysis.is_decoder and request.checkpointing is Checkpointing.NONE:
        totals = e.totals
        element = int(bytes_per_element(convention(request.precision).kv_cache_dtype))
        shard = request.parallelism.tensor * request.parallelism.pipeline
        cache = returned_cache(
            analysis, e.sizer, totals.kv_cache_numel, element, totals.kv_layers, shard
        )
        tensors += cache.tensors
        total = logits_bytes + sum(cache.tensors)
        words.append(cache.words)
    e.previous_outputs = tensors
    e.formulas["previous_outputs"] = f"{' + '.join(words)} = {total:,} B"
    e.notes["previous_outputs"] = [
        "keep_outputs: `outputs = model(**batch)` is rebound only when the next forward "
        "returns, so the previous step's outputs are alive through this step's forward"
    ]
    e.assumptions.append(
        "keep_outputs: the loop holds the model's outputs; the logits stay through the "
        "backward, and the previous step's outputs (logits, a decoder's returned key/value "
        "cache) through the next step's forward (steady state)"
    )
    return total


def _output_droppable(e: Estimation) -> bool:
    """Whether the caller's drop frees the output (pinned: held by the caller until then): no
    layer keeps it and it is no model input. With activation offloading too: the output is
    not packed (the loss keeps its log-probabilities, not the logits), and the caller's
    ``del logits`` frees it (measured on an H200, benchmarks/fidelity/cuda/
    cuda_measurements_peft.json: GPT-2 fp32 AdamW batch 4 x 512 offloaded, allocated 2,671 MiB
    with save_on_cpu and 2,683 with torchtune, the fp32 logits' 393 MiB not held)."""
    plan, storage = e.storage_plan, e.analysis.output_storage
    return storage not in plan.first_saver and storage not in {
        bound.storage for bound in e.analysis.inputs
    }


def _hf_loss(
    e: Estimation, fwd_end: Peak, parts: LossTensors, dropped: int
) -> tuple[Peak, list[Peak]]:
    """Hugging Face's whole-sequence loss (:mod:`app.domain.memory.loss`): the fp32 upcast of
    the logits is a transient at the forward's end; the loss's backward holds the gradients
    of the log-probabilities (``nll_loss``) and of the upcast logits (``log_softmax``) beside
    the kept log-probabilities, which ``LogSoftmaxBackward`` then releases: the later backward
    moments hold no loss line. ``dropped``: the output's bytes, no longer held in backward."""
    e.loss_transient = {
        "loss": (2 * parts.grad_bytes, f"2 x {parts.grad_words} [{LOSS_SOURCE}]"),
    }
    e.assumptions.append(
        "loss: Hugging Face's cross-entropy (token logits: ForCausalLMLoss, logits.float() "
        "then F.cross_entropy); its fp32 gradients live in the loss's backward, the "
        "log-probabilities until LogSoftmaxBackward"
        + (
            "; the loop keeps the loss, not the output: the logits are freed before backward "
            "(Trainer.compute_loss, torchtune's del logits; loss=logits_sum for a loop that "
            "sums the logits and holds them)"
            if dropped
            else ""
        )
    )
    end = fwd_end
    if parts.upcast_bytes:
        e.loss_transient["end"] = (parts.upcast_bytes, f"{parts.upcast_words} [{LOSS_SOURCE}]")
        end = replace(fwd_end, transient=fwd_end.transient + parts.upcast_bytes, at="end")
    activations = fwd_end.activations - dropped
    if "loss" in e.offload_terms:  # offloaded: the last layers' copies have left as backward starts
        activations = e.offload_terms["loss"][0][0]
    at_loss = Peak(activations=activations, transient=2 * parts.grad_bytes)
    return end, [replace(at_loss, at="loss")]


def _lora_plan(plan: PrecisionPlan) -> PrecisionPlan:
    """The precision plan of LoRA's trainable tensors: PEFT keeps adapters in fp32
    (``autocast_adapter_dtype=True``), so their gradients and optimizer state are fp32 and
    need no master copy; autocast caches a cast of them (leaf tensors that require grad)."""
    return replace(plan, grad=Fraction(4), master=0, state_slot=4)


def _lora_static(
    e: Estimation, lora: LoraPlan, grad_element: Fraction, grad_shard: int, model_shard: int
) -> int:
    """The adapters' weights line (fp32), with the trainable copies of modules_to_save at the
    base's bytes per weight, and the per-layer trainable tensors the allocator replays."""
    adapter = lora.adapter_params + lora.magnitude_params + lora.bias_params
    saved = lora.saved_params
    total = ceil_fraction(Fraction(adapter * 4, model_shard) + saved * e.plan.weight / model_shard)
    num, den = grad_element.numerator, grad_element.denominator * grad_shard
    tensors: list[list[int]] = [[] for _ in e.analysis.layers]
    casts: list[list[int]] = [[] for _ in e.analysis.layers]
    cast = e.plan.weight_cache  # autocast caches casts of leaf tensors that require grad
    r = e.request.lora.r if e.request.lora is not None else 0
    trainable = [
        (module.layer, numel) for module in lora.modules for numel in lora.module_params(module, r)
    ]
    weights: list[list[int]] = [[] for _ in e.analysis.layers]
    adapters = len(trainable)
    trainable += [
        (index, math.prod(shape))
        for index, layer_shapes in zip(lora.saved_layers, lora.saved_shapes, strict=True)
        for shape in layer_shapes
    ]
    for position, (index, numel) in enumerate(trainable):
        if position < adapters:
            tensors[index].append(-(-numel * num // den))
        else:  # a modules_to_save copy: the base's gradient dtype (frozen.trainable_lines)
            tensors[index].append(ceil_fraction(numel * e.plan.grad / grad_shard))
        if cast and (position < adapters or e.analysis.layers[index].op not in UNCAST_OPS):
            casts[index].append(numel * cast // model_shard)
        element = Fraction(4) if position < adapters else e.plan.weight  # as the line's
        weights[index].append(ceil_fraction(numel * element / model_shard))
    e.cast_tensors = casts
    e.grad_tensors = tensors
    e.adapter_tensors = weights
    words = f"{adapter:,} [adapter params: r x (in + out) per adapted layer"
    words += ", + out per layer for DoRA's magnitude" if lora.magnitude_params else ""
    words += ", trainable biases" if lora.bias_params else ""
    words += "] x 4 [B fp32]"
    if saved:
        words += f" + {saved:,} [params: trainable copies of modules_to_save] x {e.plan.weight} [B]"
    e.formulas["adapter_weights"] = (
        f"ceil(({words}) / {model_shard} [tensor x pipeline]) = {total:,} B"
    )
    e.notes["adapter_weights"] = [
        f"LoRA r={r} on {len(lora.modules):,} modules; the base stays frozen: no gradients, "
        "optimizer state or master weights for it (PEFT _mark_only_adapters_as_trainable)"
    ]
    return total


def _lora_saved(e: Estimation, lora: LoraPlan, recompute: dict[str, int]) -> int:
    """What the adapters keep for backward, per adapted Linear of ``rows`` tokens
    (src/peft/tuners/lora/layer.py, ``Linear.forward``: ``x = self._cast_input_dtype(x,
    lora_A.weight.dtype)``, then ``lora_B(lora_A(dropout(x)))``, adapters in fp32):

    * lora_B keeps lora_A's output: rows x r at the adapters' compute dtype (16-bit under
      autocast, else fp32);
    * lora_A keeps its input: under autocast a 16-bit cast of x (autocast caches only weights);
      with a 16-bit base and no autocast the fp32 copy of x (the cast, or the dropout's output);
      with an fp32 base x itself (no copy), or the dropout's output when lora_dropout > 0;
    * dropout keeps its bool mask (rows x in x 1 B) when lora_dropout > 0.

    Embedding adapters keep rows x r only. Under full checkpointing only the block being
    recomputed keeps them (the largest block's), beside those outside repeated blocks.
    """
    config = e.request.lora
    assert config is not None
    plan = e.plan
    autocast = plan.weight_cache > 0
    compute = plan.weight_cache if autocast else 4
    if autocast:
        copy, rule = plan.weight_cache, "its input cast to 16-bit by autocast"
    elif plan.activation < 4:
        copy, rule = 4, "its input copied to fp32 (_cast_input_dtype)"
    elif config.dropout > 0:
        copy, rule = 4, "the dropout's output"
    else:
        copy, rule = 0, ""
    mask = 1 if config.dropout > 0 else 0
    # a ParamWrapper (DeepSeek's routed experts, the router): the parametrized weight W +
    # scaling x B @ A (peft/tuners/lora/layer.py _LoraFactorsProxy: baddbmm in W's dtype, the
    # whole E x out x in) replaces W in the forward and the experts' matmul keeps it for the
    # input's gradient; under autocast also its 16-bit cast (not a leaf: autocast's weight
    # cache skips it). An upper bound by one gate_up W': the first adapted MoE layer's input
    # needs no grad when nothing trains upstream (benchmarks/peft_params/saved_results.md)
    wrapped = int(plan.weight) + (plan.weight_cache if autocast else 0)
    per_layer: dict[int, int] = {}
    experts = False
    for module in lora.modules:
        if module.experts:
            kept = module.experts * module.in_features * module.out_features * wrapped
            experts = True
        else:
            kept = module.rows * config.r * compute
        if not module.embedding:
            kept += module.rows * module.in_features * (copy + mask)
        per_layer[module.layer] = per_layer.get(module.layer, 0) + kept
    e.adapter_saved = per_layer  # the replay's: one tensor per layer (DoRA's added below)
    layers = e.analysis.layers
    if recompute:
        units: dict[str, int] = {}
        outside = 0
        for index, kept in per_layer.items():
            unit = checkpoint_unit(layers[index].name)
            if unit is None:
                outside += kept
            else:
                units[unit] = units.get(unit, 0) + kept
        total = outside + max(units.values(), default=0)
        where = "the adapters outside repeated blocks and the largest recomputed block's"
    else:
        total = sum(per_layer.values())
        where = "every adapted Linear"
    terms = [f"rows x {config.r} [r] x {compute} [B: lora_A's output, kept by lora_B]"]
    if copy:
        terms.append(f"rows x in x {copy} [B: lora_A keeps {rule}]")
    if mask:
        terms.append(f"rows x in x 1 [B: dropout mask, lora_dropout={config.dropout}]")
    if experts:
        terms.append(
            f"experts x in x out x {wrapped} [B: each ParamWrapper's parametrized weight W + "
            "B @ A, kept by the experts' matmul]"
        )
    if config.use_dora:
        dora, dora_terms, dora_layers = dora_saved(e, lora, recompute)
        total += dora
        terms.append(dora_terms)
        for index, kept in dora_layers.items():  # replayed with LoRA's, same layer and life
            per_layer[index] = per_layer.get(index, 0) + kept
    e.formulas["adapter_activations"] = f"sum over {where} of ({' + '.join(terms)}) = {total:,} B"
    return total


def _ddp_buckets(e: Estimation, grad_bytes: int) -> int:
    """DistributedDataParallel's flat communication buckets (data > 1 without ZeRO): a second
    copy of every gradient unless gradient_as_bucket_view (torch/nn/parallel/distributed.py,
    torch/csrc/distributed/c10d/reducer.cpp; buckets are allocated when DDP wraps the model)."""
    par = e.request.parallelism
    if par.data < 2 or par.zero_stage or par.gradient_as_bucket_view or not grad_bytes:
        return 0
    buckets = ddp_bucket_sizes_bytes(grad_bytes)
    count = len(buckets)
    e.comm_buffers += buckets
    e.formulas["ddp_buckets"] = (
        f"{grad_bytes:,} [B: every gradient, copied into {count:,} flat bucket(s) of at most "
        f"25 MiB (the first 1 MiB), DDP's default gradient_as_bucket_view=False] = "
        f"{grad_bytes:,} B"
    )
    return grad_bytes


def _fsdp_buffers(e: Estimation, grad_element: Fraction) -> int:
    """FSDP / ZeRO-3: the largest wrapped unit's parameters gathered unsharded, twice (the unit
    running and the one prefetched: FSDP limit_all_gathers allows two in flight), and its
    gradients unsharded before their reduce-scatter (torch/distributed/fsdp). Units are the
    repeated blocks; the rest of the model is one unit."""
    par = e.request.parallelism
    if par.zero_stage < 3 or par.data < 2 or par.uses_deepspeed:
        return 0
    units: dict[str, int] = {}
    for layer in e.analysis.layers:
        unit = checkpoint_unit(layer.name) or "(root)"
        units[unit] = units.get(unit, 0) + layer.result.params
    largest = max(units.values(), default=0)
    if not largest:
        return 0
    buffers = fsdp_buffer_bytes(largest, e.plan.weight, grad_element, par.tensor * par.pipeline)
    lora = e.lora
    if lora is not None:  # a frozen base: only the unit's trainable tensors have gradients
        unit_of = [checkpoint_unit(layer.name) or "(root)" for layer in e.analysis.layers]
        widest = max(units, key=lambda name: units[name])
        r = e.request.lora.r if e.request.lora is not None else 0
        trainable = sum(
            sum(lora.module_params(m, r)) for m in lora.modules if unit_of[m.layer] == widest
        ) + sum(
            math.prod(shape)
            for index, layer_shapes in zip(lora.saved_layers, lora.saved_shapes, strict=True)
            if unit_of[index] == widest
            for shape in layer_shapes
        )
        unit_grads = ceil_fraction(trainable * grad_element / (par.tensor * par.pipeline))
        buffers = (buffers[0], buffers[1], unit_grads)
    weight, _, grads = buffers
    total = sum(buffers)
    e.comm_buffers += buffers
    e.formulas["fsdp_buffers"] = (
        f"2 [units: running and prefetched] x {weight:,} [B: the largest unit's "
        f"{largest:,} params gathered] + {grads:,} [B: its gradients before the reduce-scatter] "
        f"= {total:,} B"
    )
    return total


def inference_moments(e: Estimation) -> list[Moment]:
    """The forward pass of inference, with the KV cache of attention layers."""
    analysis, request, storage_plan = e.analysis, e.request, e.storage_plan
    formulas, assumptions, par = e.formulas, e.assumptions, request.parallelism
    static = {**e.static, "inputs": e.inputs_bytes}
    if e.lora is not None:  # served with LoRA adapters, merged or beside the base
        static.update(inference_adapters(e, e.lora))
    kv = 0
    if not analysis.is_decoder and request.kv_cache is not False:
        assumptions.append(
            "no KV cache: an encoder (no causal attention) attends over its whole input once"
            + (" (kv_cache=true asked for: encoders never cache)" if request.kv_cache else "")
        )
    if analysis.is_decoder and request.kv_cache is not False:
        kv_bytes = int(bytes_per_element(convention(request.precision).kv_cache_dtype))
        kv_shard = par.tensor * par.pipeline
        if kv_shard == 1:
            kv_numel = e.totals.kv_cache_numel
            kv = kv_cache_bytes(kv_numel, kv_bytes, kv_shard)
            expression = (
                f"ceil({kv_numel:,} [elements: 2 x layers x kv_heads x head_dim x seq x batch] "
                f"x {kv_bytes} [B] / {kv_shard} [tensor])"
            )
        else:
            # tensor parallel: each GPU caches max(1, kv_heads // tensor) heads per layer
            # (replicated past the KV heads); pipeline parallel: the worst stage's layers
            share, _, _ = request_rank_share(analysis, request, e.plan, e.plans)
            kv = kv_cache_bytes(share.kv_numel, kv_bytes, 1)
            where = f" of pipeline stage {share.worst}" if share.staged else ""
            divisor = (
                f", 1 / {par.pipeline} of them per stage"
                if not share.staged and par.pipeline > 1
                else ""
            )
            expression = (
                f"{share.kv_numel:,} [elements: 2 x layers{where} x KV heads per GPU, "
                f"max(1, kv_heads // {par.tensor}), x head_dim x seq x batch{divisor}] x "
                f"{kv_bytes} [B]"
            )
        cross = memoised(
            e.plans, analysis, ("cross kv",), lambda: cross_attention_kv_numel(analysis)
        )
        if cross:  # an encoder-decoder's cross-attention keys and values (cross_kv.py)
            cross_bytes = kv_cache_bytes(cross, kv_bytes, kv_shard)
            kv += cross_bytes
            expression += (
                f" + ceil({cross:,} [elements: cross-attention, 2 x decoder layers x batch x "
                f"encoder length x heads x d_kv] x {kv_bytes} [B] / {kv_shard} "
                "[tensor x pipeline])"
            )
            assumptions.append(
                "encoder-decoder generation caches each decoder layer's cross-attention keys "
                "and values of the encoder's tokens beside the self-attention's "
                "(EncoderDecoderCache)"
            )
        if kv:
            static["kv_cache"] = kv
            e.kv_bytes = kv
            formulas["kv_cache"] = f"{expression} = {kv:,} B"
    fwd_peak = memoised(  # a function of the (memoised) storage plan
        e.plans,
        analysis,
        ("forward peak", *e.plan_key[1:]),
        lambda: forward_peak(storage_plan, build_timeline(storage_plan))[0],
    )
    assumptions.append("activations live from their producer to their last consumer")

    return [moment_at("forward", static, fwd_peak, 0)]


def _shard_words(par: Parallelism) -> Callable[[int], str]:
    """Words for the divisor of state sharded from ZeRO stage ``stage`` on."""

    def words(stage: int) -> str:
        parts = ["tensor x pipeline"]
        if par.zero_stage >= stage:
            parts.append(f"ZeRO-{par.zero_stage} data ranks")
        return " x ".join(parts)

    return words
