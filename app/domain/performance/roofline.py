"""Calibrated roofline model of inference latency and throughput on one device (pure).

A model's forward pass is a sequence of kernels (layers, with element-wise layers fused into
the kernel that produced their input). Each kernel takes

    t_k = max(F'_k / (P * eta_c * f_c), D_k / (BW * eta_m * f_m)) + t_launch
    D_k = W_k + KV_k + (1 - s) * (I_k + O_k + S_k)
    F'_k = sum over its GEMMs g of F_g / eta_w(g) + (F_k - sum F_g)

where F_k are its FLOPs and F'_k what the device pays for them: each GEMM (a convolution's
implicit GEMM, the attention core) runs in output tiles spread over the device's SMs (cores on
a CPU) in waves, and ``eta_w = tiles / (ceil(tiles / SMs) * SMs)`` is the share of the SMs its
waves keep busy (:func:`wave_efficiency`; GPUs split the reduction when the tiles do not fill
the SMs, :func:`split_k_factor`); W_k, I_k, O_k and KV_k its weight, input, output and KV-cache
bytes at the chosen precision (one row of the precision table, :data:`PRECISION_SCHEMES`), S_k
the S x S attention scores and probabilities an unfused attention (eager, sdpa_math) writes and
reads back (0 for flash / mem_efficient, which keep them on chip; the implementation is the one
the graph analysis ran, ``analyze(attention=...)``, by default PyTorch SDPA's pick); ``B_k =
W_k + I_k + O_k + KV_k + S_k`` is its bytes moved; D_k the part of them that reaches DRAM when
on-chip caches (L2, LLC) serve the share ``s`` of the activation traffic between kernels (the
roofline's operational intensity is per DRAM byte, after the caches); P the device's dense peak
for the precision's compute dtype (W8A8 conventions: the 8-bit peak; weight-only ones: the
16-bit peak), BW its memory bandwidth, eta_c / eta_m the efficiencies of the device kind, f_c /
f_m the MIG slice's share of compute and bandwidth (1 for a whole device) and t_launch the
per-kernel launch overhead. A mixture-of-experts layer reads the router and the E * (1 - (1 -
k/E)^T) experts its T tokens are routed to (uniform routing): k at batch-1 decode, all E in a
prefill. On a GPU the batch's inputs cross the host link before the kernels run and its outputs
after, at L * eta_l, and every request pays a fixed serving overhead t_req:

    latency = t_req + sum over phases of repeats * (h2d + sum_k t_k + d2h)

A serving framework that issues kernels from the host one at a time (``t_host`` per kernel:
:attr:`Calibration.host_dispatch_s`, set by the serving-runtime profiles; 0 for the engines the
calibration was fitted on) overlaps that work with the device's, launches being asynchronous,
so a phase's ``sum_k t_k`` becomes ``max(sum_k t_k, launches * t_host)``.

Decoder LLMs have two phases: prefill over the prompt (once) and one decode step per further
generated token (the weights plus the KV cache of every earlier token are read per step).

Steady-state throughput overlaps what can overlap: on an accelerator the copy engines move the
next batch while the kernels run and the host prepares the next request, so a batch every
``max(kernel time, h2d, d2h, t_req)``; a CPU does everything on its own cores, one batch per
latency. ``throughput = batch / interval``.

Efficiency factors, the activation cache share and overheads are named defaults per calibration
class (:data:`DEFAULT_CALIBRATIONS`: the device kind, with CPUs split by whether AMX tiles run
the math, :class:`CalibrationClass`), derived by ``benchmarks/calibration/calibrate.py`` from
measured MLPerf ResNet-50 Offline throughput, host-to-device copy bandwidth and kernel-launch
figures; a request may override them. Without the cache share the per-layer byte count (every
activation to and from DRAM) overstates what fused engines move, and a compute-only fit needs
near-peak efficiencies (0.87-1.0) to reach the measurements (see benchmarks/calibration).

The model's parts live beside this module, one concept each: ``precision_schemes`` (the
precision table), ``calibration`` (the classes and their fitted constants), ``tiling`` (tiles
and waves), ``kernels`` (per-layer FLOPs and bytes), ``phases`` (phased requests and their
shapes), ``tensor_parallel`` (shards and all-reduces) and ``prediction`` (what a prediction is
made of); this module checks a device's figures and times a request (:func:`predict`).

References
----------
Williams, Waterman and Patterson, "Roofline: an insightful visual performance model for
multicore architectures", Communications of the ACM 52(4), 2009.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.hardware import (
    MAX_BANDWIDTH_BYTES_PER_S,
    MAX_PEAK_FLOPS_PER_S,
    MAX_PRICE_USD_PER_HOUR,
    MAX_TDP_WATTS,
    MIN_BANDWIDTH_BYTES_PER_S,
    MIN_FRACTION,
    MIN_PEAK_FLOPS_PER_S,
    DeviceKind,
    HardwareSpec,
    in_range,
)
from app.domain.performance.calibration import Calibration, cpu_compute_unit
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.phases import KernelProfile, Phase, PhasedRequest
from app.domain.performance.precision_schemes import PrecisionScheme, compute_dtype_for
from app.domain.performance.prediction import Bound, PhaseTiming, Prediction, kernel_seconds
from app.domain.performance.tensor_parallel import AllReduce
from app.domain.performance.tiling import Tiling, tiling_for
from app.domain.precision import DType


def implausible_figures(device: HardwareSpec, dtype: DType) -> str | None:
    """Why the figures of ``device`` that a prediction at ``dtype`` divides by are not physical
    (zero, subnormal, negative, non-finite or absurdly large), or None when they are sane."""
    if _sane(device, dtype):  # the common case, without naming every figure
        return None
    problems = []
    ranges: list[tuple[str, object, float, float, str]] = [
        (f"peak_flops_per_s[{dtype.value}]", device.peak_flops_per_s.get(dtype),
         MIN_PEAK_FLOPS_PER_S, MAX_PEAK_FLOPS_PER_S, " FLOP/s"),
        ("memory_bandwidth_bytes_per_s", device.memory_bandwidth_bytes_per_s,
         MIN_BANDWIDTH_BYTES_PER_S, MAX_BANDWIDTH_BYTES_PER_S, " B/s"),
        ("compute_fraction", device.compute_fraction, MIN_FRACTION, 1.0, ""),
        ("bandwidth_fraction", device.bandwidth_fraction, MIN_FRACTION, 1.0, ""),
    ]  # fmt: skip
    if device.needs_host_copy and device.host_link_bytes_per_s is not None:
        ranges.append(("host_link.bandwidth_bytes_per_s", device.host_link_bytes_per_s,
                       MIN_BANDWIDTH_BYTES_PER_S, MAX_BANDWIDTH_BYTES_PER_S, " B/s"))  # fmt: skip
    if device.tdp_watts is not None:
        ranges.append(("tdp_watts", device.tdp_watts, 0.0, MAX_TDP_WATTS, " W"))
    if device.price_usd_per_hour is not None:
        ranges.append(("price_usd_per_hour", device.price_usd_per_hour, 0.0,
                       MAX_PRICE_USD_PER_HOUR, " USD/h"))  # fmt: skip
    for name, value, low, high, unit in ranges:
        if not in_range(value, low, high):
            problems.append(f"{name} {value!r} is outside [{low:g}, {high:g}]{unit}")
    if not in_range(device.memory_bytes, 0, math.inf):
        problems.append(f"memory_bytes {device.memory_bytes!r} is not a size")
    if not problems:
        return None
    return "non-physical figures in the hardware profile: " + "; ".join(problems)


def _sane(device: HardwareSpec, dtype: DType) -> bool:
    """Whether every figure :func:`implausible_figures` checks is in its range (the same
    checks, no messages: a recommendation asks this of every candidate and precision)."""
    host = device.host_link_bytes_per_s if device.needs_host_copy else None
    return (
        in_range(device.peak_flops_per_s.get(dtype), MIN_PEAK_FLOPS_PER_S, MAX_PEAK_FLOPS_PER_S)
        and in_range(
            device.memory_bandwidth_bytes_per_s,
            MIN_BANDWIDTH_BYTES_PER_S,
            MAX_BANDWIDTH_BYTES_PER_S,
        )
        and in_range(device.compute_fraction, MIN_FRACTION, 1.0)
        and in_range(device.bandwidth_fraction, MIN_FRACTION, 1.0)
        and (host is None or in_range(host, MIN_BANDWIDTH_BYTES_PER_S, MAX_BANDWIDTH_BYTES_PER_S))
        and (device.tdp_watts is None or in_range(device.tdp_watts, 0.0, MAX_TDP_WATTS))
        and (
            device.price_usd_per_hour is None
            or in_range(device.price_usd_per_hour, 0.0, MAX_PRICE_USD_PER_HOUR)
        )
        and in_range(device.memory_bytes, 0, math.inf)
    )


def unsupported_reason(device: HardwareSpec, scheme: PrecisionScheme) -> str | None:
    """Why ``device`` cannot run ``scheme`` (no peak for its dtype, no host link, figures that
    are not physical), or None."""
    dtype = compute_dtype_for(device, scheme)
    if dtype is None:
        have = ", ".join(sorted(d.value for d in device.peak_flops_per_s)) or "none"
        wanted = " or ".join(d.value for d in scheme.compute_dtypes)
        return f"no {wanted} peak in the hardware profile (it lists: {have})"
    if device.needs_host_copy and device.host_link_bytes_per_s is None:
        return "no host-link bandwidth in the hardware profile: the copy cannot be modelled"
    return implausible_figures(device, dtype)


def _peak_source(device: HardwareSpec, dtype: DType) -> str:
    base = f"catalog dense {dtype.value} peak"
    if device.kind is not DeviceKind.CPU or not device.simd:
        return base
    return f"{base} ({cpu_compute_unit(device.simd, dtype)}; the CPU has {device.simd})"


# One phase's seconds per repetition on a device: compute, memory, launch, all-reduce, host
# wait, copy in, copy out (see :func:`_phase_seconds`)
_Seconds = tuple[float, float, float, float, float, float, float]


def _phase_seconds(
    phase: Phase,
    prof: KernelProfile,
    split: int,
    *,
    flops_per_s: float,
    bytes_per_s: float,
    link: float | None,
    cal: Calibration,
    allreduce: AllReduce | None = None,
) -> _Seconds:
    """A phase's times per repetition from its profile split at the device's ridge point."""
    allreduce_s = 0.0
    if allreduce is not None and phase.allreduces:
        allreduce_s = allreduce.seconds(phase.allreduces, phase.allreduce_bytes)
    compute_s = prof.flops_suffix[split] / flops_per_s
    memory_s = prof.bytes_prefix[split] / bytes_per_s
    launch_s = phase.launches * cal.kernel_launch_overhead_s
    device_s = compute_s + memory_s + launch_s + allreduce_s
    host_wait_s = max(0.0, phase.launches * cal.host_dispatch_s - device_s)
    h2d_s = phase.h2d_bytes / link if link else 0.0
    d2h_s = phase.d2h_bytes / link if link else 0.0
    return compute_s, memory_s, launch_s, allreduce_s, host_wait_s, h2d_s, d2h_s


def _phase_timing(
    phase: Phase,
    *,
    flops_per_s: float,
    bytes_per_s: float,
    link: float | None,
    cal: Calibration,
    allreduce: AllReduce | None = None,
    tiling: Tiling | None = None,
) -> PhaseTiming:
    prof = phase.profile(cal.activation_cache_share, tiling)
    split = bisect_right(prof.intensities, flops_per_s / bytes_per_s)
    compute_s, memory_s, launch_s, allreduce_s, host_wait_s, h2d_s, d2h_s = _phase_seconds(
        phase,
        prof,
        split,
        flops_per_s=flops_per_s,
        bytes_per_s=bytes_per_s,
        link=link,
        cal=cal,
        allreduce=allreduce,
    )
    return PhaseTiming(
        name=phase.name,
        repeats=phase.repeats,
        kernels=len(phase.kernels),
        launches=phase.launches,
        compute_bound_kernels=prof.kernels_suffix[split],
        flops=phase.flops,
        bytes_moved=phase.bytes_moved,
        dram_bytes=prof.bytes_prefix[-1],
        compute_s=compute_s,
        memory_s=memory_s,
        launch_s=launch_s,
        host_wait_s=host_wait_s,
        h2d_bytes=phase.h2d_bytes if link else 0,
        h2d_s=h2d_s,
        d2h_bytes=phase.d2h_bytes if link else 0,
        d2h_s=d2h_s,
        allreduces=phase.allreduces if allreduce else 0,
        allreduce_bytes=phase.allreduce_bytes if allreduce else 0,
        allreduce_s=allreduce_s,
        wave_efficiency=phase.flops / prof.flops_suffix[0] if prof.flops_suffix[0] else 1.0,
    )


# What a prediction takes from a device, a precision scheme and a calibration alone: the
# compute dtype, its peak, the effective rates, the tiling, the peak's source and the 16-bit
# note (see :func:`_device_rates`).
_Rates = tuple[DType, float, float, float, float | None, Tiling | None, str, tuple[str, ...]]
# Remembered per (device, scheme, calibration) object, each kept alive by its entry (so an id
# is not reused while cached) and compared by identity: a recommendation predicts every
# device at every batch size, and these do not depend on the batch. Bounded: cleared when full.
_RATES: dict[tuple[int, int, int], tuple[HardwareSpec, PrecisionScheme, Calibration, _Rates]] = {}
_RATES_MAX = 4096


def _device_rates(device: HardwareSpec, scheme: PrecisionScheme, cal: Calibration) -> _Rates:
    """The batch-independent figures of :func:`predict` (raises as it does)."""
    key = (id(device), id(scheme), id(cal))
    found = _RATES.get(key)
    if found is not None and found[0] is device and found[1] is scheme and found[2] is cal:
        return found[3]
    dtype, peak, tiling, peak_source = _device_support(device, scheme)
    flops_per_s = peak * device.compute_fraction * cal.compute_efficiency_for(dtype)
    bytes_per_s = (
        device.memory_bandwidth_bytes_per_s * device.bandwidth_fraction * cal.memory_efficiency
    )
    link = None
    if device.needs_host_copy and device.host_link_bytes_per_s is not None:
        link = device.host_link_bytes_per_s * cal.host_link_efficiency
    rates: _Rates = (
        dtype,
        peak,
        flops_per_s,
        bytes_per_s,
        link,
        tiling,
        peak_source,
        _precision_scale_note(cal, dtype),
    )
    if len(_RATES) >= _RATES_MAX:
        _RATES.clear()
    _RATES[key] = (device, scheme, cal, rates)
    return rates


# What a prediction takes from a device and a precision scheme alone, whatever the
# calibration (the compute dtype, its peak, the tiling, the peak's source), remembered as
# :data:`_RATES` is: a calibration fit tries thousands of calibrations on the same devices.
_Support = tuple[DType, float, Tiling | None, str]
_SUPPORT: dict[tuple[int, int], tuple[HardwareSpec, PrecisionScheme, _Support]] = {}


def _device_support(device: HardwareSpec, scheme: PrecisionScheme) -> _Support:
    """The calibration-independent part of :func:`_device_rates`; raises when ``device``
    cannot run ``scheme`` (:func:`unsupported_reason`)."""
    key = (id(device), id(scheme))
    found = _SUPPORT.get(key)
    if found is not None and found[0] is device and found[1] is scheme:
        return found[2]
    reason = unsupported_reason(device, scheme)
    dtype = compute_dtype_for(device, scheme)
    if reason is not None or dtype is None:
        raise RooflineInputError(f"{device.slug} cannot run {scheme.precision}: {reason}")
    support = (
        dtype,
        device.peak_flops_per_s[dtype],
        tiling_for(device),
        _peak_source(device, dtype),
    )
    if len(_SUPPORT) >= _RATES_MAX:
        _SUPPORT.clear()
    _SUPPORT[key] = (device, scheme, support)
    return support


def predict(request: PhasedRequest, device: HardwareSpec, calibration: Calibration) -> Prediction:
    """Latency, throughput and their split for ``request`` on ``device``.

    Parameters
    ----------
    request : kernels per phase, copies, batch, and what they assume
    device : peaks, bandwidths, MIG fractions
    calibration : efficiencies and overheads of the device's kind

    Returns
    -------
    prediction : with the effective rates and per-phase times the figures come from

    Raises
    ------
    RooflineInputError
        When the device cannot run the precision or its figures are not physical (see
        :func:`unsupported_reason`), or the latency would not be a positive, finite time.

    Notes
    -----
    Per kernel ``t_k = max(F'_k / P_eff, D_k / BW_eff) + t_launch`` with ``F'_k`` its FLOPs
    with each GEMM's divided by its wave efficiency on the device's SMs or cores
    (:meth:`Kernel.quantized_flops`; ``F_k`` where the count is unknown) and
    ``D_k = W_k + KV_k + (1 - s) * (I_k + O_k + S_k)`` (``s``: activation cache share,
    ``S_k``: S x S scores an unfused attention spills),
    ``P_eff = P[dtype] * f_c * min(1, eta_c * s_dtype)`` (``s_dtype``: the calibration's
    16-bit scale for fp16 / bf16 math, else 1) and ``BW_eff = BW * f_m * eta_m``; a GPU adds
    ``h2d / L_eff + d2h / L_eff`` per phase repetition (``L_eff = L * eta_l``) and ``t_req``
    per request. A framework that issues kernels from the host one at a time (``t_host`` per
    kernel, the calibration's ``host_dispatch_s``) overlaps that work with the device's, since
    launches are asynchronous: a phase's kernel time is
    ``max(sum of t_k + all-reduces, launches x t_host)``, the lower bound of a launch queue
    (device never idle, or host never idle; ``sum of max(t_k, t_host)`` would be the upper
    one, which the closed form over sorted kernels cannot give). Latency is the serial sum;
    the steady-state interval per batch is ``max(sum of kernel time, h2d time, d2h time,
    t_req)`` on accelerators (copy engines and the host overlap the kernels) and the latency
    on CPUs.
    """
    cal = calibration
    rates = _device_rates(device, request.scheme, cal)
    dtype, peak, flops_per_s, bytes_per_s, link, tiling, peak_source, scale_note = rates
    allreduce = None
    if request.tensor_parallel > 1:
        allreduce = AllReduce.between(device, request.tensor_parallel, cal)
    timings = tuple(
        _phase_timing(
            p,
            flops_per_s=flops_per_s,
            bytes_per_s=bytes_per_s,
            link=link,
            cal=cal,
            allreduce=allreduce,
            tiling=tiling,
        )
        for p in request.phases
    )
    overhead = cal.request_overhead_s
    latency, interval, first_token, per_token = _request_seconds(
        [(t.latency_s, t.kernel_s, t.h2d_s, t.d2h_s, t.repeats) for t in timings],
        overhead,
        cpu=device.kind is DeviceKind.CPU,
        decoder=request.decoder,
    )
    return Prediction(
        device=device,
        precision=request.scheme.precision,
        batch=request.batch,
        compute_dtype=dtype,
        peak_flops_per_s=peak,
        peak_source=peak_source,
        calibration=cal,
        effective_flops_per_s=flops_per_s,
        effective_bandwidth_bytes_per_s=bytes_per_s,
        effective_host_link_bytes_per_s=link,
        phases=timings,
        request_overhead_s=overhead,
        latency_s=latency,
        interval_s=interval,
        flops=request.flops,
        bytes_moved=request.bytes_moved,
        dram_bytes=sum(t.dram_bytes * t.repeats for t in timings),
        first_token_s=first_token,
        per_token_s=per_token,
        attention=request.attention,
        assumptions=request.assumptions + scale_note,
        tensor_parallel=request.tensor_parallel,
        allreduce_link_source="" if allreduce is None else allreduce.source,
        tiling=tiling,
    )


# A phase's figures a request's times add up, per repetition: latency, kernel time, copy in,
# copy out; and its repetitions
_PhaseTotals = tuple[float, float, float, float, int]


def _request_seconds(
    phases: Sequence[_PhaseTotals], overhead_s: float, *, cpu: bool, decoder: bool
) -> tuple[float, float, float | None, float | None]:
    """A request's latency, steady-state interval, first-token and per-token times [s] from
    its phases (:func:`predict`'s Notes: the serial sum; the overlapped interval on
    accelerators, the latency on CPUs)."""
    latency = overhead_s + sum(t[0] * t[4] for t in phases)
    if cpu:
        interval = latency
    else:
        interval = max(
            sum(t[1] * t[4] for t in phases),
            sum(t[2] * t[4] for t in phases),
            sum(t[3] * t[4] for t in phases),
            overhead_s,
        )
    first_token = per_token = None
    if decoder:
        first_token = overhead_s + phases[0][0]
        per_token = phases[1][0] if len(phases) > 1 else None
    return latency, interval, first_token, per_token


def predict_seconds(
    request: PhasedRequest, device: HardwareSpec, calibration: Calibration
) -> tuple[float, float, float | None, float | None]:
    """The latency, steady-state interval, first-token and per-token times of
    :func:`predict` [s], the same figures without building the prediction: a recommendation
    ranks every batch of a candidate by them and builds the prediction of the batch it shows.
    Raises as :func:`predict` does."""
    cal = calibration
    _, _, flops_per_s, bytes_per_s, link, tiling, _, _ = _device_rates(device, request.scheme, cal)
    allreduce = None
    if request.tensor_parallel > 1:
        allreduce = AllReduce.between(device, request.tensor_parallel, cal)
    share = cal.activation_cache_share
    ridge = flops_per_s / bytes_per_s
    phases = []
    for phase in request.phases:
        prof = phase.profile(share, tiling)
        compute_s, memory_s, launch_s, allreduce_s, host_wait_s, h2d_s, d2h_s = _phase_seconds(
            phase,
            prof,
            bisect_right(prof.intensities, ridge),
            flops_per_s=flops_per_s,
            bytes_per_s=bytes_per_s,
            link=link,
            cal=cal,
            allreduce=allreduce,
        )
        kernel_s = kernel_seconds(compute_s, memory_s, launch_s, allreduce_s, host_wait_s)
        # PhaseTiming.latency_s
        phases.append((h2d_s + kernel_s + d2h_s, kernel_s, h2d_s, d2h_s, phase.repeats))
    seconds = _request_seconds(
        phases,
        cal.request_overhead_s,
        cpu=device.kind is DeviceKind.CPU,
        decoder=request.decoder,
    )
    latency, interval = seconds[0], seconds[1]
    low = sys.float_info.min
    if not (low <= flops_per_s < math.inf and low <= bytes_per_s < math.inf) or not (
        type(latency) is float
        and type(interval) is float
        and low <= latency < math.inf
        and low <= interval < math.inf
    ):
        predict(request, device, calibration)  # raises: Prediction checks its figures
    return seconds


def _precision_scale_note(cal: Calibration, dtype: DType) -> tuple[str, ...]:
    """The 16-bit scale in words, where it applies (nothing otherwise)."""
    scale = cal.precision_scale(dtype)
    if scale == 1.0:
        return ()
    return (
        f"{dtype.value} math at {scale:g} x the calibrated compute efficiency "
        f"({cal.compute_efficiency:g} -> {cal.compute_efficiency_for(dtype):.3g}): the "
        "efficiencies are fitted on int8 rows, and 16-bit tensor math reaches a larger share of "
        "its own peak (half_precision_scale)",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelPoint:
    """One kernel on a roofline chart."""

    name: str
    ops: tuple[str, ...]
    intensity_flops_per_byte: float
    achieved_flops_per_s: float  # FLOPs / (roofline time + launch overhead)
    bound: Bound  # compute or memory (the launch overhead is in the achieved rate)


def kernel_points(phase: Phase, prediction: Prediction) -> tuple[KernelPoint, ...]:
    """Every kernel of ``phase`` with its intensity and achieved rate on the predicted device
    (the per-kernel loop that :func:`predict` sums in closed form)."""
    flops_per_s = prediction.effective_flops_per_s  # positive: checked by Prediction
    bytes_per_s = prediction.effective_bandwidth_bytes_per_s
    launch = prediction.calibration.kernel_launch_overhead_s
    share = prediction.calibration.activation_cache_share
    points = []
    for kernel in phase.kernels:
        compute = kernel.quantized_flops(prediction.tiling) / flops_per_s
        memory = kernel.dram_bytes(share) / bytes_per_s
        seconds = max(compute, memory) + kernel.launches * launch
        points.append(
            KernelPoint(
                name=kernel.name,
                ops=kernel.ops,
                intensity_flops_per_byte=kernel.intensity_flops_per_byte(share),
                achieved_flops_per_s=kernel.flops / seconds if seconds > 0 else 0.0,
                bound=Bound.COMPUTE if compute > memory else Bound.MEMORY,
            )
        )
    return tuple(points)
