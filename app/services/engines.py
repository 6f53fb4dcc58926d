"""Serving-engine memory use case: vLLM's start-up memory for a stored decoder on a catalog GPU."""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sqlalchemy.orm import Session

from app.db.repositories import HardwareRepository, ModelRepository
from app.domain.engines.profile_forward import (
    GraphForwardPeak,
    ProfileGraphError,
    graph_forward_peak,
)
from app.domain.engines.quantization import (
    SOURCES as QUANTIZATION_SOURCES,
)
from app.domain.engines.quantization import (
    QuantizedWeights,
    quantized_stage_weights,
    resolve_scheme,
)
from app.domain.engines.vllm import (
    VLLM_0_19,
    EngineInputError,
    EngineMemory,
    EngineProfile,
    ResolvedOptions,
    ServingModel,
    VllmOptions,
    decoder_stage_weights_bytes,
    engine_memory,
    forward_peak_bytes,
    graph_forward_peak_bytes,
    resolve_options,
    sampler_peak_bytes,
)
from app.domain.graph.analysis import InputDecl
from app.domain.precision import ComputeCapability
from app.domain.units import GIB
from app.domain.workload import WorkloadInputError
from app.importers.hf_config import import_hf_config
from app.importers.result import ImportRejected
from app.schemas.engines import (
    EngineProfileInfo,
    EngineQuantization,
    EngineStage,
    ProfileForward,
    ResolvedVllmOptions,
    StoredQuantizedWeights,
    VllmMemoryRequest,
    VllmMemoryResponse,
)
from app.services.convert import compute_capability, input_decls
from app.services.errors import InvalidInput, NotFound
from app.services.serving_geometry import serving_model

# Options whose omission takes the engine's (or the model's) default.
_DEFAULTED = (
    "max_model_len",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "max_num_seqs",
    "block_size",
)


@dataclass(frozen=True)
class ServedGraph:
    """The served model's graph, for the profile forward's peak (app.domain.engines.
    profile_forward)."""

    inputs: Sequence[InputDecl]
    layers: Sequence[Mapping[str, Any]]
    default_bindings: Mapping[str, int]
    key: str = ""  # a stored graph's version key (app.services.convert.model_graph); "": hash it


class ShowsMemory(Protocol):
    """A GPU (a stored row or a spec; a MIG slice's spec) as far as its memory goes."""

    @property
    def memory_bytes(self) -> int: ...
    @property
    def cuda_visible_memory_bytes(self) -> int | None: ...
    @property
    def cuda_visible_memory_source(self) -> str | None: ...


def visible_memory(device: ShowsMemory, override: int | None = None) -> tuple[int, str]:
    """The memory one GPU (or MIG slice) shows to CUDA [B] and where the figure comes from:
    the request's override, the catalog's measured ``cuda_visible_memory_bytes`` (an H100
    80GB: 79.19 GiB), or, not measured, the catalog's ``memory_bytes``."""
    if override is not None:
        return override, "request (cuda_visible_bytes)"
    if device.cuda_visible_memory_bytes is not None:
        return device.cuda_visible_memory_bytes, (
            f"hardware catalog cuda_visible_memory_bytes: {device.cuda_visible_memory_source}"
        )
    return device.memory_bytes, (
        "hardware catalog memory_bytes (no measured CUDA-visible figure: the pool may be "
        "sized a little high)"
    )


def vllm_memory(session: Session, *, payload: VllmMemoryRequest) -> VllmMemoryResponse:
    """vLLM's memory at start-up for ``payload`` (see :func:`prepare_vllm_memory`)."""
    return prepare_vllm_memory(session, payload=payload)()


def prepare_vllm_memory(
    session: Session, *, payload: VllmMemoryRequest
) -> Callable[[], VllmMemoryResponse]:
    """Load the model and GPU (404 when unknown) and map the graph to its geometry (422 naming
    ``/model`` when it is no Llama-style decoder); the returned function computes the answer
    without the database (app.api.compute). Closed-form per stage: no work budget."""
    if payload.hf_config is not None:
        if payload.model is not None:
            raise InvalidInput(
                "give the model as a stored slug (model) or as a config.json (hf_config), not both",
                pointer="/hf_config",
            )
        label, model, config_quantization, graph = _hf_import(payload.hf_config)
    else:
        if payload.model is None:
            raise InvalidInput(
                "model is required (a stored slug), unless hf_config gives the model's config.json",
                pointer="/model",
            )
        row = ModelRepository(session).get(payload.model)
        if row is None:
            raise NotFound(f"model '{payload.model}' does not exist; GET /v1/models lists them")
        label, config_quantization = row.slug, row.quantization_config
        model = serving_model(row.slug, row.layers, row.default_bindings)
        if row.torch_dtype is not None:  # a stored checkpoint's torch_dtype, as `--dtype auto`
            model = replace(model, dtype=auto_dtype(row.torch_dtype))
        graph = ServedGraph(input_decls(row.inputs), row.layers, row.default_bindings)
    quantization_config = checkpoint_config(
        payload.quantization_config,
        config_quantization,
        "hf_config's" if payload.hf_config is not None else "the stored model's",
        "/quantization_config",
    )
    gpu = HardwareRepository(session).get(payload.hardware)
    if gpu is None:
        raise NotFound(
            f"hardware profile '{payload.hardware}' does not exist; GET /v1/hardware lists them"
        )
    if gpu.kind != "gpu":
        raise InvalidInput(
            f"'{payload.hardware}' is a {gpu.kind}, not a GPU; vLLM's memory model is per GPU",
            pointer="/hardware",
        )
    visible, source = visible_memory(gpu, payload.cuda_visible_bytes)
    kernels = engine_kernels(compute_capability(gpu))
    return lambda: _answer(
        payload, model, visible, source, label, quantization_config, kernels, graph
    )


@dataclass(frozen=True, slots=True)
class EngineKernels:
    """Which of vLLM's quantized GEMM kernels a GPU takes, by compute capability
    (app.domain.engines.quantization): Machete on 9.0 only, FP8 Marlin (weight-only fp8)
    below 8.9."""

    hopper: bool = False
    fp8_marlin: bool = False


def engine_kernels(capability: ComputeCapability | None) -> EngineKernels:
    """The kernels of a GPU of ``capability`` (None: unknown, neither)."""
    return EngineKernels(
        hopper=capability == ComputeCapability(9, 0),
        fp8_marlin=capability is not None and capability < ComputeCapability(8, 9),
    )


def engine_weights(
    model: ServingModel,
    resolved: ResolvedOptions,
    quantization: str | None,
    quantization_config: Mapping[str, Any] | None,
    kernels: EngineKernels,
    profile: EngineProfile = VLLM_0_19,
) -> tuple[tuple[int, ...], QuantizedWeights | None]:
    """Weights on one GPU of each pipeline stage [B] and, with a quantization scheme
    (app.domain.engines.quant_schemes.resolve_scheme of ``--quantization`` and the checkpoint's
    ``quantization_config``), what its quantized linears store: the one computation behind the
    endpoint and a workload's engine. Raises EngineInputError (a method the config
    contradicts names ``quantization``; a config key ``quantization_config/<key>``)."""
    tp, pp = resolved.tensor_parallel_size, resolved.pipeline_parallel_size
    scheme = resolve_scheme(quantization, quantization_config)
    weights = decoder_stage_weights_bytes(model, tp, pp, resolved.dtype_bytes, profile)
    if scheme is None:
        return weights, None
    quantized = quantized_stage_weights(
        model,
        scheme,
        tp,
        pp,
        resolved.dtype_bytes,
        weights,
        hopper=kernels.hopper,
        fp8_marlin=kernels.fp8_marlin,
    )
    return quantized.stage_weights_bytes, quantized


# vLLM 0.19 `--dtype auto` on a CUDA GPU (vllm/config/model.py _resolve_auto_dtype): the config's
# torch_dtype, a float32 (or unstated) one down-cast to bfloat16, the first supported dtype.
_AUTO_DTYPE = {"bfloat16": "bfloat16", "float16": "float16", "float32": "bfloat16"}


def auto_dtype(torch_dtype: object) -> str:
    """vLLM's ``--dtype auto`` for a config's ``torch_dtype`` (:data:`_AUTO_DTYPE`)."""
    return _AUTO_DTYPE.get(str(torch_dtype), "bfloat16")


def checkpoint_config(
    given: dict[str, Any] | None, model: dict[str, Any] | None, whose: str, pointer: str
) -> dict[str, Any] | None:
    """The ``quantization_config`` an engine runs: the request's, else the model's (an
    hf_config's or a stored model's); both given and different is a 422 at ``pointer``."""
    if given is None:
        return model
    if model is not None and model != given:
        raise InvalidInput(
            f"quantization_config differs from {whose} quantization_config; give one (none: "
            "the model's is used)",
            pointer=pointer,
        )
    return given


def hf_serving_model(raw: dict[str, Any]) -> tuple[str, ServingModel, dict[str, Any] | None]:
    """A config.json as the engine's model: its label, geometry (imported with
    app.importers.hf_config at its full ``max_position_embeddings`` context; nothing stored),
    and its ``quantization_config`` (``None`` when it has none). 422s name ``/hf_config/...``."""
    label, model, quantization, _ = _hf_import(raw)
    return label, model, quantization


def _with_rotary(raw: Mapping[str, Any], model: ServingModel) -> ServingModel:
    """The rotary cos/sin cache's width and rows as vLLM 0.19's get_rope reads the config
    (vllm/model_executor/layers/rotary_embedding/__init__.py): ``rotary_dim = int(head_size x
    partial_rotary_factor)``; YaRN (``yarn``, ``deepseek_yarn``) builds
    ``ceil(original_max_position_embeddings x factor)`` rows (yarn_scaling_rope.py,
    deepseek_scaling_rope.py: ``torch.arange(max_position_embeddings * scaling_factor)``). Other
    scalings keep ``max_position_embeddings`` rows (the model's defaults)."""
    if model.rotary_dim == 0:
        return model
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        rope = {}
    partial = raw.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    if isinstance(partial, int | float) and 0 < partial < 1:
        head = model.mla.qk_rope_head_dim if model.mla is not None else model.head_dim
        model = replace(model, rotary_dim=int(head * partial))
    kind = rope.get("rope_type") or rope.get("type")
    factor, original = rope.get("factor"), rope.get("original_max_position_embeddings")
    if (
        kind in ("yarn", "deepseek_yarn")
        and isinstance(factor, int | float)
        and isinstance(original, int)
    ):
        model = replace(model, rotary_positions=math.ceil(original * factor))
    return model


def _hf_import(
    raw: dict[str, Any],
) -> tuple[str, ServingModel, dict[str, Any] | None, ServedGraph]:
    """:func:`hf_serving_model` and the imported graph."""
    positions = raw.get("max_position_embeddings")
    context = positions if isinstance(positions, int) and positions > 0 else None
    try:
        imported = import_hf_config(raw, sequence_length=context)
    except ImportRejected as exc:
        pointer = "/hf_config" + (exc.pointer or "").removeprefix("/config")
        if pointer == "/hf_config/sequence_length":
            pointer = "/hf_config/max_position_embeddings"
        raise InvalidInput(exc.detail, pointer=pointer) from None
    name = raw.get("_name_or_path") or raw.get("model_type")
    label = f"hf_config ({name})"[:200]
    try:
        model = serving_model(label, imported.layers, imported.default_bindings)
    except InvalidInput as exc:
        raise InvalidInput(exc.detail, pointer="/hf_config") from None
    dtype = raw.get("torch_dtype") or raw.get("dtype") or "float32"
    model = _with_rotary(raw, replace(model, dtype=auto_dtype(dtype)))
    quantization = raw.get("quantization_config")
    if quantization is not None and not isinstance(quantization, dict):
        raise InvalidInput(
            "quantization_config must be an object", pointer="/hf_config/quantization_config"
        )
    return (
        label,
        model,
        quantization,
        ServedGraph(imported.inputs, imported.layers, imported.default_bindings),
    )


# Graph peaks already computed, by (graph digest, tokens, TP, dtype): a DeepSeek-V2-Lite graph
# takes ~20-30 ms of CPU to replay at 8192 tokens, an answer from the cache none. Bounded; the
# key is the graph's content, so an edited model is a new key.
_PEAK_CACHE_SIZE = 256
_PEAK_CACHE: OrderedDict[tuple[str, int, int, str], GraphForwardPeak] = OrderedDict()
_PEAK_LOCK = threading.Lock()


def _graph_peak(graph: ServedGraph, tokens: int, tp: int, dtype: str) -> GraphForwardPeak:
    if graph.key:
        digest = "stored:" + graph.key
    else:
        content = json.dumps(
            [[(d.name, d.shape, str(d.kind)) for d in graph.inputs], graph.layers],
            sort_keys=True,
            default=str,
        )
        digest = hashlib.blake2b(content.encode(), digest_size=16).hexdigest()
    key = (digest + json.dumps(dict(graph.default_bindings), sort_keys=True), tokens, tp, dtype)
    with _PEAK_LOCK:
        cached = _PEAK_CACHE.get(key)
        if cached is not None:
            _PEAK_CACHE.move_to_end(key)
            return cached
    peak = graph_forward_peak(
        graph.inputs,
        graph.layers,
        graph.default_bindings,
        tokens=tokens,
        tensor_parallel_size=tp,
        dtype=dtype,
    )
    with _PEAK_LOCK:
        _PEAK_CACHE[key] = peak
        while len(_PEAK_CACHE) > _PEAK_CACHE_SIZE:
            _PEAK_CACHE.popitem(last=False)
    return peak


def profile_forward(
    model: ServingModel,
    resolved: ResolvedOptions,
    graph: ServedGraph | None,
    profile: EngineProfile = VLLM_0_19,
) -> ProfileForward:
    """The profile forward's peak per GPU: the graph's (app.domain.engines.profile_forward) at
    ``max_num_batched_tokens`` tokens on one tensor-parallel rank in the engine's dtype, times
    the profile's ``graph_forward_factor``; the per-architecture formula when the graph cannot
    be laid out (the reason is returned)."""
    tokens, tp = resolved.max_num_batched_tokens, resolved.tensor_parallel_size
    dtype = {4: "float32", 2: "bfloat16"}.get(resolved.dtype_bytes, "bfloat16")
    sampler = sampler_peak_bytes(model.vocab_size, resolved.max_num_seqs, profile)
    peak: GraphForwardPeak | None = None
    reason = "no graph"
    if graph is not None:
        try:
            peak = _graph_peak(graph, tokens, tp, dtype)
        except (ProfileGraphError, WorkloadInputError) as exc:
            reason = str(exc)
    if peak is not None:
        factor = profile.graph_forward_factor
        forward = graph_forward_peak_bytes(peak.peak_bytes, profile)
        return ProfileForward(
            source="graph",
            tokens=tokens,
            tensor_parallel_size=tp,
            graph_peak_bytes=peak.peak_bytes,
            attention=peak.attention,
            graph_peak_at=peak.where or None,
            graph_peak_parts=dict(peak.lines),
            factor=factor,
            forward_peak_bytes=forward,
            sampler_peak_bytes=sampler,
            formula=f"ceil({factor} [graph_forward_factor] x {peak.peak_bytes:,} [B: graph peak "
            f"of {tokens:,} tokens on one of {tp} tensor-parallel ranks, {peak.attention} "
            f"attention]) = {forward:,} B",
        )
    factor = profile.forward_activation_factor
    forward = forward_peak_bytes(model, tokens, tp, resolved.dtype_bytes, profile)
    per_token = f"{model.experts_per_token} x 3 x {model.intermediate_size} / {tp} + 2 x " + str(
        model.hidden_size
    )
    return ProfileForward(
        source="formula",
        tokens=tokens,
        tensor_parallel_size=tp,
        factor=factor,
        forward_peak_bytes=forward,
        sampler_peak_bytes=sampler,
        formula=f"ceil({factor} [forward_activation_factor] x {tokens:,} [tokens] x "
        f"{resolved.dtype_bytes} [B] x ({per_token})) = {forward:,} B",
        fallback_reason=reason,
    )


def engine_stages(memory: EngineMemory) -> list[EngineStage]:
    """The engine's figures per pipeline stage as the API shows them."""
    return [
        EngineStage(
            stage=i,
            layers=s.layers,
            weights_bytes=s.weights_bytes,
            rotary_cache_bytes=s.rotary_cache_bytes,
            profile_peak_bytes=s.peak_bytes,
            non_torch_bytes=s.non_torch_bytes,
            kv_pool_bytes=s.kv_pool_bytes,
            kv_bytes_per_token=s.kv_bytes_per_token,
            kv_tokens=s.kv_tokens,
        )
        for i, s in enumerate(memory.stages)
    ]


@dataclass(frozen=True)
class EngineStart:
    """The engine's start-up on one device: options resolved, weights per stage (and what the
    quantized linears store), the profile forward's peak and where it comes from, and the
    start-up memory. One computation for POST /v1/engines/vllm/memory and a workload's engine
    (app.services.engine_fit), so both answer the same bytes."""

    resolved: ResolvedOptions
    weights: tuple[int, ...]
    quantized: QuantizedWeights | None
    forward: ProfileForward
    memory: EngineMemory


def engine_start(
    model: ServingModel,
    options: VllmOptions,
    visible_bytes: int,
    *,
    graph: ServedGraph | None,
    quantization: str | None,
    quantization_config: Mapping[str, Any] | None,
    kernels: EngineKernels,
    profile: EngineProfile = VLLM_0_19,
) -> EngineStart:
    """The engine's start-up memory on a device showing ``visible_bytes`` to CUDA: weights
    (:func:`engine_weights`), the profile forward's peak from the model's graph
    (:func:`profile_forward`; the formula only when the graph cannot be laid out), then
    app.domain.engines.vllm.engine_memory. Raises EngineInputError for an option the engine
    refuses (``field`` names it)."""
    resolved = resolve_options(options, model, visible_bytes, profile)
    if resolved.pipeline_parallel_size > model.layers:
        raise EngineInputError(
            f"pipeline_parallel_size {resolved.pipeline_parallel_size} exceeds the model's "
            f"{model.layers} decoder layers",
            field="pipeline_parallel_size",
        )
    weights, quantized = engine_weights(
        model, resolved, quantization, quantization_config, kernels, profile
    )
    forward = profile_forward(model, resolved, graph, profile)
    memory = engine_memory(
        model,
        options,
        visible_bytes,
        weights,
        profile=profile,
        forward_peak=forward.forward_peak_bytes,
    )
    return EngineStart(resolved, weights, quantized, forward, memory)


def _answer(
    payload: VllmMemoryRequest,
    model: ServingModel,
    visible: int,
    source: str,
    label: str,
    quantization_config: dict[str, Any] | None,
    kernels: EngineKernels,
    graph: ServedGraph | None = None,
) -> VllmMemoryResponse:
    options = VllmOptions(
        max_model_len=payload.max_model_len,
        gpu_memory_utilization=payload.gpu_memory_utilization,
        max_num_batched_tokens=payload.max_num_batched_tokens,
        max_num_seqs=payload.max_num_seqs,
        block_size=payload.block_size,
        dtype=payload.dtype,
        kv_cache_dtype=payload.kv_cache_dtype,
        tensor_parallel_size=payload.tensor_parallel_size,
        pipeline_parallel_size=payload.pipeline_parallel_size,
        enforce_eager=payload.enforce_eager,
    )
    try:
        start = engine_start(
            model,
            options,
            visible,
            graph=graph,
            quantization=payload.quantization,
            quantization_config=quantization_config,
            kernels=kernels,
        )
    except EngineInputError as exc:
        raise InvalidInput(str(exc), pointer=f"/{exc.field}") from None
    resolved, quantized, forward, memory = (
        start.resolved,
        start.quantized,
        start.forward,
        start.memory,
    )
    defaults = [name for name in _DEFAULTED if getattr(payload, name) is None]
    defaults += [name for name in ("dtype", "kv_cache_dtype") if getattr(payload, name) == "auto"]
    dtype = model.dtype if payload.dtype == "auto" else payload.dtype
    kv_dtype = dtype if payload.kv_cache_dtype == "auto" else payload.kv_cache_dtype
    stages = engine_stages(memory)
    context = model.max_position_embeddings
    assumptions = [
        f"GPU memory visible to CUDA {visible / GIB:.2f} GiB: {source}",
        "weights: decoder sharded as vLLM loads it "
        "(app.domain.engines.vllm.decoder_stage_weights_bytes: vocabulary padded to 64, "
        "embedding on the first stage, final norm and head on the last, KV heads replicated "
        "past the tensor-parallel degree)"
        + (
            ""
            if quantized is None
            else f"; quantized linears as {quantized.scheme.describe()}, stored as vLLM 0.19 "
            "keeps them after loading (app.domain.engines.quantization)"
        ),
        (
            f"profile forward peak from the model's graph: one inference forward of "
            f"{forward.tokens:,} tokens (max_num_batched_tokens; vLLM 0.19 GPUModelRunner."
            "_dummy_run flattens its dummy requests into one token batch) on one of "
            f"{forward.tensor_parallel_size} tensor-parallel ranks, {forward.attention} "
            "attention, no KV cache (the profile runs before it exists), no logits over all "
            "tokens: "
            f"{forward.graph_peak_bytes or 0:,} B per rank"
            + (f" ({forward.graph_peak_at})" if forward.graph_peak_at else "")
            + f", x {forward.factor} (graph_forward_factor, fit on cluster F) = "
            f"{forward.forward_peak_bytes:,} B; the last stage takes the larger of it and the "
            f"dummy sampler run's {forward.sampler_peak_bytes:,} B"
            if forward.source == "graph"
            else "profile forward peak: the engine profile's fitted formula over "
            "max_num_batched_tokens (app.domain.engines.vllm.forward_peak_bytes), because the "
            f"graph could not be laid out: {forward.fallback_reason}"
        ),
        f"model dtype {model.dtype}: "
        + (
            "the config's torch_dtype as vLLM's `auto` takes it (float32 or none: bfloat16)"
            if payload.hf_config is not None
            else "stored graphs state none, so `auto` is bfloat16"
        ),
        "max_model_len is bounded by the model's default `seq` binding "
        f"({context} tokens, taken as its context)"
        if context is not None
        else "the model has no default `seq` binding, so max_model_len is not bounded by a "
        "context and must be given",
        f"rotary cos/sin cache {memory.stages[0].rotary_cache_bytes:,} B on each GPU: "
        "vllm/model_executor/layers/rotary_embedding/base.py (0.19) RotaryEmbedding builds "
        "max_position_embeddings x rotary_dim in the model dtype with the model, one instance "
        "shared by every layer (get_rope's _ROPE_DICT); not a weight, but part of vLLM's "
        "'Model loading took' and of what the KV pool is left after",
        "the CUDA-graph pool is captured after KV sizing in vLLM 0.19 and is not subtracted",
    ]
    if model.experts > 1:
        assumptions.append(
            f"mixture of {model.experts} experts, {model.experts_per_token} per token: every "
            "expert's weights held, the profile forward activates experts_per_token"
        )
    return VllmMemoryResponse(
        model=label,
        hardware=payload.hardware,
        gpus=resolved.tensor_parallel_size * resolved.pipeline_parallel_size,
        cuda_visible_bytes=visible,
        cuda_visible_source=source,
        requested_bytes=memory.requested_bytes,
        weights_bytes=max(s.weights_bytes for s in memory.stages),
        rotary_cache_bytes=memory.stages[0].rotary_cache_bytes,
        profile_peak_bytes=max(s.peak_bytes for s in memory.stages),
        non_torch_bytes=memory.stages[0].non_torch_bytes,
        cuda_graph_pool_bytes=memory.cuda_graph_pool_bytes,
        kv_pool_bytes=min(s.kv_pool_bytes for s in memory.stages),
        kv_tokens=memory.kv_tokens,
        max_concurrency=memory.max_concurrency,
        starts=memory.starts,
        reason=memory.reason,
        stages=stages,
        options=ResolvedVllmOptions(
            dtype=dtype,
            kv_cache_dtype=kv_dtype,
            dtype_bytes=resolved.dtype_bytes,
            kv_cache_dtype_bytes=resolved.kv_cache_dtype_bytes,
            tensor_parallel_size=resolved.tensor_parallel_size,
            pipeline_parallel_size=resolved.pipeline_parallel_size,
            max_model_len=resolved.max_model_len,
            max_num_batched_tokens=resolved.max_num_batched_tokens,
            max_num_seqs=resolved.max_num_seqs,
            gpu_memory_utilization=resolved.gpu_memory_utilization,
            block_size=resolved.block_size,
            enforce_eager=resolved.enforce_eager,
            quantization=None if quantized is None else quantized.scheme.method,
        ),
        defaults_used=defaults,
        quantization=_quantization(quantized),
        engine=EngineProfileInfo(
            name=VLLM_0_19.name, version=VLLM_0_19.version, sources=dict(VLLM_0_19.sources)
        ),
        profile_forward=forward,
        assumptions=assumptions,
    )


def _quantization(quantized: QuantizedWeights | None) -> EngineQuantization | None:
    """The scheme and what it stores on the GPU of the stage holding the most weights."""
    if quantized is None:
        return None
    index = max(range(len(quantized.stages)), key=lambda i: quantized.stages[i].weights_bytes)
    stage = quantized.stages[index]
    scheme = quantized.scheme
    return EngineQuantization(
        method=scheme.method,
        scheme=scheme.describe(),
        checkpoint=scheme.checkpoint,
        stage=index,
        stored=StoredQuantizedWeights(
            packed_weight_bytes=stage.stored.packed_bytes,
            scale_bytes=stage.stored.scale_bytes,
            zero_point_bytes=stage.stored.zero_point_bytes,
            g_idx_bytes=stage.stored.g_idx_bytes,
        ),
        kernels=list(quantized.kernels),
        unquantized_bytes=stage.unquantized_bytes,
        quantized_modules=stage.quantized_modules,
        skipped_modules=stage.skipped_modules,
        sources={
            key: QUANTIZATION_SOURCES[key]
            for key in (scheme.method, "override")
            if key in QUANTIZATION_SOURCES
        },
    )
