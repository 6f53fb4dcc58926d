"""Inference recommendation use cases: candidates, roofline predictions, fits, ranking."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from app.charts import Roof, RoofPoint, binding_phrases, roofline_svg
from app.db.models import Hardware
from app.db.repositories import HardwareRepository
from app.domain.budget import (
    PEAK_LAYER_UNITS,
    WorkEstimate,
    WorkFactor,
    check_budget,
    checkpoint,
    graph_layers,
    work_units,
)
from app.domain.fit import requirement
from app.domain.graph.analysis import GraphAnalysis, effective_options
from app.domain.hardware import (
    DeviceKind,
    HardwareSpec,
    PriceKind,
    mig_slice,
)
from app.domain.memory.cuda_allocator import AllocatorSnapshot
from app.domain.memory.estimate import (
    MemoryInputError,
    MemoryRequest,
    estimate_memory,
    inference_floor_bytes,
)
from app.domain.performance.batch_search import batch_sizes, largest_fitting, search
from app.domain.performance.calibration import (
    DEFAULT_CALIBRATIONS,
    GPU_HALF_PRECISION_SCALE,
    Calibration,
    calibration_class,
)
from app.domain.performance.candidates import (
    Candidate,
    runnable_candidates,
)
from app.domain.performance.decoding import (
    Batching,
    DecoderServing,
    kv_bytes_per_request,
    kv_elements_per_token,
    serving_shape,
)
from app.domain.performance.phases import (
    PhasedRequest,
    PhasedRequestShape,
    forward_shape,
    is_decoder,
)
from app.domain.performance.pipeline import (
    ParallelStrategy,
    PipelinePlan,
    split_stages,
)
from app.domain.performance.precision_schemes import PRECISION_SCHEMES, PrecisionScheme
from app.domain.performance.prediction import Bound, PipelineTiming, Prediction
from app.domain.performance.recommend import (
    Assessment,
    MemoryFit,
    Requirements,
    Scenario,
    explain,
    price_of_kind,
)
from app.domain.performance.roofline import kernel_points, predict, unsupported_reason
from app.domain.performance.runtimes import (
    DECODER_ONLY,
    DEFAULT_RUNTIME,
    RUNTIME_PROFILES,
    ServingRuntime,
    calibrations_for,
)
from app.domain.performance.serving import ServerLoad, clear_server_cache
from app.domain.performance.tensor_parallel import shard
from app.domain.precision import Precision
from app.domain.workload import (
    DEFAULT_SAFETY_MARGIN_FRACTION,
    Attention,
    Logits,
    Mode,
    Parallelism,
    default_attention,
)
from app.schemas.estimates import (
    DefaultUsedRow,
    InlineArchitecture,
)
from app.schemas.recommendations import (
    CalibrationRead,
    DecoderServingRead,
    Exclusion,
    InferenceRecommendationRequest,
    InferenceRecommendationResponse,
    PhaseRead,
    PipelinePhaseRead,
    PipelineRead,
    PipelineStageRead,
    RankedCandidate,
    RooflineInputs,
    ServerScenarioRead,
    TimeShares,
    WorkloadSummary,
)
from app.services.cache import LruCache, collector_paused
from app.services.convert import (
    GraphSource,
    bind_dims,
    calibration_overrides,
    decoder_serving,
    geometry,
    hardware_spec,
    model_graph,
    recommendation_requirements,
)
from app.services.errors import (
    InvalidInput,
    NotFound,
)
from app.services.pipeline import (
    BUDGET_SETTING,
    analyze_graph,
    require_profile,
    workload_pointers,
)

FORMULAS = [
    "t_kernel = max(F / P_eff, D / BW_eff) + launches x t_launch, with P_eff = peak[dtype] x "
    "compute_fraction x min(1, compute_efficiency x precision_scale) (precision_scale: "
    "half_precision_scale for fp16 / bf16 math, else 1) and BW_eff = bandwidth x "
    "bandwidth_fraction x memory_efficiency",
    "B (bytes moved by a kernel) = weight bytes W + input bytes I + output bytes O (+ KV cache "
    "read and written, KV) at the precision; D (its DRAM bytes) = W + KV + (1 - "
    "activation_cache_share) x (I + O)",
    "kernel time of a phase = max(sum of t_kernel (+ all-reduces), launches x "
    "host_dispatch): a serving framework issuing kernels from the host (host_dispatch per "
    "kernel, 0 under tensorrt) overlaps the device's work, launches being asynchronous; the "
    "excess is the phase's host_wait_s",
    "GPU phase latency = h2d_bytes / L_eff + kernel time + d2h_bytes / L_eff, with L_eff = "
    "host link x host_link_efficiency; CPUs and unified-memory SoCs copy nothing",
    "latency = request_overhead + sum over phases of repeats x phase latency",
    "throughput = batch / interval; interval = max(kernel time, h2d time, d2h time, "
    "request_overhead) on accelerators (copies and host work overlap the kernels), = latency "
    "on CPUs",
    "devices_needed = ceil(throughput_target / throughput)",
    "cost_usd_per_million = price_usd_per_hour / 3600 / throughput x 1e6; fleet cost = "
    "devices_needed x price",
    "energy_j_per_inference = TDP x latency / batch (an upper bound)",
    "operational intensity = FLOPs / DRAM bytes; ridge point = P_eff / BW_eff; a kernel above "
    "the ridge point is compute-bound",
]

ASSUMPTIONS = [
    "per-layer FLOPs, parameters and shapes come from the model analysis (GET "
    "/v1/models/{slug}/summary); a multiply-add is 2 FLOPs",
    "weights are read once per kernel (embeddings: only the gathered rows; a tied LM head: "
    "the shared matrix); intermediates inside attention / MLP / LSTM layers stay on chip",
    "element-wise layers fuse into the kernel before them unless fuse_elementwise is false",
    "composite layers launch one kernel per weight matrix plus one",
    "a mixture-of-experts layer reads the router and the experts its tokens are routed to: "
    "E x (1 - (1 - k/E)^T) of E experts for T tokens routed top-k (uniform routing): k at "
    "batch-1 decode, all of them in a prefill",
    "fits_in_memory: the one requirement (as POST /v1/estimates/memory's fit, MIG fit and "
    "admission): the memory engine's inference peak (runtime pytorch_cuda for GPUs and SoCs, "
    "pytorch_cpu for CPUs; attention as PyTorch SDPA picks it; decoder logits for the last "
    "position) + CUDA context + workspace + a 5 % margin, against device memory or the MIG "
    "profile's usable memory; precisions follow the one table (fp8 and int8 are W8A8, "
    "int8_weight_only W8A16, int4 W4A16)",
    "a MIG slice gets compute_slices / total of the compute and memory_slices / total of the "
    "bandwidth, the whole host link, and its share of TDP and price",
    "decoders: latency = time to first token (request overhead + prefill) + (generated_tokens - 1)"
    " decode steps at the mean context prompt_tokens + generated_tokens / 2",
    "CPU figures are per socket, as the catalog lists CPUs",
]

T = TypeVar("T")
_ANALYSES: LruCache[tuple[Any, ...], GraphAnalysis] = LruCache(size=128, name="graph_analyses")
_SHAPES: LruCache[tuple[Any, ...], PhasedRequestShape] = LruCache(size=128, name="request_shapes")
_PEAKS: LruCache[tuple[Any, ...], int] = LruCache(size=2048, name="memory_peaks")
# the CUDA allocator's state after a model's weights, per precision and sharding (estimates at
# every batch size and workspace size start from it)
_REPLAYS: LruCache[tuple[Any, ...], AllocatorSnapshot] = LruCache(size=32, name="allocator_replays")
# what the memory engine derives from one analysis object (storage plans, forward and weight
# allocator events, inference replays; keyed by the object, which each entry holds): a cold
# GPT-3 175B recommendation stores ~310
_PLANS: LruCache[tuple[Any, ...], Any] = LruCache(size=512, name="memory_plans")
# a request at a precision, per batch (its kernels' groups and device profiles built once)
_WORKLOADS: LruCache[tuple[Any, ...], PhasedRequest] = LruCache(size=256, name="workloads")
# one GPU's share of a request on a tensor-parallel group, per batch, precision and degree
_SHARDS: LruCache[tuple[Any, ...], PhasedRequest] = LruCache(
    size=256, name="tensor_parallel_shards"
)
# one micro-batch of a request split into pipeline stages, per batch, precision and degrees
_STAGES: LruCache[tuple[Any, ...], PipelinePlan] = LruCache(size=256, name="pipeline_stages")


def clear_caches() -> None:
    """Forget cached analyses, memory peaks and server-scenario queues (they are pure: only
    speed changes)."""
    _ANALYSES.clear()
    _SHAPES.clear()
    _PEAKS.clear()
    _REPLAYS.clear()
    _PLANS.clear()
    _WORKLOADS.clear()
    _SHARDS.clear()
    _STAGES.clear()
    clear_server_cache()


# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------


def _candidate(row: Hardware, device: HardwareSpec) -> Candidate:
    return Candidate(device=device, runtime=device.runtime, overhead=device.overhead)


def _slices(row: Hardware, whole: HardwareSpec) -> list[HardwareSpec]:
    if row.mig_total_compute_slices is None:
        return []
    geo = geometry(row)
    return [mig_slice(whole, geo, profile) for profile in geo.profiles]


def candidates(
    session: Session,
    names: Sequence[str] | None,
    prices: Mapping[str, float],
    price_kind: PriceKind = PriceKind.ON_DEMAND,
) -> list[Candidate]:
    """The named devices (``slug`` or ``slug/profile``), or every device and MIG slice; a
    request's ``prices`` are prices of ``price_kind``."""
    return candidates_of(HardwareRepository(session).all_by_slug(), names, prices, price_kind)


def candidates_of(
    rows: Mapping[str, Hardware],
    names: Sequence[str] | None,
    prices: Mapping[str, float],
    price_kind: PriceKind = PriceKind.ON_DEMAND,
) -> list[Candidate]:
    """:func:`candidates` from the hardware rows by slug, already loaded."""
    for slug in prices:
        if slug not in rows:
            raise NotFound(
                f"prices_usd_per_hour names hardware profile '{slug}', which does not exist; "
                "GET /v1/hardware lists them"
            )
    if names is None:
        found = []
        for slug in sorted(rows):
            whole = hardware_spec(
                rows[slug], price_usd_per_hour=prices.get(slug), request_price_kind=price_kind
            )
            found += [_candidate(rows[slug], d) for d in [whole, *_slices(rows[slug], whole)]]
        return found
    chosen = []
    for name in names:
        slug, _, profile_name = name.partition("/")
        row = rows.get(slug)
        if row is None:
            raise NotFound(f"hardware profile '{slug}' does not exist; GET /v1/hardware lists them")
        whole = hardware_spec(
            row, price_usd_per_hour=prices.get(slug), request_price_kind=price_kind
        )
        if not profile_name:
            chosen.append(_candidate(row, whole))
            continue
        if row.mig_total_compute_slices is None:
            raise NotFound(f"'{slug}' does not support MIG, so it has no profile '{profile_name}'")
        geo = geometry(row)
        chosen.append(_candidate(row, mig_slice(whole, geo, require_profile(geo, profile_name))))
    return chosen


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ModelSource:
    """A graph to evaluate, with the request's shape options and per-request memo tables."""

    inputs: list[Any]
    layers: list[Any]
    defaults: dict[str, int]
    label: str
    key: str  # empty for inline graphs (not cached across requests)
    extra: Mapping[str, int]
    sequence_length: int | None
    image_size: int | None
    decoder: bool
    prompt_tokens: int
    generated_tokens: int
    fuse_elementwise: bool
    memo: dict[tuple[Any, ...], Any]
    tokens_mean: int | None = None  # encoders without padding: the length compute is priced at
    serving: DecoderServing | None = None  # decoders: lengths, batching, beams (None: static,
    # every request at prompt_tokens + generated_tokens, one beam)

    @property
    def plan(self) -> DecoderServing:
        """The decoder serving plan (the static default at the request's lengths)."""
        if self.serving is not None:
            return self.serving
        return DecoderServing(
            prompt_tokens_max=self.prompt_tokens,
            prompt_tokens_mean=self.prompt_tokens,
            generated_tokens_max=self.generated_tokens,
            generated_tokens_mean=self.generated_tokens,
        )

    def _remember(
        self, key: tuple[Any, ...], shared: LruCache[tuple[Any, ...], T], compute: Callable[[], T]
    ) -> T:
        """Per request in ``memo``; across requests in ``shared`` for stored models."""
        found: T | None = self.memo.get(key)
        if found is None and self.key:
            found = shared.get(key)
        if found is None:
            found = compute()
            if self.key:
                shared.put(key, found)
        self.memo[key] = found
        return found

    def analysis(
        self,
        bindings: dict[str, int],
        logits: Logits = Logits.ALL,
        attention: Attention | None = None,
    ) -> GraphAnalysis:
        """The inference analysis at ``bindings`` (cached for stored models); ``attention``
        None: SDPA's choice on CUDA at fp32 (a fused kernel, as serving engines run). Options
        that cannot change this graph's analysis (attention without attention layers, logits
        of an encoder) share one: only its record of the options asked for is rewritten."""
        options = ("options", logits, attention)
        effective: tuple[Attention | None, Logits] | None = self.memo.get(options)
        if effective is None:
            effective = self.memo[options] = effective_options(
                self.layers, training=False, attention=attention, logits=logits
            )
        used_attention, used_logits = effective

        def compute() -> GraphAnalysis:
            return analyze_graph(
                self.inputs,
                self.layers,
                bindings,
                training=False,
                logits=used_logits,
                attention=used_attention,
            )

        bound = tuple(bindings.items())
        found = self._remember(
            (self.key, "analysis", bound, used_logits, used_attention), _ANALYSES, compute
        )
        if effective == (attention, logits):
            return found
        key = ("analysis as asked", bound, logits, attention)
        asked: GraphAnalysis | None = self.memo.get(key)
        if asked is None:
            asked = self.memo[key] = replace(
                found, attention_requested=attention, logits_requested=logits
            )
        return asked

    def bindings(self, batch: int, *, seq: int | None = None) -> dict[str, int]:
        """Symbol bindings at a batch (decoders: at a sequence length)."""
        return bind_dims(
            self.defaults,
            self.extra,
            batch=batch,
            sequence_length=seq if self.decoder else self.sequence_length,
            image_size=self.image_size,
        )

    def compute_bindings(self, batch: int) -> dict[str, int]:
        """Bindings the work is priced at: an encoder served without padding at its mean
        token count (``tokens_mean``), else as :meth:`bindings`."""
        if self.tokens_mean is None or self.decoder:
            return self.bindings(batch)
        return {**self.bindings(batch), "seq": self.tokens_mean}

    def _shape_key(self, batch: int) -> tuple[Any, ...]:
        if not self.decoder:
            bindings = self.compute_bindings(batch)
            return (self.key, "shape", tuple(bindings.items()), self.fuse_elementwise)
        prefill = self.bindings(batch, seq=self.prompt_tokens)
        return (self.key, "shape", tuple(prefill.items()), self.fuse_elementwise, self.plan)

    def shape(self, batch: int) -> PhasedRequestShape:
        """The request's phases at a batch, before the precision (cached for stored models)."""
        fuse = self.fuse_elementwise
        if not self.decoder:
            bindings = self.compute_bindings(batch)
            return self._remember(
                self._shape_key(batch),
                _SHAPES,
                lambda: forward_shape(self.analysis(bindings), batch=batch, fuse_elementwise=fuse),
            )
        plan = self.plan
        rows = batch * plan.beam_width  # decode rows; static prefills every beam's copy
        prefill = self.bindings(batch if plan.continuous else rows, seq=plan.priced_prompt_tokens)
        return self._remember(
            self._shape_key(batch),
            _SHAPES,
            lambda: serving_shape(
                self.analysis(prefill),
                self.analysis(self.bindings(rows, seq=1)),
                requests=batch,
                serving=plan,
                fuse_elementwise=fuse,
            ),
        )

    def workload(self, batch: int, scheme: PrecisionScheme) -> PhasedRequest:
        """The request's phases at a batch and precision (cached for stored models, beside
        the shapes: the devices' profiles of its phases are kept with it)."""
        return self._remember(
            (*self._shape_key(batch), "workload", scheme.precision),
            _WORKLOADS,
            lambda: self.shape(batch).at(scheme),
        )

    def sharded(self, batch: int, scheme: PrecisionScheme, degree: int) -> PhasedRequest:
        """One GPU's share of the request on a tensor-parallel group (cached for stored
        models, beside the shapes)."""
        return self._remember(
            (*self._shape_key(batch), "sharded", scheme.precision, degree),
            _SHARDS,
            lambda: shard(self.workload(batch, scheme), degree),
        )

    def staged(
        self, batch: int, scheme: PrecisionScheme, stages: int, tensor: int = 1
    ) -> PipelinePlan:
        """One micro-batch of ``batch`` requests split into pipeline stages (each stage a
        tensor-parallel shard when ``tensor`` > 1), cached beside the shapes."""

        def compute() -> PipelinePlan:
            share = (
                self.workload(batch, scheme) if tensor == 1 else self.sharded(batch, scheme, tensor)
            )
            return split_stages(share, stages)

        return self._remember(
            (*self._shape_key(batch), "staged", scheme.precision, stages, tensor),
            _STAGES,
            compute,
        )

    def memory_bindings(self, batch: int) -> dict[str, int]:
        """Bindings of the memory estimate (decoders: the whole padded context, for the KV
        cache; static batching: every beam a row; continuous: one request at the maximum
        lengths, the others' KV blocks are added by :meth:`required_bytes`)."""
        if self.decoder:
            plan = self.plan
            seq = plan.prompt_tokens_max + plan.generated_tokens_max
            if plan.continuous:
                return self.bindings(1, seq=seq)
            return self.bindings(batch * plan.beam_width, seq=seq)
        return self.bindings(batch)

    def kv_bytes_per_token(self, scheme: PrecisionScheme) -> int:
        """KV cache of one token of one sequence, all layers, at the precision [B]
        (remembered per request: the concurrency search asks for it at every step)."""
        key = ("kv_elements_per_token",)
        elements: int | None = self.memo.get(key)
        if elements is None:
            elements = self.memo[key] = kv_elements_per_token(
                self.analysis(self.bindings(1, seq=1))
            )
        return elements * scheme.kv_cache_bytes

    def kv_bytes_per_request(self, scheme: PrecisionScheme, gpus: int = 1) -> int:
        """Continuous batching: the paged KV cache one request holds, all beams, per GPU of
        a tensor- or pipeline-parallel group (heads or layers split over ``gpus``) [B]."""
        return kv_bytes_per_request(self.plan, self.kv_bytes_per_token(scheme), gpus=gpus)

    def _memory_request(
        self, batch: int, scheme: PrecisionScheme, candidate: Candidate
    ) -> tuple[dict[str, int], Attention, MemoryRequest, int]:
        """The memory engine's bindings, attention and request for a candidate, and the paged
        KV cache of continuous batching added to its peak [B]. Serving defaults: logits for
        the last position, attention as PyTorch's SDPA picks it for the candidate's runtime
        and the precision."""
        bindings = self.memory_bindings(batch)
        precision = Precision(scheme.precision.value)
        attention, _ = default_attention(
            candidate.runtime, precision, training=False, dropout=False, gpu=candidate.device.gpu
        )
        request = MemoryRequest(
            mode=Mode.INFERENCE,
            precision=precision,
            runtime=candidate.runtime,
            overhead=candidate.overhead,
            kv_cache=self.decoder,
            attention=attention,
            logits=Logits.LAST,
            parallelism=Parallelism(
                tensor=candidate.tensor_parallel, pipeline=candidate.pipeline_parallel
            ),
        )
        paged = 0
        if self.decoder and self.plan.continuous:
            paged = batch * self.kv_bytes_per_request(scheme, candidate.gpus)
        return bindings, attention, request, paged

    def overfills(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> bool:
        """Whether the requirement surely exceeds the candidate's memory, judged from a floor
        under the memory engine's peak (weights, KV cache, workspace, context) without the
        estimate: where only whether it fits matters (a multi-GPU group that does not fit is
        not offered), the estimate is skipped when the floor alone does not fit."""
        bindings, attention, request, paged = self._memory_request(batch, scheme, candidate)
        floor = inference_floor_bytes(
            self.analysis(bindings, Logits.LAST, attention), request, plans=_PLANS
        )
        required = requirement(
            floor + paged, (), safety_margin_fraction=DEFAULT_SAFETY_MARGIN_FRACTION
        ).required_bytes  # grows with the peak: the requirement is at least this
        return required > candidate.device.memory_bytes

    def required_bytes(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> int:
        """The one requirement (app.domain.fit: the memory engine's inference peak with the
        candidate's runtime and overheads, plus the default safety margin) [B] (serving
        defaults: :meth:`_memory_request`)."""
        bindings, attention, request, paged = self._memory_request(batch, scheme, candidate)

        def estimate() -> int:
            base = ("estimate", tuple(bindings.items()), request)
            result = self.memo.get(base)
            if result is None:
                try:
                    result = estimate_memory(
                        self.analysis(bindings, Logits.LAST, attention),
                        request,
                        replays=_REPLAYS,  # keyed by the events: inline graphs too
                        plans=_PLANS,
                        explain=False,  # the fit reads the bytes only
                    )
                except MemoryInputError as exc:
                    raise InvalidInput(str(exc)) from exc
                self.memo[base] = result
            return requirement(
                result.peak_bytes + paged,
                result.lines,
                safety_margin_fraction=DEFAULT_SAFETY_MARGIN_FRACTION,
            ).required_bytes

        return self._remember(
            (self.key, "peak", tuple(bindings.items()), request, paged), _PEAKS, estimate
        )

    def max_concurrent_requests(
        self, scheme: PrecisionScheme, candidate: Candidate, limit: int
    ) -> int:
        """Continuous batching: the most requests whose paged KV cache fits beside one
        maximum-length request's peak, at most ``limit`` (0 when none fits)."""
        # required_bytes grows with the requests
        return largest_fitting(limit, lambda requests: self.fits(requests, scheme, candidate))

    def fits(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> bool:
        """Whether the workload fits the candidate's memory: the floor first
        (:meth:`overfills`), the memory engine's estimate only when the floor fits."""
        return (
            not self.overfills(batch, scheme, candidate)
            and self.memory_fit(batch, scheme, candidate).fits
        )

    def memory_fit(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> MemoryFit:
        """The fit of the workload on the candidate's memory."""
        bindings = self.memory_bindings(batch)
        shape = ", ".join(f"{k}={v}" for k, v in bindings.items())
        if self.decoder and self.plan.continuous:
            kv = self.kv_bytes_per_request(scheme, candidate.gpus)
            shape += (
                f"; plus {batch} request(s) x {kv:,} B of paged KV cache "
                f"({self.plan.kv_tokens_per_request()} token slots in blocks of "
                f"{self.plan.kv_block_tokens}, all beams) for continuous batching"
            )
        per_gpu = (
            f", per GPU of {candidate.tensor_parallel} (tensor parallel)"
            if candidate.tensor_parallel > 1 and candidate.pipeline_parallel == 1
            else ""
        )
        if candidate.pipeline_parallel > 1:
            per_gpu = (
                f", per GPU of {candidate.gpus} (pipeline parallel over "
                f"{candidate.pipeline_parallel} stages"
                + (
                    f" of {candidate.tensor_parallel} tensor-parallel GPUs"
                    if candidate.tensor_parallel > 1
                    else ""
                )
                + ": weights and KV cache / (tensor x pipeline), the average stage; the "
                "first stage also holds the embedding and the last the LM head, which the "
                "average spreads over all stages)"
            )
        return MemoryFit(
            required_bytes=self.required_bytes(batch, scheme, candidate),
            available_bytes=candidate.device.memory_bytes,
            detail=f"memory engine inference peak ({candidate.runtime.value}, precision "
            f"{scheme.precision.value}, {shape}{per_gpu}) + "
            f"{DEFAULT_SAFETY_MARGIN_FRACTION:.0%} safety margin; POST /v1/estimates/memory "
            "with the same options for the breakdown and the same fit",
        )


def model_source(
    session: Session,
    *,
    model: str | None,
    architecture: InlineArchitecture | None,
    bindings: Mapping[str, int],
    sequence_length: int | None,
    image_size: int | None,
    prompt_tokens: int,
    generated_tokens: int,
    fuse_elementwise: bool,
    tokens_mean: int | None = None,
    serving: DecoderServing | None = None,
) -> ModelSource:
    """The graph of a stored or inline model with the request's shape options."""
    return source_of(
        model_graph(session, model, architecture),
        bindings=bindings,
        sequence_length=sequence_length,
        image_size=image_size,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        fuse_elementwise=fuse_elementwise,
        tokens_mean=tokens_mean,
        serving=serving,
    )


def source_of(
    graph: GraphSource,
    *,
    bindings: Mapping[str, int],
    sequence_length: int | None,
    image_size: int | None,
    prompt_tokens: int,
    generated_tokens: int,
    fuse_elementwise: bool,
    tokens_mean: int | None = None,
    serving: DecoderServing | None = None,
) -> ModelSource:
    """:func:`model_source` of a graph already loaded (``model_graph``)."""
    inputs, layers, defaults, label, key = graph
    has_seq = any("seq" in spec.get("shape", ()) for spec in inputs)
    decoder = has_seq and is_decoder(layers)
    source = ModelSource(
        inputs=inputs,
        layers=layers,
        defaults=dict(defaults),
        label=label,
        key=key,
        extra=dict(bindings),
        sequence_length=sequence_length,
        image_size=image_size,
        decoder=decoder,
        tokens_mean=tokens_mean,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        fuse_elementwise=fuse_elementwise,
        memo={},
        serving=serving if decoder else None,
    )
    if tokens_mean is not None:
        _check_tokens_mean(source, tokens_mean, has_seq=has_seq)
    return source


def _check_tokens_mean(source: ModelSource, tokens_mean: int, *, has_seq: bool) -> None:
    """``tokens_mean`` fits the encoder's padded length (as the bindings resolve it)."""
    if source.decoder:
        raise InvalidInput(
            "tokens_mean is for encoders served without padding; a decoder's prompt length is "
            "prompt_tokens",
            pointer="/tokens_mean",
        )
    longest = source.bindings(1).get("seq")
    if not has_seq or longest is None:
        raise InvalidInput(
            "tokens_mean needs a model with a sequence axis (`seq`)", pointer="/tokens_mean"
        )
    if tokens_mean > longest:
        raise InvalidInput(
            f"tokens_mean {tokens_mean} exceeds the sequence length {longest} the inputs are "
            "padded to",
            pointer="/tokens_mean",
        )


DECODER_OPTIONS = (
    "prompt_tokens_mean",
    "generated_tokens_mean",
    "batching",
    "beam_width",
    "kv_block_tokens",
    "beams_share_prompt",
)


def _runtimes_for_any_model() -> str:
    """The serving runtimes a model that is not a decoder may ask for, in words."""
    names = [runtime.value for runtime in ServingRuntime if runtime not in DECODER_ONLY]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _check_decoder_options(payload: InferenceRecommendationRequest, source: ModelSource) -> None:
    """Decoder serving options are refused for a model that is not a decoder."""
    given = [name for name in DECODER_OPTIONS if name in payload.model_fields_set]
    if given and not source.decoder:
        raise InvalidInput(
            f"{', '.join(given)} {'describe' if len(given) > 1 else 'describes'} decoder LLM "
            f"serving; {source.label} has no causal "
            "self-attention over a `seq` input (not a decoder)",
            pointer=f"/{given[0]}",
        )
    if payload.serving_runtime in DECODER_ONLY and not source.decoder:
        raise InvalidInput(
            f"serving_runtime {payload.serving_runtime.value} is profiled on decoder LLM "
            f"serving only; {source.label} has no causal self-attention over a `seq` input "
            f"(not a decoder): use {_runtimes_for_any_model()}",
            pointer="/serving_runtime",
        )


def _batches(payload: InferenceRecommendationRequest) -> list[int]:
    """The batch sizes the request asks to try (app.domain.performance.batch_search)."""
    return batch_sizes(payload.scenario, payload.batch_sizes, payload.max_batch_size)


def _fuse(payload: InferenceRecommendationRequest) -> bool:
    """fuse_elementwise as given, else what the serving runtime does."""
    if "fuse_elementwise" in payload.model_fields_set:
        return payload.fuse_elementwise
    return RUNTIME_PROFILES[payload.serving_runtime].fuse_elementwise


# --------------------------------------------------------------------------------------------
# The use case
# --------------------------------------------------------------------------------------------


def recommend(
    session: Session, *, payload: InferenceRecommendationRequest
) -> InferenceRecommendationResponse:
    """Rank every candidate device and precision at its best batch size, and explain."""
    return prepare_recommend(session, payload=payload)()


def prepare_recommend(
    session: Session, *, payload: InferenceRecommendationRequest, limit_units: int | None = None
) -> Callable[[], InferenceRecommendationResponse]:
    """Load the model and the candidate devices, check the work budget (``limit_units``:
    graph layers x devices x precisions x batch sizes, app.domain.budget), and return the
    recommendation's computation, which needs no database (app.api.compute)."""
    pointers = workload_pointers("", inline_architecture=payload.architecture is not None)
    with pointers:
        graph = model_graph(session, payload.model, payload.architecture)
        rows = HardwareRepository(session).all_by_slug()
    pool = candidates_of(rows, payload.devices, payload.prices_usd_per_hour, payload.price_kind)
    if limit_units is not None:
        work = recommendation_work(graph, payload, len(pool))
        check_budget(work, limit_units, setting=BUDGET_SETTING)

    def compute() -> InferenceRecommendationResponse:
        with (
            collector_paused(),
            workload_pointers("", inline_architecture=payload.architecture is not None),
        ):
            return _recommend(graph, pool, payload=payload)

    return compute


def recommendation_work(
    graph: GraphSource, payload: InferenceRecommendationRequest, devices: int
) -> WorkEstimate:
    """The work of a recommendation, known before computing (app.domain.budget): every layer
    as written predicted on every candidate device (MIG slices included) at every precision and
    batch size, plus a memory estimate of every executed layer per precision and batch size."""
    size = graph_layers(graph[1])
    where = "/architecture/layers" if payload.architecture is not None else "/model"
    precisions = WorkFactor(name="precisions", value=len(payload.precisions), field="/precisions")
    batches = WorkFactor(
        name="batch sizes",
        value=len(_batches(payload)),
        field="/batch_sizes" if payload.batch_sizes is not None else "/max_batch_size",
    )
    return work_units(
        WorkFactor(name="graph layers", value=size.written_layers, field=where),
        WorkFactor(name="devices", value=devices, field="/devices"),
        precisions,
        batches,
    ) + work_units(
        WorkFactor(name="executed layers", value=size.executed_layers, field=where),
        precisions,
        batches,
        weight=PEAK_LAYER_UNITS,
    )


def _recommend(
    graph: GraphSource, pool: list[Candidate], *, payload: InferenceRecommendationRequest
) -> InferenceRecommendationResponse:
    source = source_of(
        graph,
        bindings=payload.bindings,
        sequence_length=payload.sequence_length,
        image_size=payload.image_size,
        prompt_tokens=payload.prompt_tokens,
        generated_tokens=payload.generated_tokens,
        fuse_elementwise=_fuse(payload),
        tokens_mean=payload.tokens_mean,
        serving=decoder_serving(payload),
    )
    _check_decoder_options(payload, source)
    cals = calibrations_for(payload.serving_runtime, calibration_overrides(payload.calibration))
    runnable, left_out = runnable_candidates(
        source,
        pool,
        [PRECISION_SCHEMES[p] for p in payload.precisions],
        payload.parallelism,
        tensor_parallel_max=payload.tensor_parallel_max,
        pipeline_parallel_max=payload.pipeline_parallel_max,
    )
    excluded = [
        Exclusion(device=e.device, precision=e.precision, reason=e.reason) for e in left_out
    ]
    if not runnable:
        raise InvalidInput(
            "no candidate device can run the requested precisions: "
            + "; ".join(f"{e.device} {e.precision.value}: {e.reason}" for e in excluded[:10]),
            pointer="/precisions",
        )
    requirements = recommendation_requirements(payload)
    batches = _batches(payload)
    ranked = search(
        source,
        runnable,
        batches=batches,
        calibrations=cals,
        requirements=requirements,
        scenario=payload.scenario,
        objective=payload.objective,
        host_step_s=RUNTIME_PROFILES[payload.serving_runtime].host_overhead_per_sequence_step_s,
        sizes_given=payload.batch_sizes is not None,
        max_batch_size=payload.max_batch_size,
    )
    unpriced = len({a.prediction.device.slug for a in ranked if a.cost_usd_per_million is None})
    paragraph = explain(
        ranked, requirements, model=source.label, unpriced=unpriced, excluded=len(excluded)
    )
    first = source.workload(1, runnable[0][1])
    summary_bindings = (
        source.bindings(1, seq=source.prompt_tokens) if source.decoder else source.bindings(1)
    )
    budget = requirements.latency_budget_s
    return InferenceRecommendationResponse(
        recommendation=paragraph,
        objective=payload.objective,
        scenario=payload.scenario,
        serving_runtime=payload.serving_runtime,
        latency_slo_ms=payload.latency_slo_ms,
        slo_margin=None if budget is None else payload.slo_margin,
        latency_budget_ms=None if budget is None else budget * 1e3,
        price_kind=payload.price_kind,
        throughput_target_per_s=payload.throughput_target_per_s,
        workload=WorkloadSummary(
            model=source.label,
            decoder=source.decoder,
            params=source.analysis(summary_bindings).params,
            bindings=summary_bindings,
            flops_per_inference=float(first.flops),
            prompt_tokens=source.prompt_tokens if source.decoder else None,
            generated_tokens=source.generated_tokens if source.decoder else None,
            prompt_tokens_mean=source.plan.prompt_tokens_mean if source.decoder else None,
            generated_tokens_mean=source.plan.generated_tokens_mean if source.decoder else None,
            batching=source.plan.batching if source.decoder else None,
            beam_width=source.plan.beam_width if source.decoder else None,
            kv_block_tokens=(
                source.plan.kv_block_tokens if source.decoder and source.plan.continuous else None
            ),
            beams_share_prompt=(
                source.plan.prompt_shared_by_beams
                if source.decoder and source.plan.continuous
                else None
            ),
            batch_sizes=batches,
            attention=_attention_used(source, summary_bindings, runnable),
            defaults_used=_defaults_used(payload, source, batches),
        ),
        candidates=[
            ranked_candidate(
                index,
                item,
                source.plan.priced_generated_tokens if source.decoder else None,
                _serving_read(source, item) if source.decoder else None,
            )
            for index, item in enumerate(ranked[: payload.limit], start=1)
        ],
        total_candidates=len(ranked),
        eligible_candidates=sum(1 for a in ranked if a.eligible),
        excluded=excluded,
        calibration={cls: calibration_read(cal) for cls, cal in cals.items()},
        formulas=FORMULAS,
        assumptions=[
            *ASSUMPTIONS,
            *_padding_note(source),
            *([f"decoder serving: {source.plan.describe()}"] if source.decoder else []),
            *_scenario_note(payload, requirements),
            *_pipeline_note(runnable),
            *_half_precision_note(ranked),
            *_cpu_runtime_note(payload.serving_runtime, ranked),
            *_host_work_note(payload.serving_runtime, source),
            _prices_note(pool, payload.price_kind),
        ],
    )


def _host_work_note(runtime: ServingRuntime, source: ModelSource) -> list[str]:
    """How a runtime's host work between decode steps is priced (only when it has some)."""
    host_s = RUNTIME_PROFILES[runtime].host_overhead_per_sequence_step_s
    if host_s <= 0.0 or not source.decoder:
        return []
    return [
        f"{runtime.value}: the engine's host work between steps, {host_s * 1e6:g} us per "
        "sequence per step, runs serially with the GPU: a request of b sequences with one "
        "prefill and g - 1 decode steps takes h x b x g longer, each token h x b longer; the "
        "total is part of each accelerator candidate's inputs.request_overhead_s (CPUs keep "
        "their calibration)"
    ]


def _pipeline_note(runnable: Sequence[tuple[Candidate, PrecisionScheme]]) -> list[str]:
    """How pipeline-parallel candidates are timed (only when one is offered)."""
    if not any(candidate.pipeline_parallel > 1 for candidate, _ in runnable):
        return []
    return [
        "pipeline parallel: the blocks are split evenly over p GPUs in order (vLLM's "
        "get_pp_indices: the remainder to the stages before the last; embedding on the first, "
        "final norm and LM head on the last); a batch of B runs as m = min(B, p) micro-batches "
        "of ceil(B / m); per phase step each stage's kernels are timed by the roofline on one "
        "micro-batch (T_s) and the hidden state crosses the GPU link (NVLink, else PCIe) at the "
        "host-link efficiency plus 10 us (X_s, not overlapped with the next micro-batch); a "
        "step takes the cycle I = max(m x max(T_s + X_s), sum T_s + sum X_s); latency = request "
        "overhead + sum of repeats x (copies + I); interval = sum of repeats x I; each "
        "candidate's pipeline block has every number, with the steady-state idle share and "
        "the GPipe bubble (p - 1) / (m + p - 1) of a batch run alone (not priced)"
    ]


def _prices_note(pool: Sequence[Candidate], kind: PriceKind) -> str:
    """Which prices the costs use (kind, region, date per device), and which devices are not
    ranked by cost because they have no price of that kind."""
    used: list[str] = []
    other: list[str] = []
    missing = 0
    seen: set[str] = set()
    for candidate in pool:
        device = candidate.device
        slug = device.parent or device.slug  # a slice pays its share of its GPU's price
        if slug in seen:
            continue
        seen.add(slug)
        price, _ = price_of_kind(device, kind)
        if price is not None:
            whole = price / device.compute_fraction
            region = device.price_region or "region not stated"
            when = "date unknown" if device.price_date is None else device.price_date.isoformat()
            origin = "request" if device.price_source.startswith("request") else "catalog"
            used.append(f"{slug} {whole:.4g} ({region}, {when}, {origin})")
        elif device.price_usd_per_hour is None:
            missing += 1
        else:
            found = "no kind" if device.price_kind is None else device.price_kind.value
            other.append(f"{slug} ({found})")
    text = f"costs use {kind.value} prices only, per whole device [USD/h]"
    text += ": " + ", ".join(used) if used else ": none of the candidates has one"
    if any(c.device.parent is not None for c in pool):
        text += "; a MIG slice pays its share of compute slices of its GPU's price"
    skipped = []
    if other:
        skipped.append("priced with another kind: " + ", ".join(other))
    if missing:
        skipped.append(f"{missing} without a price")
    if skipped:
        text += "; not ranked by cost: " + "; ".join(skipped)
    return text


def _scenario_note(
    payload: InferenceRecommendationRequest, requirements: Requirements
) -> list[str]:
    """How the server scenario turns batch timings into a rate and a p99, and what single
    stream means."""
    if payload.scenario is Scenario.SINGLE_STREAM:
        return [
            "scenario single_stream: one sample per query, the next sent when the answer is "
            "back (MLPerf SingleStream); every candidate at batch 1, its latency the request's "
            "(the model is deterministic: the p90 MLPerf reports is that latency) and its "
            "throughput 1 / latency, at which costs are priced (copies, host work and the "
            "next request do not overlap the kernels). The MLPerf SingleStream rows are scored "
            "on this latency (benchmarks/calibration/results.md)"
        ]
    budget = requirements.latency_budget_s
    if payload.scenario is not Scenario.SERVER or budget is None:
        return []
    return [
        f"scenario server: requests arrive one at a time as a Poisson process; when the device "
        f"frees up it takes everything waiting up to a batch cap (greedy dynamic batching); "
        f"per candidate, the largest arrival rate whose simulated p99 latency stays within "
        f"{budget * 1e3:.4g} ms (the SLO less its margin) is its throughput and that p99 its "
        f"latency, batch latency and interval interpolated between the batch sizes tried, "
        f"the cap chosen among them (each candidate's server.note says what came out); a "
        f"candidate whose lone request misses the budget is shown at its offline figures "
        f"with the reason"
    ]


def _half_precision_note(ranked: Sequence[Assessment]) -> list[str]:
    """How fp16 / bf16 math is priced (only when a candidate's math ran at a 16-bit scale other
    than 1)."""
    scales = {
        scale
        for a in ranked
        if (scale := a.prediction.calibration.precision_scale(a.prediction.compute_dtype)) != 1.0
    }
    if not scales:
        return []
    return [
        "fp16 / bf16 math runs at half_precision_scale x the calibrated compute efficiency ("
        + ", ".join(f"{x:g}" for x in sorted(scales))
        + "; capped at the peak): the efficiencies are fitted on int8 rows, and 16-bit tensor "
        f"math reaches a larger share of its own peak (the GPUs' {GPU_HALF_PRECISION_SCALE:g}: "
        "fitted on 15 published fp16 TensorRT-LLM runs on the A100 and H100 SXM, 1.27-1.29 with "
        "either left out); each candidate's inputs.precision_scale says what it ran at"
    ]


def _cpu_runtime_note(runtime: ServingRuntime, ranked: Sequence[Assessment]) -> list[str]:
    """What a serving runtime other than the default does to the CPU candidates (only when
    one is ranked): its CPU scale, or that CPUs keep the MLPerf-grade calibration."""
    if runtime is DEFAULT_RUNTIME or not any(
        a.prediction.device.kind is DeviceKind.CPU for a in ranked
    ):
        return []
    profile = RUNTIME_PROFILES[runtime]
    if profile.cpu_compute_efficiency_scale is not None:
        return [f"{runtime.value} on CPUs: {profile.cpu_basis}"]
    return [
        f"{runtime.value} on CPUs: no published CPU measurements of it, so CPU candidates keep "
        "the calibration fitted on MLPerf rows (Intel's optimized stacks: IPEX, OpenVINO); a "
        "stock framework can run slower (stock PyTorch runs 1.0-2.8x behind IPEX on a Xeon "
        "8380, benchmarks/calibration/runtimes.md)"
    ]


def _padding_note(source: ModelSource) -> list[str]:
    """How an encoder's inputs are priced when the request says they carry no padding."""
    if source.tokens_mean is None or source.decoder:
        return []
    padded = source.bindings(1).get("seq")
    return [
        f"padding-free: compute, latency and throughput priced at {source.tokens_mean} tokens "
        f"per input (tokens_mean); memory at the padded {padded} tokens"
    ]


def _attention_used(
    source: ModelSource,
    bindings: dict[str, int],
    runnable: Sequence[tuple[Candidate, PrecisionScheme]],
) -> list[str]:
    """The attention kernels behind the figures (none without attention layers)."""
    if not source.analysis(bindings).attention_used:
        return []
    found = ["latency: one fused attention kernel per layer (the roofline prices no S x S "
             "scores)"]  # fmt: skip
    for candidate, scheme in runnable:
        precision = Precision(scheme.precision.value)
        impl, why = default_attention(
            candidate.runtime, precision, training=False, dropout=False, gpu=candidate.device.gpu
        )
        line = f"memory on {candidate.runtime.value} at {precision.value}: {impl.value} ({why})"
        if line not in found:
            found.append(line)
    return found


def _defaults_used(
    payload: InferenceRecommendationRequest, source: ModelSource, batches: list[int]
) -> list[DefaultUsedRow]:
    """Every option the request left out that the figures depend on, and its value."""
    given = payload.model_fields_set
    rows: list[DefaultUsedRow] = []
    names = {
        name for spec in source.inputs for name in spec.get("shape", ()) if isinstance(name, str)
    }
    if source.decoder:
        for option, value in (
            ("prompt_tokens", payload.prompt_tokens),
            ("generated_tokens", payload.generated_tokens),
        ):
            if option not in given:
                rows.append(DefaultUsedRow(option=option, value=str(value), reason="API default"))
        rows.append(
            DefaultUsedRow(
                option="logits",
                value="last",
                reason="decoder serving computes the last position's logits (memory fit)",
            )
        )
        rows += _decoder_defaults(payload, given)
    shape_options: tuple[tuple[str, str, int | None], ...] = (
        ("sequence_length", "seq", payload.sequence_length),
        ("image_size", "image", payload.image_size),
    )
    for option, symbol, given_size in shape_options:
        if symbol == "seq" and source.decoder:
            continue
        default = source.defaults.get(symbol)
        if given_size is None and symbol in names and symbol not in payload.bindings and default:
            rows.append(
                DefaultUsedRow(option=option, value=str(default), reason="the model's default")
            )
    if payload.batch_sizes is None:
        reason = f"powers of two up to max_batch_size={payload.max_batch_size}"
        if payload.scenario is Scenario.SINGLE_STREAM:
            reason = "scenario single_stream: one sample per query"
        rows.append(
            DefaultUsedRow(option="batch_sizes", value=", ".join(map(str, batches)), reason=reason)
        )
    if "precisions" not in given:
        rows.append(
            DefaultUsedRow(
                option="precisions",
                value=", ".join(p.value for p in payload.precisions),
                reason="API default",
            )
        )
    if payload.devices is None:
        rows.append(
            DefaultUsedRow(
                option="devices", value="all", reason="every hardware profile and MIG slice"
            )
        )
    if "price_kind" not in given:
        rows.append(
            DefaultUsedRow(
                option="price_kind",
                value=payload.price_kind.value,
                reason="costs are ranked among list (pay-as-you-go) prices only",
            )
        )
    if payload.latency_slo_ms is not None and "slo_margin" not in given:
        rows.append(
            DefaultUsedRow(
                option="slo_margin",
                value=f"{payload.slo_margin:g}",
                reason=f"a prediction within {payload.slo_margin:.0%} of the SLO does not "
                "meet it: the latency is predicted, not measured",
            )
        )
    rows += _scenario_and_parallel_defaults(payload, given)
    rows.append(
        DefaultUsedRow(
            option="runtime",
            value="per candidate",
            reason="memory fit: pytorch_cpu on CPUs, pytorch_cuda on GPUs; latency: the "
            "calibrated efficiencies under serving_runtime's profile",
        )
    )
    if "serving_runtime" not in given:
        rows.append(
            DefaultUsedRow(
                option="serving_runtime",
                value=payload.serving_runtime.value,
                reason="the calibration's own: fitted on MLPerf results (TensorRT-grade "
                "engines); torch_compile, pytorch_eager, tensorflow and onnxruntime have fitted "
                "profiles, "
                "and vllm one for decoder serving",
            )
        )
    if "fuse_elementwise" not in given:
        fuse = _fuse(payload)
        rows.append(
            DefaultUsedRow(
                option="fuse_elementwise",
                value=str(fuse).lower(),
                reason=f"{payload.serving_runtime.value} "
                + (
                    "fuses element-wise layers into the kernel before them"
                    if fuse
                    else "runs one kernel per layer"
                ),
            )
        )
    return rows


def _left_out(
    given: set[str], candidates: Sequence[tuple[bool, str, object, str]]
) -> list[DefaultUsedRow]:
    """A row per (applies, option, value, reason) whose option applies and was not given."""
    return [
        DefaultUsedRow(option=option, value=str(value), reason=reason)
        for applies, option, value, reason in candidates
        if applies and option not in given
    ]


def _decoder_defaults(
    payload: InferenceRecommendationRequest, given: set[str]
) -> list[DefaultUsedRow]:
    """A decoder's serving options the request left out."""
    return _left_out(
        given,
        (
            (
                True,
                "prompt_tokens_mean",
                payload.prompt_tokens,
                "prompt_tokens: every request at the maximum length",
            ),
            (
                True,
                "generated_tokens_mean",
                payload.generated_tokens,
                "generated_tokens: every request at the maximum length",
            ),
            (
                True,
                "batching",
                payload.batching.value,
                "vllm always batches in flight, with a paged KV cache"
                if payload.serving_runtime is ServingRuntime.VLLM
                else "a batch padded to the maximum lengths runs until its longest output "
                "(continuous: in-flight batching with a paged KV cache, as TensorRT-LLM and "
                "vLLM serve)",
            ),
            (
                True,
                "beam_width",
                payload.beam_width,
                "one sequence per request (greedy or sampled decoding)",
            ),
            (
                payload.batching is Batching.CONTINUOUS,
                "kv_block_tokens",
                payload.kv_block_tokens,
                "TensorRT-LLM's tokens_per_block default",
            ),
            (
                payload.batching is Batching.CONTINUOUS and payload.beam_width > 1,
                "beams_share_prompt",
                str(payload.beams_share_prompt).lower(),
                "the beams share the prompt's full KV blocks and each decode step reads the "
                "cached prompt once per request, as TensorRT-LLM and vLLM do (false: every beam "
                "holds its own copy, as Neural Speed does)",
            ),
        ),
    )


def _scenario_and_parallel_defaults(
    payload: InferenceRecommendationRequest, given: set[str]
) -> list[DefaultUsedRow]:
    """The scenario and the multi-GPU options the request left out."""
    return _left_out(
        given,
        (
            (
                True,
                "scenario",
                payload.scenario.value,
                "throughput at the best batch with every request already waiting "
                "(MLPerf Offline; server: Poisson arrivals under the latency SLO)",
            ),
            (
                True,
                "parallelism",
                payload.parallelism.value,
                "a model whose batch 1 fits no single GPU is offered on tensor-parallel "
                "groups of GPUs (pipeline or both on request)",
            ),
            (
                payload.parallelism is not ParallelStrategy.PIPELINE,
                "tensor_parallel_max",
                payload.tensor_parallel_max,
                "tensor-parallel groups of 2, 4 or 8 GPUs at most (one node)",
            ),
            (
                payload.parallelism is not ParallelStrategy.TENSOR,
                "pipeline_parallel_max",
                payload.pipeline_parallel_max,
                "pipeline groups of 2, 4 or 8 stages at most (one node)",
            ),
        ),
    )


def calibration_read(cal: Calibration) -> CalibrationRead:
    """The API view of a calibration."""
    return CalibrationRead.model_validate(cal)


def _inputs(p: Prediction) -> RooflineInputs:
    device, cal = p.device, p.calibration
    tiling = p.tiling
    return RooflineInputs(
        sm_count=None if tiling is None or not tiling.split_k else tiling.units,
        gemm_tile=None if tiling is None else tiling.tile,
        tiling=None if tiling is None else tiling.assumption,
        precision_convention=PRECISION_SCHEMES[p.precision].convention,
        compute_dtype=p.compute_dtype.value,
        peak_flops_per_s=p.peak_flops_per_s,
        peak_source=p.peak_source,
        compute_fraction=device.compute_fraction,
        calibration_class=calibration_class(device, PRECISION_SCHEMES[p.precision]),
        compute_efficiency=cal.compute_efficiency,
        precision_scale=cal.precision_scale(p.compute_dtype),
        effective_flops_per_s=p.effective_flops_per_s,
        memory_bandwidth_bytes_per_s=device.memory_bandwidth_bytes_per_s,
        bandwidth_fraction=device.bandwidth_fraction,
        memory_efficiency=cal.memory_efficiency,
        activation_cache_share=cal.activation_cache_share,
        effective_bandwidth_bytes_per_s=p.effective_bandwidth_bytes_per_s,
        host_link_bytes_per_s=device.host_link_bytes_per_s if device.needs_host_copy else None,
        host_link_source=device.host_link_source,
        host_link_efficiency=cal.host_link_efficiency,
        effective_host_link_bytes_per_s=p.effective_host_link_bytes_per_s,
        kernel_launch_overhead_s=cal.kernel_launch_overhead_s,
        host_dispatch_s=cal.host_dispatch_s,
        request_overhead_s=p.request_overhead_s,
        tdp_watts=device.tdp_watts,
        price_usd_per_hour=device.price_usd_per_hour,
        price_source=device.price_source,
        price_kind=device.price_kind,
        price_region=device.price_region,
        price_date=device.price_date,
    )


def _serving_read(source: ModelSource, item: Assessment) -> DecoderServingRead:
    """The numbers a decoder candidate's figures come from."""
    p = item.prediction
    plan = source.plan
    scheme = PRECISION_SCHEMES[p.precision]
    most = None
    if plan.continuous:
        candidate = Candidate(
            device=p.device,
            runtime=p.device.runtime,
            overhead=p.device.overhead,
            tensor_parallel=p.tensor_parallel,
            pipeline_parallel=p.pipeline_parallel,
        )
        most = source.max_concurrent_requests(scheme, candidate, MAX_CONCURRENCY_SHOWN)
    per_token = source.kv_bytes_per_token(scheme)
    tokens = plan.kv_tokens_per_request()
    return DecoderServingRead(
        batching=plan.batching,
        concurrent_requests=p.batch,
        max_concurrent_requests=most,
        beam_width=plan.beam_width,
        decode_sequences=p.batch * plan.beam_width,
        prompt_tokens=plan.priced_prompt_tokens,
        decode_steps=plan.decode_steps,
        mean_context_tokens=plan.mean_context_tokens,
        kv_bytes_per_token=per_token,
        kv_tokens_per_request=tokens,
        kv_bytes_per_request=kv_bytes_per_request(
            plan, per_token, gpus=p.tensor_parallel * p.pipeline_parallel
        ),
        note=plan.describe(),
    )


MAX_CONCURRENCY_SHOWN = 65_536  # the largest batch a search may try (MAX_SEARCH_BATCH)


def ranked_candidate(
    rank_: int,
    item: Assessment,
    generated: int | None,
    serving: DecoderServingRead | None = None,
) -> RankedCandidate:
    """The API view of one assessed candidate."""
    p = item.prediction
    device = p.device
    split = p.time_split_s
    latency = p.latency_s
    return RankedCandidate(
        rank=rank_,
        device=device.slug,
        device_name=device.name,
        kind=device.kind,
        mig_profile=device.mig_profile,
        precision=p.precision,
        batch_size=p.batch,
        gpus=p.tensor_parallel * p.pipeline_parallel,
        tensor_parallel=p.tensor_parallel,
        pipeline_parallel=p.pipeline_parallel,
        allreduce_link=p.allreduce_link_source or None,
        eligible=item.eligible,
        reasons=list(item.reasons),
        latency_ms=item.latency_s * 1e3,
        throughput_per_s=item.throughput_per_s,
        meets_latency_slo=item.meets_latency_slo,
        devices_needed=item.devices_needed,
        cost_usd_per_million=item.cost_usd_per_million,
        fleet_cost_usd_per_hour=item.fleet_cost_usd_per_hour,
        unpriced_reason=item.unpriced_reason,
        energy_j_per_inference=item.energy_j_per_inference,
        fits_in_memory=item.memory.fits,
        memory_required_bytes=item.memory.required_bytes,
        memory_available_bytes=item.memory.available_bytes,
        memory_detail=item.memory.detail,
        bound=p.bound,
        time_shares=TimeShares(
            compute=split[Bound.COMPUTE] / latency,
            memory=split[Bound.MEMORY] / latency,
            transfer=split[Bound.TRANSFER] / latency,
            overhead=split[Bound.OVERHEAD] / latency,
        ),
        arithmetic_intensity_flops_per_byte=p.arithmetic_intensity_flops_per_byte,
        ridge_point_flops_per_byte=p.ridge_point_flops_per_byte,
        flops_per_inference=p.flops / p.batch,
        time_to_first_token_ms=None if p.first_token_s is None else p.first_token_s * 1e3,
        per_token_latency_ms=None if p.per_token_s is None else p.per_token_s * 1e3,
        tokens_per_s=None if generated is None else item.throughput_per_s * generated,
        inputs=_inputs(p),
        phases=[PhaseRead.model_validate(t) for t in p.phases],
        server=None if item.server is None else _server_read(item.server),
        decoder_serving=serving,
        pipeline=None if p.pipeline is None else _pipeline_read(p.pipeline),
    )


def _pipeline_read(timing: PipelineTiming) -> PipelineRead:
    return PipelineRead(
        stages=timing.stages,
        micro_batches=timing.micro_batches,
        micro_batch_size=timing.micro_batch_size,
        link=timing.link_source,
        link_bytes_per_s=timing.link_bytes_per_s,
        transfer_latency_s=timing.transfer_latency_s,
        stage_layout=[
            PipelineStageRead(
                stage=index,
                blocks=span.blocks,
                kernels=span.kernels,
                first_kernel=span.first_kernel,
                last_kernel=span.last_kernel,
            )
            for index, span in enumerate(timing.spans)
        ],
        phases=[
            PipelinePhaseRead(
                name=phase.name,
                stage_s=list(phase.stage_s),
                send_bytes=list(phase.send_bytes),
                send_s=list(phase.send_s),
                slot_s=phase.slot_s,
                round_trip_s=phase.round_trip_s,
                cycle_s=phase.cycle_s,
                idle_fraction=phase.idle_fraction,
                gpipe_bubble_fraction=phase.gpipe_bubble_fraction,
            )
            for phase in timing.phases
        ],
    )


def _server_read(load: ServerLoad) -> ServerScenarioRead:
    return ServerScenarioRead(
        arrival_rate_per_s=load.arrival_rate_per_s,
        p99_latency_ms=load.p99_latency_s * 1e3,
        p99_bound_ms=load.p99_bound_s * 1e3,
        batch_cap=load.batch_cap,
        mean_batch=load.mean_batch,
        utilisation=load.utilisation,
        offline_throughput_per_s=load.offline_throughput_per_s,
        offline_share=load.offline_share,
        requests_simulated=load.requests,
        note=load.note(),
    )


# --------------------------------------------------------------------------------------------
# Roofline picture
# --------------------------------------------------------------------------------------------

MAX_CHART_DEVICES = 8


def roofline_chart(session: Session, **options: Any) -> str:
    """An SVG roofline of a stored model's kernels on up to eight devices (or MIG slices)."""
    return prepare_roofline_chart(session, **options)()


def prepare_roofline_chart(
    session: Session,
    *,
    model: str,
    devices: Sequence[str],
    precision: Precision,
    batch_size: int,
    sequence_length: int | None = None,
    image_size: int | None = None,
    prompt_tokens: int = 512,
    generated_tokens: int = 128,
    limit_units: int | None = None,
) -> Callable[[], str]:
    """Load the model and devices of :func:`roofline_chart` (work budget: graph layers x
    devices); the returned function draws it without the database (app.api.compute)."""
    if not devices:
        raise InvalidInput("name at least one device", pointer="devices")
    if len(devices) > MAX_CHART_DEVICES:
        raise InvalidInput(
            f"at most {MAX_CHART_DEVICES} devices per chart, got {len(devices)}",
            pointer="devices",
        )
    graph = model_graph(session, model, None)
    pool = candidates_of(HardwareRepository(session).all_by_slug(), devices, {})
    if limit_units is not None:
        size = graph_layers(graph[1])
        work = work_units(
            WorkFactor(name="graph layers", value=size.written_layers, field="model"),
            WorkFactor(name="devices", value=len(pool), field="devices"),
        ) + work_units(
            WorkFactor(name="executed layers", value=size.executed_layers, field="model"),
            weight=PEAK_LAYER_UNITS,
        )
        check_budget(work, limit_units, setting=BUDGET_SETTING)
    source = source_of(
        graph,
        bindings={},
        sequence_length=sequence_length,
        image_size=image_size,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        fuse_elementwise=True,
    )
    return lambda: _roofline_chart(source, pool, precision=precision, batch_size=batch_size)


def _roofline_chart(
    source: ModelSource, pool: list[Candidate], *, precision: Precision, batch_size: int
) -> str:
    scheme = PRECISION_SCHEMES[precision]
    workload = source.workload(batch_size, scheme)
    roofs: list[Roof] = []
    points: list[RoofPoint] = []
    skipped: list[str] = []
    for candidate in pool:
        checkpoint()
        device = candidate.device
        reason = unsupported_reason(device, scheme)
        if reason is not None:
            skipped.append(f"{device.slug} ({reason})")
            continue
        prediction = predict(
            workload, device, DEFAULT_CALIBRATIONS[calibration_class(device, scheme)]
        )
        index = len(roofs)
        roofs.append(
            Roof(
                label=f"{device.name}, {prediction.compute_dtype.value}",
                peak_flops_per_s=prediction.effective_flops_per_s,
                bandwidth_bytes_per_s=prediction.effective_bandwidth_bytes_per_s,
                spec_peak_flops_per_s=prediction.peak_flops_per_s * device.compute_fraction,
                spec_bandwidth_bytes_per_s=device.memory_bandwidth_bytes_per_s
                * device.bandwidth_fraction,
            )
        )
        for phase in workload.phases:
            points += [
                RoofPoint(
                    roof=index,
                    label=f"{phase.name} {point.name} ({'+'.join(point.ops)})",
                    intensity_flops_per_byte=point.intensity_flops_per_byte,
                    achieved_flops_per_s=point.achieved_flops_per_s,
                    decode=phase.name == "decode",
                )
                for point in kernel_points(phase, prediction)
                if point.achieved_flops_per_s > 0
            ]
    if not roofs:
        raise InvalidInput(
            f"no named device can run {precision.value}: " + "; ".join(skipped),
            pointer="precision",
        )
    subtitle = (
        f"{source.label}: {len(workload.phases[0].kernels)} kernels per "
        f"{workload.phases[0].name}, achieved FLOP/s with launch overhead"
    )
    if skipped:
        subtitle += "; not drawn: " + ", ".join(skipped)
    bound = [source.label, precision.value, f"batch {batch_size}"]
    if source.decoder:  # prefill at the prompt, decode steps up to prompt + generated tokens
        bound.append(f"prompt {source.prompt_tokens} + {source.generated_tokens} generated tokens")
        bound += binding_phrases(source.bindings(batch_size), skip=("batch", "seq"))
    else:
        bound += binding_phrases(source.bindings(batch_size))
    return roofline_svg(
        title=f"Roofline: {', '.join(bound)}",
        subtitle=subtitle,
        roofs=roofs,
        points=points,
    )
