"""The model a recommendation evaluates: a stored or inline graph with the request's shape
options, its analyses, phased requests and memory fits, remembered per request and (for stored
models) across requests. :class:`ModelSource` is what the domain's search asks of a model
(app.domain.performance.candidates.WorkloadSource)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from app.domain.fit import fits
from app.domain.fit import required_bytes as fit_required_bytes
from app.domain.graph.analysis import GraphAnalysis, effective_options
from app.domain.memory.checkpoint import allowed_precisions
from app.domain.memory.cuda_allocator import AllocatorSnapshot
from app.domain.memory.cuda_runtime import context_bytes, context_free
from app.domain.memory.estimate import (
    MemoryInputError,
    MemoryRequest,
    estimate_memory,
    inference_floor_bytes,
)
from app.domain.performance.batch_search import largest_fitting
from app.domain.performance.candidates import Candidate
from app.domain.performance.decoding import (
    DecoderServing,
    kv_bytes_per_request,
    kv_elements_per_token,
    serving_shape,
)
from app.domain.performance.kernel_plans import clear_plans
from app.domain.performance.phases import (
    PhasedRequest,
    PhasedRequestShape,
    forward_shape,
    is_decoder,
)
from app.domain.performance.pipeline import PipelinePlan, split_stages
from app.domain.performance.precision_schemes import PrecisionScheme
from app.domain.performance.recommend import MemoryFit
from app.domain.performance.serving import clear_server_cache
from app.domain.performance.tensor_parallel import shard
from app.domain.precision import Precision
from app.domain.quantization import CheckpointLayout
from app.domain.workload import (
    DEFAULT_SAFETY_MARGIN_FRACTION,
    Attention,
    Logits,
    Mode,
    Parallelism,
    default_attention,
)
from app.schemas.estimates import InlineArchitecture
from app.services.cache import LruCache
from app.services.convert import GraphSource, bind_dims, model_graph
from app.services.errors import InvalidInput
from app.services.pipeline import analyze_graph

T = TypeVar("T")
_ANALYSES: LruCache[tuple[Any, ...], GraphAnalysis] = LruCache(size=128, name="graph_analyses")
_SHAPES: LruCache[tuple[Any, ...], PhasedRequestShape] = LruCache(size=128, name="request_shapes")
_PEAKS: LruCache[tuple[Any, ...], int] = LruCache(size=2048, name="memory_peaks")
# the CUDA allocator's state after a model's weights, per precision and sharding (estimates at
# every batch size and workspace size start from it)
_REPLAYS: LruCache[tuple[Any, ...], AllocatorSnapshot] = LruCache(size=32, name="allocator_replays")
# what the memory engine derives from one analysis object (storage plans, forward and weight
# allocator events, inference replays; keyed by the object, which each entry holds). A cold
# default recommendation stores (benchmarks/recommendation_speed.py, "plans" column) 405 for
# ResNet-50, BERT-base and BERT-large, 457 for Llama-2-7B, 517 for GPT-3 175B, and 877 for GPT-3
# 175B with parallelism "both" (measured before single GPUs that overfill were judged on the
# floor; at size 512 its warm repeat recomputed 148 of them: 428 ms of CPU against 242). An
# entry holds 4.5-27 KiB (tracemalloc; GPT-3 175B's the largest), so 1024
# hold at most ~28 MiB: RSS 183 MiB against 172 at size 512 after all those requests in one
# process, within the deploy kit's 512Mi (deploy/kubernetes/deployment.yaml).
_PLANS: LruCache[tuple[Any, ...], Any] = LruCache(size=1024, name="memory_plans")
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
    clear_plans()


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
    checkpoint: CheckpointLayout | None = None  # a stored pre-quantized checkpoint's layout

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
        # Remembered per batch: every device and precision of a search asks for it
        found: tuple[Any, ...] | None = self.memo.get(("shape_key", batch))
        if found is not None:
            return found
        if not self.decoder:
            bindings = self.compute_bindings(batch)
            found = (self.key, "shape", tuple(bindings.items()), self.fuse_elementwise)
        else:
            prefill = self.bindings(batch, seq=self.prompt_tokens)
            found = (self.key, "shape", tuple(prefill.items()), self.fuse_elementwise, self.plan)
        self.memo[("shape_key", batch)] = found
        return found

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

    def kv_bytes_per_token(self, scheme: PrecisionScheme, tensor: int = 1) -> int:
        """KV cache of one token of one sequence, all layers, at the precision, on one rank of
        a ``tensor``-way group (KV heads replicated past the heads) [B] (remembered per
        request: the concurrency search asks for it at every step)."""
        key = ("kv_elements_per_token", tensor)
        elements: int | None = self.memo.get(key)
        if elements is None:
            elements = self.memo[key] = kv_elements_per_token(
                self.analysis(self.bindings(1, seq=1)), tensor
            )
        return elements * scheme.kv_cache_bytes

    def kv_bytes_per_request(
        self, scheme: PrecisionScheme, tensor: int = 1, pipeline: int = 1
    ) -> int:
        """Continuous batching: the paged KV cache one request holds, all beams, per GPU of
        a tensor x pipeline group (a rank's KV heads; the layers over the stages) [B]."""
        return kv_bytes_per_request(
            self.plan, self.kv_bytes_per_token(scheme, tensor), gpus=pipeline
        )

    def _memory_request(
        self, batch: int, scheme: PrecisionScheme, candidate: Candidate
    ) -> tuple[dict[str, int], Attention, MemoryRequest, int]:
        """The memory engine's bindings, attention and request for a candidate, and the paged
        KV cache of continuous batching added to its peak [B]. Serving defaults: logits for
        the last position, attention as PyTorch's SDPA picks it for the candidate's runtime
        and the precision."""
        bindings = self.memory_bindings(batch)
        attention, request, _ = self._request_of(scheme, candidate)
        paged = 0
        if self.decoder and self.plan.continuous:
            paged = batch * self.kv_bytes_per_request(
                scheme, candidate.tensor_parallel, candidate.pipeline_parallel
            )
        return bindings, attention, request, paged

    def _request_of(
        self, scheme: PrecisionScheme, candidate: Candidate
    ) -> tuple[Attention, MemoryRequest, MemoryRequest]:
        """The attention default, the memory request and its form without the CUDA context
        (``context_free``) of :meth:`_memory_request`, which depend on the batch through none
        of them: remembered per request on :meth:`_fit_base` (what they are made of)."""
        key = ("memory request of", self._fit_base(scheme, candidate))
        found: tuple[Attention, MemoryRequest, MemoryRequest] | None = self.memo.get(key)
        if found is not None:
            return found
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
            checkpoint=self.checkpoint,
        )
        found = self.memo[key] = (attention, request, context_free(request))
        return found

    def overfills(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> bool:
        """Whether the requirement surely exceeds the candidate's memory, judged from a floor
        under the memory engine's peak (weights, KV cache, workspace, context) without the
        estimate: where only whether it fits matters (a multi-GPU group that does not fit is
        not offered), the estimate is skipped when the floor alone does not fit."""
        return not fits(self._floor_bytes(batch, scheme, candidate), candidate.device.memory_bytes)

    def floor_fit(
        self, batch: int, scheme: PrecisionScheme, candidate: Candidate
    ) -> MemoryFit | None:
        """The fit judged from the floor of :meth:`overfills` when that floor alone overfills
        (``exact`` False: its required bytes are the floor's), else None."""
        floor = self._floor_bytes(batch, scheme, candidate)
        available = candidate.device.memory_bytes
        if fits(floor, available):
            return None
        return MemoryFit(
            required_bytes=floor, available_bytes=available, detail=FLOOR_DETAIL, exact=False
        )

    def _floor_bytes(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> int:
        """The requirement of the floor under the memory engine's peak [B]."""
        # Remembered per request on what the floor depends on (as in memory_fit)
        key = ("floor", batch, self._fit_base(scheme, candidate))
        required: int | None = self.memo.get(key)
        if required is None:
            bindings, attention, request, paged = self._memory_request(batch, scheme, candidate)
            # shared by devices that differ only in their CUDA context, as the estimates are
            free = self._request_of(scheme, candidate)[2]
            base = ("floor of", tuple(bindings.items()), free)
            floor: int | None = self.memo.get(base)
            if floor is None:
                floor = self.memo[base] = inference_floor_bytes(
                    self.analysis(bindings, Logits.LAST, attention), free, plans=_PLANS
                )
            # grows with the peak: the requirement is at least this
            required = self.memo[key] = fit_required_bytes(
                floor + context_bytes(request) + paged,
                safety_margin_fraction=DEFAULT_SAFETY_MARGIN_FRACTION,
            )
        return required

    def required_bytes(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> int:
        """The one requirement (app.domain.fit: the memory engine's inference peak with the
        candidate's runtime and overheads, plus the default safety margin) [B] (serving
        defaults: :meth:`_memory_request`)."""
        bindings, attention, request, paged = self._memory_request(batch, scheme, candidate)

        def estimate() -> int:
            # Devices that differ only in their CUDA context share one estimate (it is a line
            # of its own, added to the peak: app.domain.memory.cuda_runtime.context_free)
            free = self._request_of(scheme, candidate)[2]
            base = ("estimate", tuple(bindings.items()), free)
            peak: int | None = self.memo.get(base)
            if peak is None:
                try:
                    peak = estimate_memory(
                        self.analysis(bindings, Logits.LAST, attention),
                        free,
                        replays=_REPLAYS,  # keyed by the events: inline graphs too
                        plans=_PLANS,
                        explain=False,  # the fit reads the bytes only
                    ).peak_bytes
                except MemoryInputError as exc:
                    raise InvalidInput(str(exc)) from exc
                self.memo[base] = peak
            # app.domain.fit.requirement's total: the peak (context and workspace lines
            # included) with the safety margin on top
            return fit_required_bytes(
                peak + context_bytes(request) + paged,
                safety_margin_fraction=DEFAULT_SAFETY_MARGIN_FRACTION,
            )

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

    def _fit_base(self, scheme: PrecisionScheme, candidate: Candidate) -> int:
        """What a candidate's memory requirement depends on besides the batch
        (:meth:`_memory_request`): all but the device's memory, and of the GPU only whether
        there is one and its compute capability (the attention default; its name only enters
        the default's reason). As a number, one per distinct tuple of those in this request,
        found once per candidate and scheme object: a search asks for every candidate at every
        batch, and hashing the tuple's dataclasses each time cost more than the lookup."""
        by_object = ("fit base of", id(candidate), id(scheme))
        known: tuple[Candidate, PrecisionScheme, int] | None = self.memo.get(by_object)
        # The memo holds the objects, so their ids are not reused while it lives
        if known is not None and known[0] is candidate and known[1] is scheme:
            return known[2]
        gpu = candidate.device.gpu
        base = (
            scheme,
            candidate.runtime,
            candidate.overhead,
            candidate.tensor_parallel,
            candidate.pipeline_parallel,
            gpu is not None,
            None if gpu is None else gpu.compute_capability,
        )
        numbers: dict[tuple[Any, ...], int] = self.memo.setdefault(("fit bases",), {})
        number = numbers.setdefault(base, len(numbers))
        self.memo[by_object] = (candidate, scheme, number)
        return number

    def memory_fit(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> MemoryFit:
        """The fit of the workload on the candidate's memory. The requirement and its detail
        do not depend on the device but through its runtime, overheads, parallelism and (the
        attention default) compute capability (:meth:`_fit_base`): remembered per request on
        those, so devices alike in them share one (a search asks for every device at every
        batch), and the fit per device memory too (it is immutable)."""
        base = self._fit_base(scheme, candidate)
        available = candidate.device.memory_bytes
        key = ("fit", batch, base, available)
        fit: MemoryFit | None = self.memo.get(key)
        if fit is not None:
            return fit
        figures = ("fit figures", batch, base)
        found: tuple[int, str] | None = self.memo.get(figures)
        if found is None:
            found = self.memo[figures] = self._fit_figures(batch, scheme, candidate)
        required, detail = found
        fit = self.memo[key] = MemoryFit(
            required_bytes=required, available_bytes=available, detail=detail
        )
        return fit

    def _fit_figures(
        self, batch: int, scheme: PrecisionScheme, candidate: Candidate
    ) -> tuple[int, str]:
        """The requirement of :meth:`memory_fit` [B] and its detail."""
        bindings = self.memory_bindings(batch)
        shape = ", ".join(f"{k}={v}" for k, v in bindings.items())
        if self.decoder and self.plan.continuous:
            kv = self.kv_bytes_per_request(
                scheme, candidate.tensor_parallel, candidate.pipeline_parallel
            )
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
        return (
            self.required_bytes(batch, scheme, candidate),
            f"memory engine inference peak ({candidate.runtime.value}, precision "
            f"{scheme.precision.value}, {shape}{per_gpu}) + "
            f"{DEFAULT_SAFETY_MARGIN_FRACTION:.0%} safety margin; POST /v1/estimates/memory "
            "with the same options for the breakdown and the same fit",
        )


FLOOR_DETAIL = (
    "at least: a floor under the memory engine's inference peak (weights, KV cache, cuBLAS "
    f"workspace and CUDA context) + {DEFAULT_SAFETY_MARGIN_FRACTION:.0%} safety margin, which "
    "already overfills the device (the estimate was not needed for the verdict)"
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


def checkpoint_precisions(
    source: ModelSource, precisions: Sequence[Precision], pool: Sequence[Candidate]
) -> tuple[list[Precision], list[tuple[str, Precision, str]]]:
    """The requested precisions a stored pre-quantized checkpoint runs at
    (app.domain.memory.checkpoint.allowed_precisions), and the others on every candidate with
    why (exclusions: the checkpoint's weights are stored quantized)."""
    layout = source.checkpoint
    if layout is None:
        return list(precisions), []
    allowed = allowed_precisions(layout)
    reason = (
        f"the model is a pre-quantized {layout.method} checkpoint ({layout.description}): it "
        f"runs at {', '.join(p.value for p in allowed)}"
    )
    out = [(c.device.slug, p, reason) for p in precisions if p not in allowed for c in pool]
    return [p for p in precisions if p in allowed], out


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
    inputs, layers, defaults, label, key, checkpoint = graph
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
        checkpoint=None if checkpoint is None else checkpoint.layout,
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
