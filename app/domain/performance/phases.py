"""Phases and phased requests: a request's kernels per phase (a forward pass, a prefill, the
decode steps), its copies and what it assumes (pure)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from fractions import Fraction
from itertools import accumulate
from operator import attrgetter, itemgetter

from app.domain.graph.analysis import GraphAnalysis
from app.domain.graph.ops import TensorKind
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.kernel_plans import planned_kernel_counts
from app.domain.performance.kernels import (
    INDEX_BYTES,
    Kernel,
    KernelCount,
    KernelCounts,
    paid_gemm_flops,
)
from app.domain.performance.lazy import LazyTuple
from app.domain.performance.precision_schemes import PrecisionScheme
from app.domain.performance.tiling import Gemm, Tiling
from app.domain.workload import FUSED_ATTENTION, Attention


def _cost_key(k: Kernel) -> tuple[object, ...]:
    """What a kernel's cost on any device depends on: FLOPs, GEMM shapes, DRAM bytes."""
    return (
        k.flops,
        k.gemms,
        k.weight_bytes,
        k.kv_cache_bytes,
        k.input_bytes + k.output_bytes + k.intermediate_bytes,
    )


# Runs: (index of the first kernel, count) of kernels alike in all their figures but the name,
# in order of first appearance: a refinement of the groups below that holds at every precision
# and when split (a phase is priced, totalled and sharded per run, not per kernel).
Runs = tuple[tuple[int, int], ...]
# The KernelCount fields its kernels are built from (all but the name and notes)
_COUNT_FIGURES = attrgetter(
    *(f.name for f in fields(KernelCount) if f.name not in ("name", "notes"))
)


class LazyKernels(LazyTuple[Kernel]):
    """A phase's kernels, each built when first read and then kept, read as a tuple of them
    (a recommendation prices a phase from one kernel per run: building every kernel of every
    precision and tensor-parallel share would cost more than the pricing). ``totals``: the
    FLOPs, bytes moved and launches of them all, summed per run (kernels of a run are alike)."""

    __slots__ = ("_maker", "totals")

    def __init__(self, size: int, make: Callable[[int], Kernel], runs: Runs) -> None:
        super().__init__(size)
        self._maker = make
        flops = moved = launches = 0
        for index, count in runs:
            k = self._one(index)
            flops += count * k.flops
            moved += count * k.bytes_moved
            launches += count * k.launches
        self.totals = (flops, moved, launches)

    def _make(self, index: int) -> Kernel:
        return self._maker(index)


def _kernel_groups(
    kernels: Sequence[Kernel], runs: Runs | None = None
) -> tuple[tuple[Kernel, int], ...]:
    """Kernels that cost the same on every device (same FLOPs, GEMM shapes and bytes), each
    once with its count: a decoder's blocks repeat the same few kernels, so a device's profile
    is priced per distinct kernel instead of per layer. ``runs``: the kernels already grouped
    into runs of alike kernels (the same groups, in the same order, counted per run)."""
    first: dict[tuple[object, ...], int] = {}
    counts: dict[tuple[object, ...], int] = {}
    for index, count in runs if runs is not None else ((i, 1) for i in range(len(kernels))):
        key = _cost_key(kernels[index])
        if key in counts:
            counts[key] += count
        else:
            first[key] = index
            counts[key] = count
    return tuple((kernels[first[key]], count) for key, count in counts.items())


@dataclass(frozen=True, slots=True)
class KernelProfile:
    """Kernels sorted by operational intensity, with prefix sums: a device's kernel time is then
    two sums split at its ridge point (one bisection) instead of a loop over kernels."""

    intensities: tuple[float, ...]  # quantized FLOPs per DRAM byte, one per distinct kernel
    bytes_prefix: tuple[float, ...]  # DRAM bytes of the i least intense distinct kernels
    flops_suffix: tuple[float, ...]  # quantized FLOPs of the distinct kernels from i on
    kernels_suffix: tuple[int, ...]  # kernels (counted) from i on

    @classmethod
    def of(
        cls,
        groups: Sequence[tuple[Kernel, int]],
        cache_share: float,
        tiling: Tiling | None = None,
    ) -> KernelProfile:
        """The profile of ``groups`` at an activation cache share and a device's tiling."""
        return cls.priced(_bases(groups, cache_share), tiling)

    @classmethod
    def priced(
        cls,
        bases: Sequence[_Base],
        tiling: Tiling | None,
        paid_gemms: dict[tuple[Gemm, ...], float] | None = None,
    ) -> KernelProfile:
        """The profile of kernels whose tiling-independent figures are ``bases``
        (``paid_gemms``: :func:`paid_gemm_flops` at ``tiling`` by GEMMs, read and filled)."""
        paid_of = {} if paid_gemms is None else paid_gemms
        # (intensity, DRAM bytes, quantized FLOPs, count), each computed once per distinct kernel
        rows = []
        for dram, count, gemms, flops, unpaid in bases:
            # Kernel.quantized_flops, with the figures that do not depend on the tiling kept
            if tiling is None or not gemms:
                paid = float(flops)
            else:
                gemm_flops = paid_of.get(gemms)
                if gemm_flops is None:
                    gemm_flops = paid_of[gemms] = paid_gemm_flops(gemms, tiling)
                paid = gemm_flops + unpaid
            rows.append((paid / dram if dram else math.inf, dram * count, paid * count, count))
        if not rows:
            return cls(intensities=(), bytes_prefix=(0.0,), flops_suffix=(0,), kernels_suffix=(0,))
        rows.sort(key=itemgetter(0))  # stable: ties keep the kernels' order
        intensities, drams, paids, counts = zip(*rows, strict=True)
        return cls(
            intensities=intensities,
            bytes_prefix=(0.0, *accumulate(drams)),
            flops_suffix=(*reversed(tuple(accumulate(reversed(paids)))), 0),
            kernels_suffix=(*reversed(tuple(accumulate(reversed(counts)))), 0),
        )


# A distinct kernel's figures at a cache share that no device's tiling changes: its DRAM bytes,
# count, GEMMs, FLOPs and FLOPs outside the GEMMs (built once per phase and cache share)
_Base = tuple[float, int, tuple[Gemm, ...], int, int]


def _bases(groups: Sequence[tuple[Kernel, int]], cache_share: float) -> tuple[_Base, ...]:
    """Each distinct kernel's tiling-independent figures at ``cache_share``."""
    return tuple(
        (k.dram_bytes(cache_share), count, k.gemms, k.flops, k.unpaid_flops())
        for k, count in groups
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    """Kernels run ``repeats`` times per request, with the bytes copied in and out each time."""

    name: str  # "forward", "prefill" or "decode"
    kernels: Sequence[Kernel]  # a tuple, or (PhaseShape.at, shard) built kernel by kernel when read
    h2d_bytes: int
    d2h_bytes: int
    repeats: int = 1
    allreduces: int = 0  # tensor parallelism: all-reduces per repetition
    allreduce_bytes: int = 0  # and the bytes they reduce, summed [B]
    flops: int = field(init=False)
    bytes_moved: int = field(init=False)
    launches: int = field(init=False)
    _profiles: dict[tuple[float, Tiling | None], KernelProfile] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _groups: list[tuple[tuple[Kernel, int], ...]] = field(
        init=False, repr=False, compare=False, default_factory=list
    )
    _runs: list[Runs] = field(init=False, repr=False, compare=False, default_factory=list)
    _bases: dict[float, tuple[_Base, ...]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    # paid_gemm_flops per tiling and GEMMs, shared by the phases of one PhaseShape at every
    # precision (the GEMMs' shapes do not depend on it)
    _paid: dict[Tiling, dict[tuple[Gemm, ...], float]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        if self.repeats < 0:
            raise RooflineInputError(f"phase '{self.name}': repeats must be >= 0")
        kernels = self.kernels
        if isinstance(kernels, LazyKernels):  # summed per run, without building them all
            flops, moved, launches = kernels.totals
        else:
            flops = sum(k.flops for k in kernels)
            moved = sum(k.bytes_moved for k in kernels)
            launches = sum(k.launches for k in kernels)
        object.__setattr__(self, "flops", flops)
        object.__setattr__(self, "bytes_moved", moved)
        object.__setattr__(self, "launches", launches)

    def share_profiles(self, other: Phase) -> None:
        """Read and keep profiles in ``other``'s tables: for a phase whose kernels have the
        same figures as ``other``'s, kernel by kernel (the same shape at a precision of the
        same bytes), so each profile is built once for both."""
        object.__setattr__(self, "_profiles", other._profiles)
        object.__setattr__(self, "_groups", other._groups)
        object.__setattr__(self, "_bases", other._bases)

    def dram_bytes(self, cache_share: float) -> float:
        """DRAM bytes of one repetition at an activation cache share [B]."""
        return self.profile(cache_share).bytes_prefix[-1]

    def profile(self, cache_share: float, tiling: Tiling | None = None) -> KernelProfile:
        """The sorted kernels at an activation cache share and a device's tiling (built once
        per pair)."""
        key = (cache_share, tiling)
        found = self._profiles.get(key)
        if found is None:
            if not self._groups:
                runs = self._runs[0] if self._runs else None
                self._groups.append(_kernel_groups(self.kernels, runs))
            bases = self._bases.get(cache_share)
            if bases is None:
                bases = self._bases[cache_share] = _bases(self._groups[0], cache_share)
            paid = None if tiling is None else self._paid.setdefault(tiling, {})
            found = self._profiles[key] = KernelProfile.priced(bases, tiling, paid)
        return found


@dataclass(frozen=True, slots=True, kw_only=True)
class PhasedRequest:
    """One request of a model split into phases (a forward pass, or a decoder's prefill and
    decode steps) at a batch size and precision: what :func:`predict` times. Not the API's
    workload (:class:`app.domain.workload.WorkloadSpec`): the roofline's view of one request.
    """

    batch: int
    scheme: PrecisionScheme
    phases: tuple[Phase, ...]
    decoder: bool = False
    generated_tokens: int = 0  # decoders: tokens produced per sequence (prefill gives the 1st)
    attention: tuple[tuple[Attention, str], ...] = ()  # implementations the graph runs, and why
    assumptions: tuple[str, ...] = ()  # the precision, attention and MoE routing, in words
    tensor_parallel: int = 1  # GPUs the request is split across (each runs 1/t of it)
    # flops and bytes_moved, summed once (a search predicts the request on every device)
    _totals: tuple[int, int] = field(init=False, repr=False, compare=False, default=(0, 0))

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise RooflineInputError("batch must be >= 1")
        if self.tensor_parallel < 1:
            raise RooflineInputError("tensor_parallel must be >= 1")
        if not self.phases:
            raise RooflineInputError("a request needs at least one phase")
        flops = sum(p.flops * p.repeats for p in self.phases)
        moved = sum(p.bytes_moved * p.repeats for p in self.phases)
        object.__setattr__(self, "_totals", (flops, moved))

    @property
    def flops(self) -> int:
        """FLOPs per request (all phases and repeats)."""
        return self._totals[0]

    @property
    def bytes_moved(self) -> int:
        """Device-memory bytes moved per request [B]."""
        return self._totals[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseShape:
    """A phase in elements: its kernels and copies, independent of the precision."""

    name: str
    # a tuple, or kernel_counts' rows (each KernelCount built when read)
    counts: Sequence[KernelCount]
    h2d_float: int  # elements copied in
    h2d_index: int
    d2h_float: int  # elements copied out
    d2h_index: int
    repeats: int = 1
    _runs: list[Runs] = field(init=False, repr=False, compare=False, default_factory=list)
    # The first phase built at each byte signature (bytes per weight, activation and KV-cache
    # element: all a kernel's figures take from a precision, KernelCount.at); a later phase at
    # the same signature (fp16 and bf16) shares its profiles, which are the same numbers
    _alike: dict[tuple[Fraction, int, int], Phase] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _notes: list[tuple[str, ...]] = field(
        init=False, repr=False, compare=False, default_factory=list
    )
    # Phase._paid of the phases built from it
    _paid: dict[Tiling, dict[tuple[Gemm, ...], float]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    @property
    def notes(self) -> tuple[str, ...]:
        """The distinct notes of its kernels (MoE routing, spilled attention scores)."""
        if not self._notes:
            if isinstance(self.counts, KernelCounts):
                self._notes.append(self.counts.notes())
            else:
                notes = dict.fromkeys(note for count in self.counts for note in count.notes)
                self._notes.append(tuple(notes))
        return self._notes[0]

    @property
    def runs(self) -> Runs:
        """Its kernels alike in every figure but the name (and notes), as (first index,
        count) in order of first appearance (found once)."""
        if not self._runs and isinstance(self.counts, KernelCounts):
            self._runs.append(self.counts.runs())
        if not self._runs:
            first: dict[tuple[object, ...], int] = {}
            counts: dict[tuple[object, ...], int] = {}
            for index, count in enumerate(self.counts):
                key = _COUNT_FIGURES(count)
                if key in counts:
                    counts[key] += 1
                else:
                    first[key] = index
                    counts[key] = 1
            self._runs.append(tuple((first[key], n) for key, n in counts.items()))
        return self._runs[0]

    def at(self, scheme: PrecisionScheme) -> Phase:
        """The phase in bytes at a precision (its kernels built when read)."""
        act = scheme.activation_bytes
        counts, runs = self.counts, self.runs
        phase = Phase(
            name=self.name,
            kernels=LazyKernels(len(counts), lambda index: counts[index].at(scheme), runs),
            h2d_bytes=self.h2d_float * act + self.h2d_index * INDEX_BYTES,
            d2h_bytes=self.d2h_float * act + self.d2h_index * INDEX_BYTES,
            repeats=self.repeats,
        )
        phase._runs.append(runs)
        object.__setattr__(phase, "_paid", self._paid)
        first = self._alike.setdefault((scheme.weight_bytes, act, scheme.kv_cache_bytes), phase)
        if first is not phase:
            phase.share_profiles(first)
        return phase


def attention_assumption(impl: Attention, reason: str) -> str:
    """What the roofline prices for an attention implementation, and why it was chosen."""
    if impl in FUSED_ATTENTION:
        moved = (
            "fused: the S x S scores stay on chip (only q, k, v and the output move; flash "
            "and mem_efficient are priced alike)"
        )
    else:
        moved = "unfused: the S x S scores and probabilities are written and read back"
    return f"attention {impl.value} ({reason}): {moved}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PhasedRequestShape:
    """A :class:`PhasedRequest` in elements, before a precision is chosen."""

    batch: int
    phases: tuple[PhaseShape, ...]
    decoder: bool = False
    generated_tokens: int = 0
    attention: tuple[tuple[Attention, str], ...] = ()

    @property
    def assumptions(self) -> tuple[str, ...]:
        """Attention implementations, then each phase's kernel notes (precision-independent)."""
        attention = (attention_assumption(impl, why) for impl, why in self.attention)
        notes = (f"{phase.name}: {note}" for phase in self.phases for note in phase.notes)
        return (*attention, *notes)

    def at(self, scheme: PrecisionScheme) -> PhasedRequest:
        """The request at a precision."""
        return PhasedRequest(
            batch=self.batch,
            scheme=scheme,
            phases=tuple(phase.at(scheme) for phase in self.phases),
            decoder=self.decoder,
            generated_tokens=self.generated_tokens,
            attention=self.attention,
            assumptions=(scheme.assumption, *self.assumptions),
        )


def _input_elements(analysis: GraphAnalysis) -> tuple[int, int]:
    index = sum(i.numel for i in analysis.inputs if i.kind is TensorKind.INDEX)
    return sum(i.numel for i in analysis.inputs) - index, index


def forward_shape(
    analysis: GraphAnalysis, *, batch: int, fuse_elementwise: bool = True
) -> PhasedRequestShape:
    """One forward pass per request (CNNs, encoders): inputs copied in, output copied out.

    Float inputs and outputs travel at the activation precision (the host quantizes before the
    copy, as MLPerf harnesses do), token ids as int64. Attention is priced as the analysis ran
    it (``analysis.attention_used``).
    """
    out = math.prod(analysis.output_shape)
    out_index = analysis.output_kind is TensorKind.INDEX
    h2d_float, h2d_index = _input_elements(analysis)
    phase = PhaseShape(
        name="forward",
        counts=planned_kernel_counts(analysis, fuse_elementwise=fuse_elementwise),
        h2d_float=h2d_float,
        h2d_index=h2d_index,
        d2h_float=0 if out_index else out,
        d2h_index=out if out_index else 0,
    )
    return PhasedRequestShape(batch=batch, phases=(phase,), attention=analysis.attention_used)


def forward_request(
    analysis: GraphAnalysis, scheme: PrecisionScheme, *, batch: int, fuse_elementwise: bool = True
) -> PhasedRequest:
    """:func:`forward_shape` at a precision."""
    return forward_shape(analysis, batch=batch, fuse_elementwise=fuse_elementwise).at(scheme)


def decoder_shape(
    prefill: GraphAnalysis,
    step: GraphAnalysis,
    *,
    batch: int,
    prompt_tokens: int,
    generated_tokens: int,
    beam_width: int = 1,
    shared_prompt_tokens: int = 0,
    fuse_elementwise: bool = True,
) -> PhasedRequestShape:
    """A decoder LLM request: prefill the prompt, then one decode step per further token.

    Parameters
    ----------
    prefill : the graph analysed at ``seq = prompt_tokens``
    step : the graph analysed at ``seq = 1`` (one new token per sequence)
    batch : sequences decoded together [-]
    prompt_tokens : prompt length [tokens]
    generated_tokens : tokens generated per sequence; the prefill yields the first [tokens]
    beam_width : beams per request, ``k``: the graphs' rows are the requests' beams as the
        serving mode lays them out (:mod:`app.domain.performance.decoding`), ``batch`` counts
        requests, and the host receives one token id per beam and step [-]
    shared_prompt_tokens : prompt tokens whose cached keys and values the ``k`` beams of a
        request share and read once per decode step (0: every beam reads its own copy) [tokens]

    Notes
    -----
    The prefill copies the prompt's token ids in (8 B each) and writes the KV cache; every decode
    step reads all weights (a mixture-of-experts layer: the experts its ``batch`` tokens are
    routed to) and the KV cache of ``c`` earlier tokens, evaluated at the mean context
    ``c = prompt_tokens + generated_tokens / 2`` (decode time is linear in ``c`` within one
    bound), and sends each sequence's sampled token id (8 B) to the host. The LM head runs over
    every prompt position in the prefill unless the analysis keeps the last position's logits.
    """
    h2d_float, h2d_index = _input_elements(prefill)
    first = PhaseShape(
        name="prefill",
        counts=planned_kernel_counts(prefill, fuse_elementwise=fuse_elementwise, kv_cache=True),
        h2d_float=h2d_float,
        h2d_index=h2d_index,
        d2h_float=0,
        d2h_index=batch * beam_width,
    )
    decode = PhaseShape(
        name="decode",
        counts=planned_kernel_counts(
            step,
            fuse_elementwise=fuse_elementwise,
            kv_cache=True,
            kv_context_tokens=prompt_tokens + generated_tokens // 2,
            kv_shared_tokens=shared_prompt_tokens,
            beam_width=beam_width,
        ),
        h2d_float=0,
        h2d_index=0,
        d2h_float=0,
        d2h_index=batch * beam_width,
        repeats=generated_tokens - 1,
    )
    return PhasedRequestShape(
        batch=batch,
        phases=(first, decode),
        decoder=True,
        generated_tokens=generated_tokens,
        attention=tuple(dict.fromkeys((*prefill.attention_used, *step.attention_used))),
    )


def decoder_request(
    prefill: GraphAnalysis,
    step: GraphAnalysis,
    scheme: PrecisionScheme,
    *,
    batch: int,
    prompt_tokens: int,
    generated_tokens: int,
    fuse_elementwise: bool = True,
) -> PhasedRequest:
    """:func:`decoder_shape` at a precision."""
    shape = decoder_shape(
        prefill,
        step,
        batch=batch,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        fuse_elementwise=fuse_elementwise,
    )
    return shape.at(scheme)


def is_decoder(layers: Sequence[Mapping[str, object]]) -> bool:
    """Whether a layer graph has causal self-attention (a decoder LLM), blocks included."""
    for layer in layers:
        if layer.get("op") == "attention" and layer.get("causal"):
            return True
        nested = layer.get("layers")
        if isinstance(nested, list) and is_decoder(nested):
            return True
    return False
