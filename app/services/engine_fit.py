"""A workload's serving engine on a device: the shared step of the estimate's fit, the MIG fit
and plan, recommendations and admission when a workload names ``engine``.

The engine's start-up memory (app.domain.engines) on the memory a device shows to CUDA gives
the requirement (app.domain.fit.engine_requirement: the least memory on which the engine starts
with at least ``min_concurrency`` sequences of ``max_model_len`` tokens) and the verdict is
app.domain.fit.fits of that requirement against the memory shown, so it is the engine's own
start verdict. An engine option the engine refuses is a 422 naming ``/engine/<option>``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.db.models import Hardware
from app.domain.engines.choice import EngineChoice
from app.domain.engines.quant_schemes import resolve_scheme
from app.domain.engines.quantization import QuantizedWeights
from app.domain.engines.vllm import (
    EngineInputError,
    EngineMemory,
    ResolvedOptions,
    ServingModel,
    resolve_options,
)
from app.domain.fit import EngineStageNeed, Requirement, engine_requirement, fits
from app.domain.hardware import slice_cuda_visible_bytes
from app.domain.mig.layout import MigProfileSpec
from app.domain.performance.candidates import Candidate, Runnable
from app.domain.precision import ComputeCapability, Precision
from app.domain.workload import Runtime
from app.schemas.engine_options import EngineFitRead, EngineOptions
from app.schemas.engines import ProfileForward
from app.schemas.estimates import WorkloadInput
from app.services.cache import LruCache
from app.services.convert import (
    GraphSource,
    compute_capability,
    domain_engine,
    engine_choice_of,
    input_decls,
)
from app.services.engines import (
    ServedGraph,
    auto_dtype,
    checkpoint_config,
    engine_kernels,
    engine_stages,
    engine_start,
    visible_memory,
)
from app.services.errors import InvalidInput
from app.services.serving_geometry import serving_model

_GEOMETRY: LruCache[str, ServingModel] = LruCache(size=128, name="serving_geometry")


def engine_choice(spec: WorkloadInput) -> EngineChoice | None:
    """The workload's engine as the domain takes it (None: no engine)."""
    return domain_engine(spec)


def served_graph(graph: GraphSource) -> ServedGraph:
    """The graph the engine's profile forward is replayed on (app.services.engines)."""
    inputs, layers, defaults, _, key, _ = graph
    return ServedGraph(input_decls(inputs), layers, defaults, key)


def serving_geometry(graph: GraphSource) -> ServingModel:
    """The decoder geometry an engine serves, from a loaded graph (422 naming ``/model`` when it
    is no Llama-style decoder); remembered per stored graph version."""
    inputs, layers, defaults, label, key, checkpoint = graph
    if key:
        found = _GEOMETRY.get(key)
        if found is not None:
            return found
    model = serving_model(label, layers, defaults)
    if checkpoint is not None and checkpoint.torch_dtype is not None:  # `--dtype auto`
        model = replace(model, dtype=auto_dtype(checkpoint.torch_dtype))
    if key:
        _GEOMETRY.put(key, model)
    return model


@dataclass(frozen=True, slots=True)
class EngineDevice:
    """A GPU or MIG slice as the engine sees it: its name (`slug` or `slug/profile`), the
    memory it shows to CUDA [B] and where that comes from, and its compute capability (which
    quantized kernels vLLM picks; None: unknown)."""

    name: str
    visible_bytes: int
    visible_source: str
    capability: ComputeCapability | None = None


@dataclass(frozen=True, slots=True)
class EngineFit:
    """The engine on one device: its start-up memory, the requirement it gives, the verdict."""

    device: str  # `slug` or `slug/profile`
    visible_bytes: int
    visible_source: str
    memory: EngineMemory
    resolved: ResolvedOptions
    quantized: QuantizedWeights | None
    forward: ProfileForward
    requirement: Requirement
    min_concurrency: int
    fits: bool
    reason: str | None  # why it does not fit: the engine's message, or the concurrency short

    @property
    def engine(self) -> str:
        """``vllm 0.19.0``."""
        return f"{self.memory.engine} {self.memory.version}"

    def note(self) -> str:
        """One line for a message or an annotation: KV tokens and concurrency, or why not."""
        if self.memory.starts:
            return (
                f"{self.engine}: {self.memory.kv_tokens:,} KV tokens, concurrency "
                f"{self.memory.max_concurrency:.2f} at max_model_len "
                f"{self.resolved.max_model_len:,}"
            )
        return f"{self.engine} does not start: {self.memory.reason}"


def device_memory(row: Hardware, profile: MigProfileSpec | None = None) -> EngineDevice:
    """A GPU or MIG slice as the engine sees it: the memory it shows to CUDA (a whole H100
    80GB: 79.19 GiB measured; else the catalog's memory, a slice's usable) and its compute
    capability."""
    capability = compute_capability(row)
    if profile is None:
        visible, source = visible_memory(row)
        return EngineDevice(row.slug, visible, source, capability)
    capped, why = slice_cuda_visible_bytes(
        row.cuda_visible_memory_bytes, row.cuda_visible_memory_source, profile.memory_bytes
    )
    if capped is not None:
        return EngineDevice(
            f"{row.slug}/{profile.name}", capped, f"MIG profile {profile.name}: {why}", capability
        )
    return EngineDevice(
        f"{row.slug}/{profile.name}",
        profile.memory_bytes,
        f"MIG profile {profile.name}'s usable memory in the hardware catalog",
        capability,
    )


def engine_fit(
    graph: GraphSource,
    choice: EngineChoice,
    device: EngineDevice,
    *,
    sequences: int | None = None,
    max_model_len: int | None = None,
    pointer: str = "/engine",
) -> EngineFit:
    """The engine's requirement and verdict on ``device`` (from :func:`device_memory`), at
    ``sequences`` x ``max_model_len`` when given (else the choice's ``min_concurrency`` and
    option). An option the engine refuses is a 422 naming ``{pointer}/<option>``; a
    ``max_model_len`` given here that it refuses names ``/max_model_len``."""
    name, visible, source = device.name, device.visible_bytes, device.visible_source
    options = choice.options
    if max_model_len is not None:
        options = replace(options, max_model_len=max_model_len)
    profile = choice.profile
    model = serving_geometry(graph)
    try:
        start = engine_start(
            model,
            options,
            visible,
            graph=served_graph(graph),
            quantization=choice.quantization,
            quantization_config=engine_quantization(graph, choice, pointer),
            kernels=engine_kernels(device.capability),
            profile=profile,
        )
    except EngineInputError as exc:
        where = (
            "/max_model_len"
            if exc.field == "max_model_len" and max_model_len is not None
            else f"{pointer}/{exc.field}"
        )
        raise InvalidInput(str(exc), pointer=where) from None
    resolved, memory = start.resolved, start.memory
    wanted = sequences if sequences is not None else choice.min_concurrency
    graphs = memory.cuda_graph_pool_bytes if profile.graphs_before_kv else 0
    requirement = engine_requirement(
        [
            EngineStageNeed(
                weights_bytes=s.weights_bytes,
                peak_bytes=s.peak_bytes,
                non_torch_bytes=s.non_torch_bytes,
                graphs_bytes=graphs,
                kv_bytes_per_token=s.kv_bytes_per_token,
                rotary_cache_bytes=s.rotary_cache_bytes,
            )
            for s in memory.stages
        ],
        gpu_memory_utilization=resolved.gpu_memory_utilization,
        sequences=wanted,
        max_model_len=resolved.max_model_len,
        block_size=resolved.block_size,
        engine=f"{profile.name} {profile.version}",
    )
    verdict = fits(requirement.required_bytes, visible)
    reason = None
    if not memory.starts:
        reason = memory.reason
    elif not verdict:
        reason = (
            f"{profile.name} starts with {memory.kv_tokens:,} KV tokens: concurrency "
            f"{memory.max_concurrency:.2f} at max_model_len {resolved.max_model_len:,}, below "
            f"the {wanted} sequences asked (min_concurrency)"
        )
    return EngineFit(
        device=name,
        visible_bytes=visible,
        visible_source=source,
        memory=memory,
        resolved=resolved,
        quantized=start.quantized,
        forward=start.forward,
        requirement=requirement,
        min_concurrency=wanted,
        fits=verdict,
        reason=reason,
    )


def engine_read(fit: EngineFit) -> EngineFitRead:
    """An engine fit as the API shows it."""
    memory, resolved = fit.memory, fit.resolved
    smallest = min(memory.stages, key=lambda s: s.kv_pool_bytes)
    return EngineFitRead(
        engine=fit.engine,
        device=fit.device,
        cuda_visible_bytes=fit.visible_bytes,
        cuda_visible_source=fit.visible_source,
        requested_bytes=memory.requested_bytes,
        weights_bytes=max(s.weights_bytes for s in memory.stages),
        rotary_cache_bytes=memory.stages[0].rotary_cache_bytes,
        profile_peak_bytes=max(s.peak_bytes for s in memory.stages),
        non_torch_bytes=memory.stages[0].non_torch_bytes,
        cuda_graph_pool_bytes=memory.cuda_graph_pool_bytes,
        kv_pool_bytes=smallest.kv_pool_bytes,
        kv_bytes_per_token=smallest.kv_bytes_per_token,
        kv_tokens=memory.kv_tokens,
        max_model_len=resolved.max_model_len,
        max_concurrency=memory.max_concurrency,
        min_concurrency=fit.min_concurrency,
        starts=memory.starts,
        fits=fit.fits,
        reason=fit.reason,
        quantization=None if fit.quantized is None else fit.quantized.scheme.method,
        options={
            "tensor_parallel_size": resolved.tensor_parallel_size,
            "pipeline_parallel_size": resolved.pipeline_parallel_size,
            "max_model_len": resolved.max_model_len,
            "max_num_batched_tokens": resolved.max_num_batched_tokens,
            "max_num_seqs": resolved.max_num_seqs,
            "gpu_memory_utilization": resolved.gpu_memory_utilization,
            "block_size": resolved.block_size,
            "dtype_bytes": resolved.dtype_bytes,
            "kv_cache_dtype_bytes": resolved.kv_cache_dtype_bytes,
            "enforce_eager": resolved.enforce_eager,
        },
        stages=engine_stages(memory),
        profile_forward=fit.forward,
    )


def engine_quantization(
    graph: GraphSource, choice: EngineChoice, pointer: str
) -> dict[str, Any] | None:
    """The checkpoint's ``quantization_config`` the engine runs: the workload's engine option,
    else the stored model's (422 at ``{pointer}/quantization_config`` when both differ)."""
    stored = graph[5]
    given = None if choice.quantization_config is None else dict(choice.quantization_config)
    return checkpoint_config(
        given,
        None if stored is None else stored.config,
        "the stored model's",
        f"{pointer}/quantization_config",
    )


def check_engine(graph: GraphSource, spec: WorkloadInput) -> None:
    """Refuse, before any device is known, an engine the workload's model cannot be served by
    (422 naming ``/model``) or options the engine refuses for this model whatever the device
    (``/engine/<option>``: a tensor degree that does not divide the heads, a max_model_len above
    the context, more pipeline stages than layers, gpu_memory_utilization outside (0, 1], a
    quantization the checkpoint's quantization_config contradicts)."""
    choice = domain_engine(spec)
    if choice is None:
        return
    model = serving_geometry(graph)
    try:
        resolved = resolve_options(choice.options, model, 1, choice.profile)
        resolve_scheme(choice.quantization, engine_quantization(graph, choice, "/engine"))
    except EngineInputError as exc:
        raise InvalidInput(str(exc), pointer=f"/engine/{exc.field}") from None
    if resolved.pipeline_parallel_size > model.layers:
        raise InvalidInput(
            f"pipeline_parallel_size {resolved.pipeline_parallel_size} exceeds the model's "
            f"{model.layers} decoder layers",
            pointer="/engine/pipeline_parallel_size",
        )


def engine_gate(
    graph: GraphSource, engine: EngineOptions | None, runnable: list[Runnable]
) -> tuple[list[Runnable], list[tuple[str, Precision, str]]]:
    """Recommendation eligibility with an engine: the candidates (device or MIG slice, tensor x
    pipeline group) on which the engine starts with its ``min_concurrency``, and the others as
    (device, precision, reason) exclusions with the engine's reason. The engine's degrees are the
    candidate's unless the engine names them (then other groups are excluded). Its memory
    follows its ``dtype``, ``quantization`` and ``quantization_config`` (the quantized kernels
    of the candidate's compute capability), whatever the candidate's precision."""
    if engine is None:
        return runnable, []
    verdicts: dict[str, str | None] = {}
    kept: list[Runnable] = []
    left: list[tuple[str, Precision, str]] = []
    for candidate, scheme in runnable:
        device = candidate.device
        if device.slug not in verdicts:
            verdicts[device.slug] = _gate(graph, engine, candidate)
        reason = verdicts[device.slug]
        if reason is None:
            kept.append((candidate, scheme))
        else:
            left.append((device.slug, scheme.precision, reason))
    return kept, left


def _gate(graph: GraphSource, engine: EngineOptions, candidate: Candidate) -> str | None:
    device = candidate.device
    if candidate.runtime is not Runtime.CUDA:
        return f"{engine.name} runs on GPUs (the engine's memory model is per GPU)"
    for given, degree, name in (
        (engine.tensor_parallel_size, candidate.tensor_parallel, "tensor_parallel_size"),
        (engine.pipeline_parallel_size, candidate.pipeline_parallel, "pipeline_parallel_size"),
    ):
        if given is not None and given != degree:
            return f"the engine runs {name} {given}, this candidate is {degree}"
    if device.mig_profile is not None:
        if candidate.gpus > 1:
            return "a tensor x pipeline group cannot span MIG slices"
        if device.cuda_visible_memory_bytes is not None:  # capped by the whole GPU's figure
            shown = EngineDevice(
                device.slug,
                device.cuda_visible_memory_bytes,
                f"MIG profile {device.mig_profile}: {device.cuda_visible_memory_source}",
                device.compute_capability,
            )
        else:
            shown = EngineDevice(
                device.slug,
                device.memory_bytes,
                "MIG profile usable memory (catalog)",
                device.compute_capability,
            )
    else:
        visible, source = visible_memory(device)
        shown = EngineDevice(device.slug, visible, source, device.compute_capability)
    choice = engine_choice_of(engine, candidate.tensor_parallel, candidate.pipeline_parallel)
    try:
        fit = engine_fit(graph, choice, shown)
    except InvalidInput as exc:  # options this model refuses on this group (a TP degree)
        return exc.detail
    if fit.fits:
        return None
    return f"{fit.engine} on it: {fit.reason}"
