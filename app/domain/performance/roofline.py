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

References
----------
Williams, Waterman and Patterson, "Roofline: an insightful visual performance model for
multicore architectures", Communications of the ACM 52(4), 2009.
"""

from __future__ import annotations

import math
import re
import sys
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from fractions import Fraction
from functools import lru_cache, partial
from itertools import accumulate
from operator import attrgetter
from typing import TYPE_CHECKING, overload

from app.domain.errors import DomainError
from app.domain.graph.analysis import GraphAnalysis, LayerAnalysis
from app.domain.graph.ops import Storage, TensorKind
from app.domain.graph.traits import FUSABLE_EPILOGUE_OPS, LOOKUP_OPS, MULTI_KERNEL_OPS
from app.domain.hardware import (
    MAX_BANDWIDTH_BYTES_PER_S,
    MAX_OVERHEAD_S,
    MAX_PEAK_FLOPS_PER_S,
    MAX_PRICE_USD_PER_HOUR,
    MAX_TDP_WATTS,
    MIN_BANDWIDTH_BYTES_PER_S,
    MIN_EFFICIENCY,
    MIN_FRACTION,
    MIN_PEAK_FLOPS_PER_S,
    DeviceKind,
    HardwareSpec,
    in_range,
    require_range,
)
from app.domain.precision import (
    CONVENTIONS,
    DType,
    Precision,
    PrecisionConvention,
    Quantization,
    bytes_per_element,
)
from app.domain.workload import FUSED_ATTENTION, Attention

if TYPE_CHECKING:
    from app.domain.performance.pipeline import PipelineTiming

INDEX_BYTES = 8  # token ids and labels are int64
FP32_BYTES = 4  # upcast softmax scores and probabilities (Storage.FP32)


class RooflineInputError(DomainError):
    """A request or device that the roofline model cannot evaluate."""


# --------------------------------------------------------------------------------------------
# Precision
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionScheme:
    """The roofline's view of a precision convention (one row of
    :data:`app.domain.precision.CONVENTIONS`): bytes per weight, per activation and per KV-cache
    element, and which peaks the math can run at (the first the device has wins).

    Every weight a kernel reads is priced at ``weight_bytes`` (the quantized matmul/conv
    storage for quantized conventions; scales and 16-bit embeddings or heads are not added).
    The training-only conventions run inference as their forward does: ``amp_*`` reads the
    fp32 weights (autocast's cast copy is not priced) with 16-bit activations and math;
    ``mixed_*`` is its 16-bit weights and activations (the fp32 master copy is not read).
    """

    precision: Precision
    compute_dtypes: tuple[DType, ...]
    weight_bytes: Fraction
    activation_bytes: int  # activations, model inputs/outputs (floats)
    kv_cache_bytes: int
    quantization: Quantization
    weight_dtype: DType
    activation_dtype: DType
    kv_cache_dtype: DType
    convention: str
    inference_note: str = ""  # training conventions: what their forward reads at inference

    @property
    def assumption(self) -> str:
        """The convention in the roofline's numbers (what a prediction at it assumes)."""
        weight_bits = int(self.weight_bytes * 8)
        activation_bits = self.activation_bytes * 8
        kind = {
            Quantization.NONE: "not quantized",
            Quantization.WEIGHT_ONLY: f"weight-only W{weight_bits}A{activation_bits} (weights "
            f"dequantized to {self.activation_dtype.value} before the math)",
            Quantization.W8A8: f"W{weight_bits}A{activation_bits} (weights and activations "
            "8-bit, 8-bit math)",
            Quantization.W4A4: "W4A4 (weights and GEMM inputs 4-bit, 4-bit math; "
            f"activations between kernels {self.activation_dtype.value})",
        }[self.quantization]
        peaks = " else ".join(d.value for d in self.compute_dtypes)
        return (
            f"{self.precision.value}: {kind}; every weight read at "
            f"{float(self.weight_bytes):g} B ({self.weight_dtype.value}), activations at "
            f"{self.activation_bytes} B ({self.activation_dtype.value}), KV cache at "
            f"{self.kv_cache_bytes} B ({self.kv_cache_dtype.value}); math at the device's "
            f"{peaks} peak{self.inference_note}"
        )


def _inference_note(row: PrecisionConvention) -> str:
    """How a training-only convention runs inference (empty for the others)."""
    if row.weight_cache_dtype is not None:
        return (
            f" (autocast at inference: the stored {row.weight_dtype.value} weights are read, "
            f"the {row.weight_cache_dtype.value} copy autocast casts them to is not priced)"
        )
    if row.master_weight_dtype is not None:
        return (
            f" (at inference only the {row.weight_dtype.value} weights are read; the "
            f"{row.master_weight_dtype.value} master copy is training state)"
        )
    return ""


PRECISION_SCHEMES: Mapping[Precision, PrecisionScheme] = {
    precision: PrecisionScheme(
        precision=precision,
        compute_dtypes=row.compute_dtypes,
        weight_bytes=bytes_per_element(row.weight_dtype),
        activation_bytes=int(bytes_per_element(row.activation_dtype)),
        kv_cache_bytes=int(bytes_per_element(row.kv_cache_dtype)),
        quantization=row.quantization,
        weight_dtype=row.weight_dtype,
        activation_dtype=row.activation_dtype,
        kv_cache_dtype=row.kv_cache_dtype,
        convention=row.description,
        inference_note=_inference_note(row),
    )
    for precision, row in CONVENTIONS.items()
}


# --------------------------------------------------------------------------------------------
# Devices and calibration
# --------------------------------------------------------------------------------------------


class CalibrationClass(StrEnum):
    """Which calibration a prediction runs under: the device's kind, with CPUs split by the
    unit that runs the math.

    Intel AMX tiles (the catalog's ``cpu.simd`` names AMX; int8, bf16 and fp16 math) peak at 8x
    AVX-512 VNNI's int8 rate per core (2,048 against 256 ops per cycle) but reach a much
    smaller share of it (tile loads and memory feed them), so one efficiency fitted on both
    carries to neither (benchmarks/calibration/README.md). Math on the vector units (fp32
    everywhere, any precision on a CPU without AMX) is ``cpu``."""

    GPU = "gpu"  # GPUs of an architecture without a class of its own (Turing, Volta, Blackwell)
    GPU_AMPERE = "gpu_ampere"  # data-center and workstation Ampere GPUs (A10, A30, A100)
    GPU_HOPPER = "gpu_hopper"  # H100, H200, GH200
    CPU = "cpu"  # vector units: AVX-512 (VNNI), AVX2, AMD EPYC, Arm (Graviton); fp32 on any CPU
    CPU_AMX = "cpu_amx"  # AMX tile math (int8 / bf16 / fp16) on Intel Xeon, Sapphire Rapids on
    EDGE = "edge"
    TPU = "tpu"

    @property
    def kind(self) -> DeviceKind:
        """The device kind the class belongs to."""
        if self is CalibrationClass.CPU_AMX:
            return DeviceKind.CPU
        if self in GPU_ARCHITECTURE_CLASSES.values():
            return DeviceKind.GPU
        return DeviceKind(self.value)


# GPU architectures with a calibration class of their own: each generation reaches its own
# share of its spec peak (MLPerf ResNet-50 INT8: Ampere 0.48-0.65, Hopper 0.32-0.48, Ada 0.73
# and beyond), so one efficiency over all of them over-predicts Hopper and under-predicts the
# rest (benchmarks/calibration/README.md). Keyed by a word of the catalog's ``architecture``
# (the first that names one); every other GPU (Turing, Volta, Ada, Blackwell, ...) is ``gpu``:
# the pooled fit.
GPU_ARCHITECTURE_CLASSES: Mapping[str, CalibrationClass] = {
    "ampere": CalibrationClass.GPU_AMPERE,
    "hopper": CalibrationClass.GPU_HOPPER,
}


@lru_cache(maxsize=256)  # asked once per candidate and prediction, for a few names
def gpu_architecture_class(architecture: str | None) -> CalibrationClass:
    """The calibration class of a GPU whose catalog ``architecture`` is ``architecture``."""
    words = re.findall(r"[a-z0-9]+", (architecture or "").lower())
    return next(
        (GPU_ARCHITECTURE_CLASSES[word] for word in words if word in GPU_ARCHITECTURE_CLASSES),
        CalibrationClass.GPU,
    )


# Every GPU class: the pooled one and each architecture's (a request's ``gpu`` override reaches
# them all; the calibration fits them together).
GPU_CLASSES = (CalibrationClass.GPU, *GPU_ARCHITECTURE_CLASSES.values())


AMX_TILES = "AMX tiles"  # cpu_compute_unit's name for Intel AMX


def has_amx(simd: str | None) -> bool:
    """Whether a CPU's vector / matrix extensions (the catalog's ``cpu.simd``) include AMX."""
    return simd is not None and "AMX" in simd.upper()


def calibration_class(device: HardwareSpec, scheme: PrecisionScheme) -> CalibrationClass:
    """The calibration ``scheme`` runs under on ``device``: its kind, ``cpu_amx`` on a CPU
    whose AMX tiles run the math (:func:`cpu_compute_unit`), and a GPU's architecture class
    (:data:`GPU_ARCHITECTURE_CLASSES`; ``gpu`` for the others)."""
    if device.kind is DeviceKind.GPU:
        return gpu_architecture_class(device.architecture)
    if device.kind is DeviceKind.CPU and device.simd and has_amx(device.simd):
        dtype = compute_dtype_for(device, scheme)
        if dtype is not None and cpu_compute_unit(device.simd, dtype) == AMX_TILES:
            return CalibrationClass.CPU_AMX
    return CalibrationClass(device.kind.value)


# Math whose share of its own peak differs from the int8 fits' (Calibration.half_precision_scale).
HALF_PRECISION_DTYPES = frozenset({DType.FP16, DType.BF16})
MAX_PRECISION_SCALE = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Efficiencies and overheads of one calibration class, and where they come from."""

    compute_efficiency: float  # achieved / dense peak FLOP/s
    memory_efficiency: float  # achieved / peak memory bandwidth
    activation_cache_share: float  # share of activation traffic served by on-chip caches
    host_link_efficiency: float  # measured host-to-device copy / theoretical link bandwidth
    kernel_launch_overhead_s: float  # per kernel launch, serial with the kernels
    request_overhead_s: float  # per request: host-side framework call and synchronisation
    basis: str
    # x compute_efficiency where the math runs in fp16 or bf16 (the efficiencies are fitted on
    # int8 rows; 16-bit tensor math reaches a larger share of its own peak on GPUs)
    half_precision_scale: float = 1.0
    # a framework's host time to issue one kernel (Python dispatch, argument checks, the
    # launch call), overlapped with the device's work: launches are asynchronous, so the host
    # runs ahead while kernels are long and the device waits for it while they are short.
    # 0: an engine that enqueues its kernels at once (TensorRT, the MLPerf calibration)
    host_dispatch_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency", "host_link_efficiency"):
            require_range(name, getattr(self, name), MIN_EFFICIENCY, 1.0, error=RooflineInputError)
        require_range(
            "half_precision_scale",
            self.half_precision_scale,
            MIN_EFFICIENCY,
            MAX_PRECISION_SCALE,
            error=RooflineInputError,
        )
        share = self.activation_cache_share
        if not (in_range(share, 0.0, 1.0) and share < 1.0):
            raise RooflineInputError(f"activation_cache_share must be in [0, 1), got {share!r}")
        require_range(
            "kernel_launch_overhead_s",
            self.kernel_launch_overhead_s,
            0.0,
            MAX_OVERHEAD_S,
            error=RooflineInputError,
        )
        require_range(
            "request_overhead_s",
            self.request_overhead_s,
            0.0,
            MAX_OVERHEAD_S,
            error=RooflineInputError,
        )
        require_range(
            "host_dispatch_s", self.host_dispatch_s, 0.0, MAX_OVERHEAD_S, error=RooflineInputError
        )

    def precision_scale(self, dtype: DType) -> float:
        """The multiplier on ``compute_efficiency`` for math in ``dtype`` [-]."""
        return self.half_precision_scale if dtype in HALF_PRECISION_DTYPES else 1.0

    def compute_efficiency_for(self, dtype: DType) -> float:
        """Achieved / dense peak FLOP/s for math in ``dtype``: ``compute_efficiency`` x
        :meth:`precision_scale`, at most 1 [-]."""
        return min(1.0, self.compute_efficiency * self.precision_scale(dtype))


# Derived by benchmarks/calibration/calibrate.py from benchmarks/calibration/
# calibration_benchmarks.yaml (a copy, with sources, of ../shared/reference/); its results.md
# has every row; tests/contract/test_calibration.py fails when these drift from the derivation.
_OVERHEADS = (
    "kernel launch 4.0 us = median of the measured per-kernel launch figures (raw "
    "cuLaunchKernel 3.0 and ~1.3 us, runtime submission 4-6 us, PyTorch eager ~20 us)"
)
_REQUEST = (
    "request overhead 149 us: fit (least squares on log predicted/measured, 1 us grid) to "
    "MLPerf ResNet-50 SingleStream p90 INT8 batch-1 latency, 10 rows (T4, A10, A30, A100 PCIe "
    "and SXM, L4, Jetson AGX Orin and Orin NX) of calibration_more.yaml: everything a query "
    "costs beyond the kernels (harness, input copy, synchronisation, under-filled batch-1 "
    "kernels); the end-to-end torch.compile call figures (42.4 us median) left batch-1 "
    "latency at 0.72x of measured"
)
_LINK = (
    "host-link efficiency 0.73 = median over 6 rows of measured pinned host-to-device copy "
    "bandwidth / theoretical per-direction link bandwidth (0.56-0.83)"
)
_FIT = (
    "fit (least squares on log predicted/measured, grids of 0.01 and 0.05) to MLPerf ResNet-50 "
    "v1.5 Offline INT8 throughput at batch 256, every convolution's FLOPs at its wave "
    "efficiency on the device's SMs or cores"
)
_MEMORY = (
    "memory efficiency 0.83 = geometric mean of measured device-memory bandwidth / catalog "
    "peak over 6 rows (BabelStream Triad, bandwidthTest device to device; T4, V100 SXM2 and "
    "PCIe, A100 40 and 80 GB SXM; 0.74-0.94) of memory_bandwidth.yaml"
)
_CPU_REST = (
    "memory efficiency 0.7 and the 2 us per-primitive dispatch: assumed (no dispatch rows; no "
    "published CPU STREAM run read so far met memory_bandwidth.yaml's rule, and a fit needs "
    "rows of 3 CPUs); request overhead 42.4 us = median of the measured end-to-end torch.compile "
    "call figures (44.3, 42.4, ~33 us; no CPU SingleStream rows to fit it on); no host-link copy"
)
# fp16 / bf16 math on GPUs reaches this many times the int8 fits' share of its peak: fitted by
# benchmarks/calibration/llm_serving.py (least squares on log predicted/measured, grid of 0.01)
# on the fp16 TensorRT-LLM throughput rows of framework_measurements.yaml (Llama and Mistral
# 7-8B and 70B on the A100 and H100 SXM); tests/contract/test_llm_serving.py fails when it
# drifts from the fit. The int8 fits alone put those rows at a median 0.83x of measured, their
# prefill-heavy rows (2,048 in, 128 out) at 0.71-0.79x.
GPU_HALF_PRECISION_SCALE = 1.28
_HALF = (
    f"fp16 / bf16 math at {GPU_HALF_PRECISION_SCALE:g} x the compute efficiency: fit to the 15 "
    "fp16 TensorRT-LLM throughput rows (A100 and H100 SXM; llm_serving.md)"
)
_GPU_REST = f"{_HALF}; {_MEMORY}; {_LINK}; {_OVERHEADS}; {_REQUEST}"


def _gpu_calibration(
    compute_efficiency: float, basis: str, *, half_precision_scale: float = GPU_HALF_PRECISION_SCALE
) -> Calibration:
    """A GPU class's calibration: its own compute efficiency, the rest shared by every GPU
    class (the cache share is the pooled fit's; memory, link and overheads are fitted per
    kind; the 16-bit scale on the GPUs' TensorRT-LLM rows)."""
    return Calibration(
        compute_efficiency=compute_efficiency,
        memory_efficiency=0.83,
        activation_cache_share=0.5,
        host_link_efficiency=0.73,
        kernel_launch_overhead_s=4.0e-6,
        request_overhead_s=149e-6,
        basis=basis,
        half_precision_scale=half_precision_scale,
    )


DEFAULT_CALIBRATIONS: Mapping[CalibrationClass, Calibration] = {
    CalibrationClass.GPU: _gpu_calibration(
        0.51,
        "GPUs without an architecture class of their own (Turing, Volta, Ada, Blackwell and "
        f"older): compute efficiency and activation cache share: {_FIT}, pooled over all 14 "
        f"rows per accelerator (T4, A10, A30, A100, H100, H200, L4, L40S); {_GPU_REST}",
    ),
    CalibrationClass.GPU_AMPERE: _gpu_calibration(
        0.54,
        f"Ampere GPUs: compute efficiency: {_FIT}, 6 rows per accelerator of 4 Ampere GPUs "
        "(A10, A30, A100 PCIe and SXM), at the pooled GPU fit's activation cache share; "
        f"{_GPU_REST}",
    ),
    CalibrationClass.GPU_HOPPER: _gpu_calibration(
        0.42,
        f"Hopper GPUs: compute efficiency: {_FIT}, 5 rows per accelerator of 3 Hopper GPUs "
        "(H100 SXM and PCIe, H200), at the pooled GPU fit's activation cache share (Hopper "
        f"reaches a smaller share of its spec peak than Ampere); {_GPU_REST}",
    ),
    CalibrationClass.CPU: Calibration(
        compute_efficiency=0.63,
        memory_efficiency=0.7,
        activation_cache_share=0.4,
        host_link_efficiency=0.73,
        kernel_launch_overhead_s=2.0e-6,
        request_overhead_s=42.4e-6,
        basis="math on a CPU's vector units (AVX-512 VNNI, AVX2, AMD EPYC, Arm; fp32 on AMX "
        f"Xeons too): compute efficiency: {_FIT}, "
        "25 rows per socket of 8 Xeons without AMX (Cascade Lake, Cooper Lake, Ice Lake; "
        "AVX-512 VNNI), at the activation cache share of the pooled fit over all 29 CPU rows "
        "(0.63 / 0.4; compute-bound devices do not identify a share); "
        f"{_CPU_REST}",
    ),
    CalibrationClass.CPU_AMX: Calibration(
        compute_efficiency=0.4,
        memory_efficiency=0.7,
        activation_cache_share=0.85,
        host_link_efficiency=0.73,
        kernel_launch_overhead_s=2.0e-6,
        request_overhead_s=42.4e-6,
        basis="int8 / bf16 / fp16 math on Intel AMX tiles (Xeon 8480+, 8592+, 6980P): compute "
        f"efficiency and activation cache share: {_FIT}, 4 rows per socket of AMX Xeons only "
        "(the tiles' int8 peak is 8x VNNI's per core; they reach a smaller share of it); "
        "memory-bound on ResNet-50, so the rows pin a trade-off between the two more than "
        f"either; {_CPU_REST}",
    ),
    CalibrationClass.EDGE: Calibration(
        compute_efficiency=0.31,
        memory_efficiency=0.8,
        activation_cache_share=0.5,
        host_link_efficiency=1.0,
        kernel_launch_overhead_s=4.0e-6,
        request_overhead_s=149e-6,
        basis=f"compute efficiency: {_FIT}, 2 Jetson Orin rows (AGX Orin, Orin NX), each the GPU's "
        "share of a GPU + 2 DLA run (NVIDIA's expected GPU-only / combined rate in its MLPerf "
        "v3.0 config: 4,500 of 6,100 and 1,700 of 2,400), with the GPUs' activation cache "
        "share (Orin is an Ampere GPU); unified memory, so no host-link copy; memory efficiency "
        "0.8 assumed (no SoC bandwidth rows); launch and request overheads as for GPUs (the "
        "request overhead's fit has 2 Orin rows)",
    ),
    CalibrationClass.TPU: _gpu_calibration(
        0.51,
        "not calibrated (the file has no TPU rows): the pooled GPU values, bf16 at the "
        "compute efficiency (no TPU rows for a 16-bit scale either)",
        half_precision_scale=1.0,
    ),
}


# --------------------------------------------------------------------------------------------
# Tiles and waves: GEMM efficiency as a function of problem size
# --------------------------------------------------------------------------------------------

# Output tile of one thread block (GPU) or one core's block (CPU) [elements x elements].
# GPU: 128 x 128 at every precision, CUTLASS's default threadblock tile for SIMT GEMMs
# (include/cutlass/gemm/device/default_gemm_configuration.h, OpClassSimt: GemmShape<128, 128, 8>);
# its tensor-op defaults are 128 x 256 (Ampere/Ada f16 and int8) and cuBLAS's heuristics pick
# among 64-256-wide tiles, so 128 x 128 is an assumption in the middle of that range, not a
# per-kernel choice. CPU: 64 x 64 (assumed; oneDNN's brgemm blocks are 16-64 rows x 64 columns).
GPU_TILE = 128
CPU_TILE = 64
SPLIT_K_STEP = 128  # reduction elements per split (split-K GEMMs, split-KV flash decoding)


@dataclass(frozen=True, slots=True)
class Gemm:
    """One GEMM of a kernel: ``count`` independent products whose outputs are ``m x n`` with
    a reduction of ``k``, ``flops`` in all (a convolution as its implicit GEMM, the attention
    core as its output ``tokens x q_dim``)."""

    m: int
    n: int
    k: int
    count: int
    flops: int
    # Hashed once: kernels are grouped and wave costs remembered by their GEMMs, tens of
    # thousands of times per request over every device.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.m, self.n, self.k, self.count, self.flops)))

    def __hash__(self) -> int:
        return self._hash

    def tiles(self, tile: int) -> int:
        """Output tiles: ``count * ceil(m / tile) * ceil(n / tile)`` [-]."""
        return self.count * -(-self.m // tile) * -(-self.n // tile)

    def split(self, degree: int) -> Gemm:
        """One tensor-parallel GPU's share (columns split)."""
        return _split_gemm(self, degree)


@lru_cache(maxsize=1 << 14)  # a model's layers repeat a few shapes
def _split_gemm(gemm: Gemm, degree: int) -> Gemm:
    return Gemm(
        m=gemm.m,
        n=-(-gemm.n // degree),
        k=gemm.k,
        count=gemm.count,
        flops=-(-gemm.flops // degree),
    )


@dataclass(frozen=True, slots=True)
class Tiling:
    """How a device spreads a GEMM's tiles: over ``units`` SMs (GPU) or cores (CPU)."""

    units: int
    tile: int
    split_k: bool  # GPUs split the reduction when the tiles do not fill the units
    # Where ``units`` comes from when it is not the device's own figure (a MIG slice's SMs)
    units_source: str | None = field(default=None, compare=False)

    @property
    def assumption(self) -> str:
        """The tiling in words."""
        where = "SMs" if self.split_k else "cores"
        text = (
            f"GEMMs and convolutions in {self.tile} x {self.tile} output tiles spread over "
            f"{self.units} {where} in waves; compute time = FLOPs / (P_eff x wave efficiency)"
        )
        if self.split_k:
            text += (
                f"; fewer tiles than SMs split the reduction (split-K, flash decoding) in "
                f"steps of {SPLIT_K_STEP} to fill them"
            )
        if self.units_source is not None:
            text += f"; {self.units_source}"
        return text


def wave_efficiency(tiles: int, units: int) -> float:
    """Share of the units a kernel's tiles keep busy, whole waves counted.

    Parameters
    ----------
    tiles : output tiles (thread blocks) of the kernel [-]
    units : streaming multiprocessors (GPU) or cores (CPU) that run one tile at a time [-]

    Returns
    -------
    efficiency : in (0, 1] [-]

    Notes
    -----
    ``eta_w = T / (ceil(T / U) * U)``: the last wave of ``T mod U`` tiles leaves the other
    units idle; fewer tiles than units leave ``U - T`` idle for the whole kernel.

    References
    ----------
    NVIDIA, "Matrix Multiplication Background User's Guide" (Deep Learning Performance
    Documentation), sections "Tile Quantization" and "Wave Quantization".
    """
    if tiles < 1 or units < 1:
        raise RooflineInputError(f"tiles and units must be >= 1, got {tiles} and {units}")
    return tiles / (-(-tiles // units) * units)


def split_k_factor(tiles: int, units: int, k_steps: int) -> int:
    """Splits of the reduction a GPU GEMM library picks when ``tiles`` do not fill ``units``:
    ``min(floor(U / T), k_steps)``, at least 1 (no split once the tiles fill the units)."""
    if tiles >= units:
        return 1
    return max(1, min(units // tiles, k_steps))


def gemm_efficiency(gemm: Gemm, tiling: Tiling) -> float:
    """Wave efficiency of one GEMM on a device, after split-K [-]."""
    tiles = gemm.tiles(tiling.tile)
    if tiling.split_k:
        tiles *= split_k_factor(tiles, tiling.units, -(-gemm.k // SPLIT_K_STEP))
    return wave_efficiency(tiles, tiling.units)


@lru_cache(maxsize=1 << 16)  # bounded: a long-running server sees many shapes
def _paid_gemm_flops(gemms: tuple[Gemm, ...], tiling: Tiling) -> float:
    """FLOPs of ``gemms`` as a device with ``tiling`` pays for them [FLOP]. Remembered: a
    model's blocks repeat the same few GEMM shapes, and every device of one SM count shares
    the answer (a request over every device asks for each pair hundreds of times)."""
    return sum(g.flops / gemm_efficiency(g, tiling) for g in gemms)


@lru_cache(maxsize=1 << 16)
def _gemm_flops(gemms: tuple[Gemm, ...]) -> int:
    return sum(g.flops for g in gemms)


# --------------------------------------------------------------------------------------------
# Kernels: per-layer FLOPs and bytes moved
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernel:
    """One kernel: a layer with the element-wise layers fused into it.

    ``input_bytes`` are the head layer's inputs plus the other inputs of fused layers (the
    residual of an add); ``output_bytes`` the last fused layer's output; ``kv_cache_bytes`` the
    KV cache written (prefill) or read and written (decode) by an attention layer;
    ``intermediate_bytes`` the S x S scores and probabilities an unfused attention (eager,
    sdpa_math) writes to memory and reads back (0 for flash / mem_efficient).
    """

    name: str
    ops: tuple[str, ...]
    flops: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    kv_cache_bytes: int
    intermediate_bytes: int = 0
    launches: int
    gemms: tuple[Gemm, ...] = ()  # its GEMMs' shapes (empty: no tiled GEMM, e.g. a pooling)

    def quantized_flops(self, tiling: Tiling | None) -> float:
        """FLOPs as the device pays for them: each GEMM's FLOPs / its wave efficiency, the
        rest (fused epilogues, softmax) as they are [FLOP]."""
        if tiling is None or not self.gemms:
            return float(self.flops)
        return _paid_gemm_flops(self.gemms, tiling) + (self.flops - _gemm_flops(self.gemms))

    @property
    def bytes_moved(self) -> int:
        """Weights + inputs + outputs + KV cache + spilled intermediates [B]."""
        return (
            self.weight_bytes
            + self.input_bytes
            + self.output_bytes
            + self.kv_cache_bytes
            + self.intermediate_bytes
        )

    def dram_bytes(self, cache_share: float) -> float:
        """Bytes that reach DRAM when caches serve ``cache_share`` of the activations.

        Parameters
        ----------
        cache_share : share of activation traffic (inputs, outputs, spilled intermediates)
            served on chip [-]

        Returns
        -------
        dram : W + KV + (1 - cache_share) * (I + O + S) [B]
        """
        activations = self.input_bytes + self.output_bytes + self.intermediate_bytes
        return self.weight_bytes + self.kv_cache_bytes + (1 - cache_share) * activations

    def intensity_flops_per_byte(self, cache_share: float) -> float:
        """Operational intensity F / D: FLOPs per DRAM byte [FLOP/B]."""
        dram = self.dram_bytes(cache_share)
        return self.flops / dram if dram else math.inf


def _weight_elements(layer: LayerAnalysis) -> int:
    """Weight elements a layer reads per forward.

    A lookup (embedding) reads only the rows it gathers: one table element per output element.
    A linear layer tied to an embedding (GPT-2's LM head) owns no parameter but reads the whole
    shared matrix: its FLOPs are 2 * rows * in * out, so the matrix has FLOPs / (2 * rows).
    A mixture-of-experts layer reads the experts its tokens are routed to
    (:func:`moe_weight_elements`).
    """
    if layer.op in LOOKUP_OPS:
        return min(layer.params, layer.output_numel)
    if layer.op == "moe":
        return moe_weight_elements(layer)
    if layer.op == "linear" and not any(len(s) >= 2 for s in layer.result.param_shapes):
        rows = layer.output_numel // layer.output_shape[-1]
        return layer.params + layer.flops // (2 * rows)
    return layer.params


def expected_experts_read(experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts a step reads when ``tokens`` each pick ``top_k`` of ``experts``.

    Uniform routing: an expert is missed by one token with probability 1 - k/E, by all of them
    with (1 - k/E)^T, so E * (1 - (1 - k/E)^T) experts are read: k at one token (decode at
    batch 1), all E once the step routes enough tokens (prefill, large batches).
    """
    return experts * (1 - (1 - top_k / experts) ** tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeRouting:
    """How many experts one step of a mixture-of-experts layer reads (uniform routing).

    The ``moe`` op (Mixtral) has no shared experts; a shared expert, which every token visits,
    would be read whole at every step and belongs with the router in the always-read part.
    """

    experts: int  # E
    top_k: int  # k, experts per token
    tokens: int  # T, tokens routed in the step
    router_elements: int  # E x hidden
    expert_elements: int  # one expert's projections

    @classmethod
    def of(cls, layer: LayerAnalysis) -> MoeRouting:
        """The routing of a ``moe`` layer from its analysis (router first in its params)."""
        router = layer.result.param_shapes[0]
        experts = router[0]
        tokens = layer.output_numel // layer.output_shape[-1]
        routed = next(s.numel for s in layer.result.saved if s.label == "routing_weights")
        return cls(
            experts=experts,
            top_k=routed // tokens,
            tokens=tokens,
            router_elements=math.prod(router),
            expert_elements=(layer.params - math.prod(router)) // experts,
        )

    @property
    def experts_read(self) -> float:
        """E * (1 - (1 - k/E)^T) [-]."""
        return expected_experts_read(self.experts, self.top_k, self.tokens)

    @property
    def weight_elements(self) -> int:
        """Router + ceil(experts read x one expert's elements) [-]."""
        return self.router_elements + math.ceil(self.experts_read * self.expert_elements)

    @property
    def note(self) -> str:
        """The figure in words, with its formula and inputs (the same for every layer of one
        configuration, so that a model's notes collapse to one line per configuration)."""
        return (
            f"a mixture-of-experts layer reads the router and {self.experts_read:.3g} of "
            f"{self.experts} experts = "
            f"{self.experts} x (1 - (1 - {self.top_k}/{self.experts})^{self.tokens}) for "
            f"{self.tokens} token(s) routed top-{self.top_k} (uniform routing); FLOPs count "
            f"{self.top_k} experts per token"
        )


def moe_weight_elements(layer: LayerAnalysis) -> int:
    """Weight elements a mixture-of-experts layer reads: the router, and the experts its
    tokens are routed to (:func:`expected_experts_read`), not all of them."""
    return MoeRouting.of(layer).weight_elements


def _launches(layer: LayerAnalysis) -> int:
    if layer.op in MULTI_KERNEL_OPS:
        return 1 + sum(1 for shape in layer.result.param_shapes if len(shape) >= 2)
    return 1


def _is_view(layer: LayerAnalysis) -> bool:
    """Views and inference-time identities (dropout) launch nothing and move nothing."""
    return layer.result.alias_of is not None and layer.flops == 0


SPILLED_ATTENTION_TENSORS = ("scores", "probs")  # the S x S transients of unfused attention


def _spilled_attention(layer: LayerAnalysis, context_tokens: int) -> tuple[int, int, str]:
    """(fp32 elements, activation-dtype elements, note) an attention layer spills to memory.

    eager / sdpa_math materialise the S x S scores and probabilities: the QK^T matmul writes
    the scores, the softmax reads them and writes the probabilities, the PV matmul reads those,
    so each is moved twice. With ``context_tokens`` cached (decode) every query attends to
    ``seq + context`` keys. flash / mem_efficient keep them on chip: nothing is spilled.
    """
    impl = layer.result.attention
    if impl is None or impl in FUSED_ATTENTION:
        return 0, 0, ""
    seq = layer.output_shape[1]
    fp32 = act = 0
    for transient in layer.result.transients:
        if transient.label not in SPILLED_ATTENTION_TENSORS:
            continue
        elements = 2 * transient.numel * (seq + context_tokens) // seq
        if transient.storage is Storage.FP32:
            fp32 += elements
        else:
            act += elements
    note = (
        f"{impl.value} attention writes and reads back its S x S scores and probabilities: "
        f"{fp32 + act:,} elements moved per layer ({seq} queries x {seq + context_tokens} keys "
        "per head, twice each; flash / mem_efficient keep them on chip)"
    )
    return fp32, act, note


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelCount:
    """A kernel's work in elements, independent of the precision (see :func:`count_kernels`)."""

    name: str
    ops: tuple[str, ...]
    flops: int
    weight_elements: int
    float_inputs: int  # elements read
    index_inputs: int  # int64 elements read (token ids)
    float_outputs: int
    index_outputs: int
    kv_elements: int  # KV cache elements written and read
    spilled_fp32: int = 0  # unfused attention: fp32 S x S elements written and read back
    spilled_float: int = 0  # the same at the activation dtype
    launches: int
    notes: tuple[str, ...] = ()  # what the kernel's figures assume beyond the formulas
    gemms: tuple[Gemm, ...] = ()  # GEMM shapes, for tile and wave quantization

    def at(self, scheme: PrecisionScheme) -> Kernel:
        """The kernel's bytes at a precision (weights rounded up to whole bytes)."""
        act = scheme.activation_bytes
        weight = scheme.weight_bytes
        return Kernel(
            name=self.name,
            ops=self.ops,
            flops=self.flops,
            weight_bytes=-(-self.weight_elements * weight.numerator // weight.denominator),
            input_bytes=self.float_inputs * act + self.index_inputs * INDEX_BYTES,
            output_bytes=self.float_outputs * act + self.index_outputs * INDEX_BYTES,
            kv_cache_bytes=self.kv_elements * scheme.kv_cache_bytes,
            intermediate_bytes=self.spilled_fp32 * FP32_BYTES + self.spilled_float * act,
            launches=self.launches,
            gemms=self.gemms,
        )


CONV_OPS = frozenset(
    {"conv2d", "depthwise_conv2d", "pointwise_conv2d", "conv3d", "conv_transpose3d"}
)
PROJECTION_OPS = frozenset({"linear", "attention", "mlp"})


def layer_gemms(layer: LayerAnalysis, context_tokens: int = 0) -> tuple[Gemm, ...]:
    """The GEMMs a layer runs, for tile and wave quantization (empty for other layers).

    A convolution is its implicit GEMM: ``M = N*H_out*W_out`` output pixels, ``N`` output
    channels per group, ``K = C_in/groups * kh * kw`` (``depthwise_conv2d`` is ``C_out`` GEMMs
    of one column; ``conv2d`` with groups counts as one GEMM of all output channels, which
    understates its tiles); ``conv3d`` the same with ``M = N*D_out*H_out*W_out`` and
    ``K = C_in/groups * kd*kh*kw``. ``conv_transpose3d`` is the implicit GEMM of its
    data-gradient form: ``M`` output voxels by ``N = C_out`` over ``K = FLOPs / (2 M N)``
    (``C_in * kd*kh*kw / (sd*sh*sw)``: ``C_in`` for U-Net's kernel-2 stride-2 upsampling).
    A linear layer, and every weight matrix of an
    attention or MLP layer, is ``M = tokens`` by ``N = out`` by ``K = in``. Attention adds its
    core (QK^T, softmax, PV) as one GEMM of its output ``tokens x q_dim`` over the keys
    (FlashAttention tiles ``batch x heads x ceil(S / 128)`` query blocks: the same count at a
    head dim of 128). A ``matmul`` is ``M x N`` over ``K = FLOPs / (2 M N)``. Mixture-of-experts
    and recurrent layers are not tiled here (their FLOPs are priced without quantization).
    """
    op = layer.op
    flops = layer.flops
    if op in CONV_OPS:
        weight = layer.result.param_shapes[0]
        out = weight[0]
        m = layer.output_numel // out
        k = math.prod(weight[1:])
        if op == "depthwise_conv2d":
            return (Gemm(m=m, n=1, k=k, count=out, flops=flops),)
        if op == "conv_transpose3d":  # weight [C_in, C_out/groups, kd, kh, kw]
            n = layer.output_shape[1]
            m = layer.output_numel // n
            return (Gemm(m=m, n=n, k=max(1, flops // (2 * m * n)), count=1, flops=flops),)
        return (Gemm(m=m, n=out, k=k, count=1, flops=flops),)
    if op == "matmul":
        n = layer.output_shape[-1]
        m = layer.output_numel // n
        return (Gemm(m=m, n=n, k=max(1, flops // (2 * m * n)), count=1, flops=flops),)
    if op not in PROJECTION_OPS:
        return ()
    tokens = layer.output_numel // layer.output_shape[-1]
    matrices = [s for s in layer.result.param_shapes if len(s) == 2]
    if op == "linear" and not matrices:  # tied head: reads the shared embedding matrix
        n = layer.output_shape[-1]
        return (Gemm(m=tokens, n=n, k=flops // (2 * tokens * n), count=1, flops=flops),)
    gemms = [
        Gemm(m=tokens, n=out, k=inp, count=1, flops=2 * tokens * out * inp) for out, inp in matrices
    ]
    if op == "attention":
        core = flops + 4 * tokens * context_tokens * matrices[0][0] - sum(g.flops for g in gemms)
        keys = layer.output_shape[1] + context_tokens
        gemms.append(Gemm(m=tokens, n=matrices[0][0], k=keys, count=1, flops=max(0, core)))
    if op == "linear":
        gemms = [replace(gemms[0], flops=flops)]  # its bias adds are part of the GEMM
    return tuple(gemms)


@dataclass(slots=True)
class _Row:
    """A kernel being assembled by :func:`count_kernels` (fused layers are added to it)."""

    name: str
    ops: tuple[str, ...]
    flops: int
    weights: int
    float_in: int
    index_in: int
    float_out: int
    index_out: int
    kv: int
    spilled_fp32: int
    spilled_float: int
    launches: int
    notes: tuple[str, ...]
    gemms: tuple[Gemm, ...] = ()

    def count(self) -> KernelCount:
        return KernelCount(
            name=self.name,
            ops=self.ops,
            flops=self.flops,
            weight_elements=self.weights,
            float_inputs=self.float_in,
            index_inputs=self.index_in,
            float_outputs=self.float_out,
            index_outputs=self.index_out,
            kv_elements=self.kv,
            spilled_fp32=self.spilled_fp32,
            spilled_float=self.spilled_float,
            launches=self.launches,
            notes=self.notes,
            gemms=self.gemms,
        )


def count_kernels(
    analysis: GraphAnalysis,
    *,
    fuse_elementwise: bool = True,
    kv_cache: bool = False,
    kv_context_tokens: int = 0,
    kv_shared_tokens: int = 0,
    beam_width: int = 1,
) -> tuple[KernelCount, ...]:
    """Per-kernel FLOPs and elements moved of one forward pass (see :func:`build_kernels`).

    ``kv_shared_tokens`` of the ``kv_context_tokens`` are a request's prompt, shared by its
    ``beam_width`` beams (the analysis's rows are requests x beams): every beam attends to them
    (FLOPs), but they are read from memory once per request, not once per beam.
    """
    if not 0 <= kv_shared_tokens <= kv_context_tokens:
        raise RooflineInputError(
            f"kv_shared_tokens must be in [0, kv_context_tokens {kv_context_tokens}], "
            f"got {kv_shared_tokens}"
        )
    index_kind = TensorKind.INDEX
    numel: dict[int, tuple[int, TensorKind]] = {
        item.storage: (item.numel, item.kind) for item in analysis.inputs
    }
    per_result: dict[int, tuple[int, int]] = {}  # id(OpResult) -> (weights, launches)
    gemms_of: dict[tuple[int, int], tuple[Gemm, ...]] = {}  # (id(OpResult), context) -> GEMMs
    rows: list[_Row] = []
    open_storage: int | None = None  # output storage of the last kernel, while fusable
    for layer in analysis.layers:
        if _is_view(layer):
            numel[layer.output_storage] = (layer.output_numel, layer.output_kind)
            continue
        inputs = [numel.get(s, (0, TensorKind.FLOAT)) for s in layer.input_storages]
        numel[layer.output_storage] = (layer.output_numel, layer.output_kind)
        out_index = layer.output_kind is index_kind
        out_float, out_idx = (0, layer.output_numel) if out_index else (layer.output_numel, 0)
        flops = layer.flops
        if (
            fuse_elementwise
            and rows
            and open_storage is not None
            and (layer.op in FUSABLE_EPILOGUE_OPS and open_storage in layer.input_storages)
        ):
            chained = layer.input_storages.index(open_storage)
            row = rows[-1]
            row.ops = (*row.ops, layer.op)
            row.flops += flops
            row.weights += layer.params
            for position, (elements, kind) in enumerate(inputs):
                if position == chained:
                    continue
                if kind is index_kind:
                    row.index_in += elements
                else:
                    row.float_in += elements
            row.float_out, row.index_out = out_float, out_idx
        else:
            known = per_result.get(id(layer.result))
            if known is None:
                known = per_result[id(layer.result)] = (_weight_elements(layer), _launches(layer))
            notes: tuple[str, ...] = ()
            if layer.op == "moe":
                notes = (MoeRouting.of(layer).note,)
            kv = 0
            context = 0
            if kv_cache and layer.op == "attention" and layer.result.kv_cache_numel:
                kv = layer.result.kv_cache_numel  # this step's keys and values
                if kv_context_tokens:
                    context = kv_context_tokens
                    per_token = layer.result.kv_cache_numel // layer.output_shape[1]
                    kv += (
                        per_token * context
                        - per_token * kv_shared_tokens * (beam_width - 1) // beam_width
                    )
                    tokens = layer.output_numel // layer.output_shape[-1]
                    flops += 4 * tokens * context * layer.result.param_shapes[0][0]
            spilled_fp32 = spilled_float = 0
            if layer.op == "attention":
                spilled_fp32, spilled_float, note = _spilled_attention(layer, context)
                notes = (note,) if note else notes
            gemms = gemms_of.get((id(layer.result), context))
            if gemms is None:  # the repeats of a block share their op results
                gemms = gemms_of[id(layer.result), context] = layer_gemms(layer, context)
            rows.append(
                _Row(
                    name=layer.name,
                    ops=(layer.op,),
                    flops=flops,
                    weights=known[0],
                    float_in=sum(e for e, kind in inputs if kind is not index_kind),
                    index_in=sum(e for e, kind in inputs if kind is index_kind),
                    float_out=out_float,
                    index_out=out_idx,
                    kv=kv,
                    spilled_fp32=spilled_fp32,
                    spilled_float=spilled_float,
                    launches=known[1],
                    notes=notes,
                    gemms=gemms,
                )
            )
        open_storage = layer.output_storage
    return tuple(row.count() for row in rows)


def build_kernels(
    analysis: GraphAnalysis,
    scheme: PrecisionScheme,
    *,
    fuse_elementwise: bool = True,
    kv_cache: bool = False,
    kv_context_tokens: int = 0,
) -> tuple[Kernel, ...]:
    """Per-kernel FLOPs and bytes moved of one forward pass at a precision.

    Parameters
    ----------
    analysis : the graph analysed in inference mode (``analyze(..., training=False)``), with
        the attention implementation the request runs (``analyze(attention=...)``)
    scheme : bytes per weight, activation and KV-cache element
    fuse_elementwise : fuse batchnorm, activations and adds into the kernel that produced
        their input (the inference engines' epilogue fusion); else every layer is a kernel
    kv_cache : decoders: attention layers write their keys and values to the KV cache
    kv_context_tokens : decode steps: tokens already in the cache, which every attention
        layer reads and attends to

    Returns
    -------
    kernels : in execution order

    Notes
    -----
    Bytes moved by a layer = weight bytes + input bytes + output bytes, with weights at
    ``scheme.weight_bytes`` per element (embeddings: only the gathered rows; tied heads: the
    shared matrix; mixture-of-experts: the router and the ``E * (1 - (1 - k/E)^T)`` experts
    its ``T`` tokens are routed to), float tensors at ``scheme.activation_bytes`` and token ids
    at 8 B. The intermediates inside a composite layer (q/k/v in attention, the MLP's wide
    activation) are assumed to stay on chip, as fused kernels keep them; so are attention's
    S x S scores with flash / mem_efficient, while eager / sdpa_math write the scores and
    probabilities and read them back (``intermediate_bytes``: 2 x (scores + probabilities) at
    their fp32 storage). A fused layer adds its FLOPs and weights to the kernel, reads only its
    other inputs, and its output replaces the kernel's output (the intermediate is never
    written). Decode steps add, per attention layer, the KV cache read
    ``2 * b * c * kv_dim * scheme.kv_cache_bytes`` and the attention FLOPs over the cache
    ``4 * b * c * q_dim`` (QK^T and PV; softmax FLOPs left out).
    """
    counts = count_kernels(
        analysis,
        fuse_elementwise=fuse_elementwise,
        kv_cache=kv_cache,
        kv_context_tokens=kv_context_tokens,
    )
    return tuple(count.at(scheme) for count in counts)


# --------------------------------------------------------------------------------------------
# Phases and phased requests
# --------------------------------------------------------------------------------------------


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


class _LazyKernels(Sequence[Kernel]):
    """A phase's kernels, each built when first read and then kept, read as a tuple of them
    (a recommendation prices a phase from one kernel per run: building every kernel of every
    precision and tensor-parallel share would cost more than the pricing). ``totals``: the
    FLOPs, bytes moved and launches of them all, summed per run (kernels of a run are alike)."""

    __slots__ = ("_all", "_built", "_make", "_size", "totals")

    def __init__(self, size: int, make: Callable[[int], Kernel], runs: Runs) -> None:
        self._size = size
        self._make = make
        self._built: dict[int, Kernel] = {}
        self._all: tuple[Kernel, ...] | None = None
        flops = moved = launches = 0
        for index, count in runs:
            k = self._one(index)
            flops += count * k.flops
            moved += count * k.bytes_moved
            launches += count * k.launches
        self.totals = (flops, moved, launches)

    def _one(self, index: int) -> Kernel:
        found = self._built.get(index)
        if found is None:
            found = self._built[index] = self._make(index)
        return found

    def _every(self) -> tuple[Kernel, ...]:
        if self._all is None:
            self._all = tuple(self._one(i) for i in range(self._size))
        return self._all

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> Kernel: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Kernel, ...]: ...

    def __getitem__(self, index: int | slice) -> Kernel | tuple[Kernel, ...]:
        if isinstance(index, slice) or self._all is not None:
            return self._every()[index]
        position = index + self._size if index < 0 else index
        if not 0 <= position < self._size:
            raise IndexError("kernel index out of range")
        return self._one(position)

    def __iter__(self) -> Iterator[Kernel]:
        return iter(self._every())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _LazyKernels | tuple):
            return self._every() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._every())

    def __repr__(self) -> str:
        return repr(self._every())


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
class _Profile:
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
    ) -> _Profile:
        # (intensity, DRAM bytes, quantized FLOPs, count), each computed once per distinct kernel
        rows = []
        for k, count in groups:
            dram = k.dram_bytes(cache_share)
            paid = k.quantized_flops(tiling)
            rows.append((paid / dram if dram else math.inf, dram * count, paid * count, count))
        rows.sort(key=lambda row: row[0])  # stable: ties keep the kernels' order
        return cls(
            intensities=tuple(row[0] for row in rows),
            bytes_prefix=(0.0, *accumulate(row[1] for row in rows)),
            flops_suffix=(*reversed(tuple(accumulate(row[2] for row in reversed(rows)))), 0),
            kernels_suffix=(*reversed(tuple(accumulate(row[3] for row in reversed(rows)))), 0),
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
    _profiles: dict[tuple[float, Tiling | None], _Profile] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _groups: list[tuple[tuple[Kernel, int], ...]] = field(
        init=False, repr=False, compare=False, default_factory=list
    )
    _runs: list[Runs] = field(init=False, repr=False, compare=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.repeats < 0:
            raise RooflineInputError(f"phase '{self.name}': repeats must be >= 0")
        kernels = self.kernels
        if isinstance(kernels, _LazyKernels):  # summed per run, without building them all
            flops, moved, launches = kernels.totals
        else:
            flops = sum(k.flops for k in kernels)
            moved = sum(k.bytes_moved for k in kernels)
            launches = sum(k.launches for k in kernels)
        object.__setattr__(self, "flops", flops)
        object.__setattr__(self, "bytes_moved", moved)
        object.__setattr__(self, "launches", launches)

    def dram_bytes(self, cache_share: float) -> float:
        """DRAM bytes of one repetition at an activation cache share [B]."""
        return self.profile(cache_share).bytes_prefix[-1]

    def profile(self, cache_share: float, tiling: Tiling | None = None) -> _Profile:
        """The sorted kernels at an activation cache share and a device's tiling (built once
        per pair)."""
        key = (cache_share, tiling)
        found = self._profiles.get(key)
        if found is None:
            if not self._groups:
                runs = self._runs[0] if self._runs else None
                self._groups.append(_kernel_groups(self.kernels, runs))
            found = self._profiles[key] = _Profile.of(self._groups[0], cache_share, tiling)
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

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise RooflineInputError("batch must be >= 1")
        if self.tensor_parallel < 1:
            raise RooflineInputError("tensor_parallel must be >= 1")
        if not self.phases:
            raise RooflineInputError("a request needs at least one phase")

    @property
    def flops(self) -> int:
        """FLOPs per request (all phases and repeats)."""
        return sum(p.flops * p.repeats for p in self.phases)

    @property
    def bytes_moved(self) -> int:
        """Device-memory bytes moved per request [B]."""
        return sum(p.bytes_moved * p.repeats for p in self.phases)


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseShape:
    """A phase in elements: its kernels and copies, independent of the precision."""

    name: str
    counts: tuple[KernelCount, ...]
    h2d_float: int  # elements copied in
    h2d_index: int
    d2h_float: int  # elements copied out
    d2h_index: int
    repeats: int = 1
    _runs: list[Runs] = field(init=False, repr=False, compare=False, default_factory=list)
    _notes: list[tuple[str, ...]] = field(
        init=False, repr=False, compare=False, default_factory=list
    )

    @property
    def notes(self) -> tuple[str, ...]:
        """The distinct notes of its kernels (MoE routing, spilled attention scores)."""
        if not self._notes:
            notes = dict.fromkeys(note for count in self.counts for note in count.notes)
            self._notes.append(tuple(notes))
        return self._notes[0]

    @property
    def runs(self) -> Runs:
        """Its kernels alike in every figure but the name (and notes), as (first index,
        count) in order of first appearance (found once)."""
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
            kernels=_LazyKernels(len(counts), lambda index: counts[index].at(scheme), runs),
            h2d_bytes=self.h2d_float * act + self.h2d_index * INDEX_BYTES,
            d2h_bytes=self.d2h_float * act + self.d2h_index * INDEX_BYTES,
            repeats=self.repeats,
        )
        phase._runs.append(runs)
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
        counts=count_kernels(analysis, fuse_elementwise=fuse_elementwise),
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
        counts=count_kernels(prefill, fuse_elementwise=fuse_elementwise, kv_cache=True),
        h2d_float=h2d_float,
        h2d_index=h2d_index,
        d2h_float=0,
        d2h_index=batch * beam_width,
    )
    decode = PhaseShape(
        name="decode",
        counts=count_kernels(
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


# --------------------------------------------------------------------------------------------
# Prediction
# --------------------------------------------------------------------------------------------


class Bound(StrEnum):
    """What a request's latency mostly goes to."""

    COMPUTE = "compute"
    MEMORY = "memory"
    TRANSFER = "transfer"
    OVERHEAD = "overhead"


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseTiming:
    """One phase on one device, per repetition."""

    name: str
    repeats: int
    kernels: int
    launches: int
    compute_bound_kernels: int
    flops: int
    bytes_moved: int
    dram_bytes: float
    compute_s: float  # kernels limited by compute
    memory_s: float  # kernels limited by memory bandwidth
    launch_s: float
    h2d_bytes: int
    h2d_s: float
    d2h_bytes: int
    d2h_s: float
    allreduces: int = 0  # tensor parallelism
    allreduce_bytes: int = 0
    allreduce_s: float = 0.0  # on the GPUs' stream, between the kernels
    wave_efficiency: float = 1.0  # FLOPs / quantized FLOPs (1: no tiling known)
    pipeline_transfer_bytes: int = 0  # pipeline parallel: activations sent between stages
    pipeline_transfer_s: float = 0.0  # their time (one micro-batch, every boundary)
    pipeline_wait_s: float = 0.0  # the wait for the other micro-batches' slots (cycle - trip)
    # the device idle waiting for a framework's host to issue kernels: launches x host
    # dispatch beyond the device's own time (compute + memory + launch + all-reduces)
    host_wait_s: float = 0.0

    @property
    def kernel_s(self) -> float:
        """Time the device runs kernels (and the all-reduces between them, and waits for the
        host to issue them; pipeline parallel: every stage's kernels, the sends between stages
        and the wait for the other micro-batches) [s]."""
        return (
            self.compute_s
            + self.memory_s
            + self.launch_s
            + self.allreduce_s
            + self.host_wait_s
            + self.pipeline_transfer_s
            + self.pipeline_wait_s
        )

    @property
    def latency_s(self) -> float:
        """Copy in, kernels, copy out [s]."""
        return self.h2d_s + self.kernel_s + self.d2h_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Latency and throughput of a request on a device, with every input of the formulas and
    what they assume (``assumptions``: precision convention, attention, MoE routing)."""

    device: HardwareSpec
    precision: Precision
    batch: int
    compute_dtype: DType
    peak_flops_per_s: float  # the whole device's catalog peak for compute_dtype
    peak_source: str
    calibration: Calibration
    effective_flops_per_s: float  # peak * compute fraction * compute efficiency (for dtype)
    effective_bandwidth_bytes_per_s: float
    effective_host_link_bytes_per_s: float | None
    phases: tuple[PhaseTiming, ...]
    request_overhead_s: float
    latency_s: float
    interval_s: float  # steady-state time per batch
    flops: int
    bytes_moved: int
    dram_bytes: float
    first_token_s: float | None = None  # decoders
    per_token_s: float | None = None
    attention: tuple[tuple[Attention, str], ...] = ()  # implementations priced, and why
    assumptions: tuple[str, ...] = ()  # precision convention, attention, MoE routing in words
    tensor_parallel: int = 1  # GPUs per request (the figures are the group's)
    allreduce_link_source: str = ""  # tensor parallel: the link the all-reduces cross
    tiling: Tiling | None = None  # tile and wave quantization (None: the device has no count)
    pipeline: PipelineTiming | None = None  # pipeline parallel: stages, micro-batches, sends

    @property
    def pipeline_parallel(self) -> int:
        """Pipeline stages (1: none)."""
        return 1 if self.pipeline is None else self.pipeline.stages

    def __post_init__(self) -> None:
        # Every property below divides by one of these: a prediction only exists with them sane.
        if self.batch < 1:
            raise RooflineInputError(f"batch must be >= 1, got {self.batch}")
        where = f"{self.device.slug} at {self.precision.value}, batch {self.batch}"
        for name in ("effective_flops_per_s", "effective_bandwidth_bytes_per_s"):
            value = getattr(self, name)
            if not in_range(value, sys.float_info.min, math.inf):
                raise RooflineInputError(f"{where}: {name} must be positive, got {value!r}")
        for name in ("latency_s", "interval_s"):
            value = getattr(self, name)
            if not in_range(value, 0.0, math.inf):
                raise RooflineInputError(
                    f"{where}: the {name[:-2]} is not a finite time ({value!r}): the device's "
                    "figures are too small for this request"
                )
            if value < sys.float_info.min:
                raise RooflineInputError(
                    f"{where}: the {name[:-2]} would be 0 s: the model runs no kernel and copies "
                    "nothing, and the calibration sets no launch or request overhead"
                )

    @property
    def throughput_per_s(self) -> float:
        """Inferences (sequences for decoders) per second at steady state."""
        return self.batch / self.interval_s

    @property
    def time_split_s(self) -> Mapping[Bound, float]:
        """Latency split into compute-bound, memory-bound, transfer and overhead time [s]."""
        split = dict.fromkeys(Bound, 0.0)
        for phase in self.phases:
            split[Bound.COMPUTE] += phase.compute_s * phase.repeats
            split[Bound.MEMORY] += phase.memory_s * phase.repeats
            split[Bound.TRANSFER] += (
                phase.h2d_s + phase.d2h_s + phase.allreduce_s + phase.pipeline_transfer_s
            ) * phase.repeats
            split[Bound.OVERHEAD] += (
                phase.launch_s + phase.host_wait_s + phase.pipeline_wait_s
            ) * phase.repeats
        split[Bound.OVERHEAD] += self.request_overhead_s
        return split

    @property
    def bound(self) -> Bound:
        """The largest share of the latency."""
        split = self.time_split_s
        return max(Bound, key=lambda b: split[b])

    @property
    def arithmetic_intensity_flops_per_byte(self) -> float:
        """Operational intensity of the whole request: FLOPs per DRAM byte [FLOP/B]."""
        return self.flops / self.dram_bytes if self.dram_bytes else math.inf

    @property
    def ridge_point_flops_per_byte(self) -> float:
        """Intensity above which a kernel is compute-bound on this device (effective peak /
        effective bandwidth) [FLOP/B]."""
        return self.effective_flops_per_s / self.effective_bandwidth_bytes_per_s


def compute_dtype_for(device: HardwareSpec, scheme: PrecisionScheme) -> DType | None:
    """The dtype whose peak runs the precision's math on ``device``, or None."""
    return next((d for d in scheme.compute_dtypes if device.peak_flops_per_s.get(d)), None)


def implausible_figures(device: HardwareSpec, dtype: DType) -> str | None:
    """Why the figures of ``device`` that a prediction at ``dtype`` divides by are not physical
    (zero, subnormal, negative, non-finite or absurdly large), or None when they are sane."""
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


def cpu_compute_unit(simd: str, dtype: DType) -> str:
    """The CPU unit whose peak runs ``dtype``: AMX tiles, AVX-512 VNNI or FMA, AVX2 FMA."""
    if dtype in (DType.INT8, DType.BF16, DType.FP16) and has_amx(simd):
        return AMX_TILES
    if dtype is DType.INT8 and "VNNI" in simd:
        return "AVX-512 VNNI"
    if "AVX-512" in simd:
        return "AVX-512 FMA"
    if "AVX2" in simd:
        return "AVX2 FMA"
    return simd


def _peak_source(device: HardwareSpec, dtype: DType) -> str:
    base = f"catalog dense {dtype.value} peak"
    if device.kind is not DeviceKind.CPU or not device.simd:
        return base
    return f"{base} ({cpu_compute_unit(device.simd, dtype)}; the CPU has {device.simd})"


ALLREDUCE_LATENCY_S = 10e-6  # per NCCL all-reduce of a small message inside a node (assumed)


def link_between_gpus(device: HardwareSpec, cal: Calibration, *, what: str) -> tuple[float, str]:
    """The effective link between two GPUs of ``device``'s kind and where it comes from: the
    catalog's GPU link (NVLink), else the host link (PCIe), times the calibrated host-link
    efficiency [B/s per direction]."""
    if device.gpu_link_bytes_per_s is not None:
        raw, source = device.gpu_link_bytes_per_s, "the catalog's GPU link (NVLink)"
    elif device.host_link_bytes_per_s is not None:
        raw, source = device.host_link_bytes_per_s, "the host link (no GPU link: PCIe)"
    else:
        raise RooflineInputError(f"{device.slug}: {what} needs a GPU or host link between the GPUs")
    return raw * cal.host_link_efficiency, source


@dataclass(frozen=True, slots=True, kw_only=True)
class AllReduce:
    """A ring all-reduce between the ``degree`` GPUs of a tensor-parallel group."""

    degree: int
    link_bytes_per_s: float  # effective, per direction, per GPU
    source: str

    @classmethod
    def between(cls, device: HardwareSpec, degree: int, cal: Calibration) -> AllReduce:
        """Over the device's GPU link (NVLink), else its host link, at the calibrated
        host-link efficiency."""
        link, source = link_between_gpus(device, cal, what="tensor parallelism")
        return cls(degree=degree, link_bytes_per_s=link, source=source)

    def seconds(self, count: int, total_bytes: int) -> float:
        """``count`` all-reduces of ``total_bytes`` in all [s].

        Notes
        -----
        A ring all-reduce sends and receives ``2 (t - 1) / t`` of the buffer per GPU:
        ``t_ar = n * alpha + 2 (t - 1) / t * B / L_eff`` (``alpha``: per-call latency,
        ``L_eff``: link x calibrated link efficiency).
        """
        ring = 2 * (self.degree - 1) / self.degree
        return count * ALLREDUCE_LATENCY_S + ring * total_bytes / self.link_bytes_per_s


def _split_nth(kernels: Sequence[Kernel], degree: int, index: int) -> Kernel:
    """One tensor-parallel GPU's share of ``kernels[index]`` (see :func:`shard`)."""
    k = kernels[index]
    return Kernel(  # the constructor, not dataclasses.replace: ~4x faster per kernel
        name=k.name,
        ops=k.ops,
        flops=-(-k.flops // degree),
        weight_bytes=-(-k.weight_bytes // degree),
        input_bytes=k.input_bytes,
        output_bytes=k.output_bytes,
        kv_cache_bytes=-(-k.kv_cache_bytes // degree),
        intermediate_bytes=-(-k.intermediate_bytes // degree),
        launches=k.launches,
        gemms=tuple(g.split(degree) for g in k.gemms),
    )


def shard(request: PhasedRequest, degree: int) -> PhasedRequest:
    """One GPU's share of ``request`` split Megatron-style across ``degree`` GPUs.

    Parameters
    ----------
    request : the whole request on one device
    degree : GPUs in the tensor-parallel group [-]

    Returns
    -------
    share : every kernel's FLOPs, weights, KV cache and spilled attention scores divided by
        ``degree`` (attention heads and MLP columns split; activations between kernels stay
        whole, a conservative reading of the replicated norms and residuals), and two
        all-reduces of the hidden state per attention layer (after the attention output
        projection and after the MLP)

    Raises
    ------
    RooflineInputError
        When ``degree`` < 2 or the graph has no attention layer (nothing to split by heads).
    """
    if degree < 2:
        raise RooflineInputError(f"tensor parallelism needs >= 2 GPUs, got {degree}")
    phases = []
    attention_layers = 0
    for phase in request.phases:
        source = phase.kernels
        runs = phase._runs[0] if phase._runs else tuple((i, 1) for i in range(len(source)))
        allreduces = allreduce_bytes = 0
        for index, count in runs:
            k = source[index]
            if "attention" in k.ops:
                attention_layers += count
                allreduces += 2 * count
                allreduce_bytes += 2 * count * k.output_bytes
        share = replace(
            phase,
            kernels=_LazyKernels(len(source), partial(_split_nth, source, degree), runs),
            allreduces=allreduces,
            allreduce_bytes=allreduce_bytes,
        )
        share._runs.append(runs)  # kernels alike stay alike when split alike
        phases.append(share)
    if not attention_layers:
        raise RooflineInputError(
            "tensor parallelism splits attention heads and MLP columns: the graph has no "
            "attention layer"
        )
    return replace(
        request,
        phases=tuple(phases),
        tensor_parallel=degree,
        assumptions=(
            *request.assumptions,
            f"tensor parallel across {degree} GPUs (Megatron-style): each runs 1/{degree} of "
            "the FLOPs, weights and KV cache; two ring all-reduces of the hidden state per "
            f"layer, {ALLREDUCE_LATENCY_S * 1e6:g} us each plus 2 (t - 1) / t of it over the "
            "link",
        ),
    )


# CPU core occupancy: a GEMM's work items are 64 x 64 output tiles, wave-quantized on
# cpu.cores, so a small batch keeps only some cores busy. On since 2026-11-25: with the eight
# Xeons without AMX of calibration_cpu.yaml, leave-one-device-out improved with it (ResNet-50
# throughput 65 -> 68 of 74 rows within 1.5x, its Server rows 22 -> 25 of 29; BERT 16 -> 15
# of 32, the Xeon 8480+ Server row 1.49x -> 1.51x; all rows 112 -> 114 of 142). With the
# 8380 as the only such CPU it had made them worse (ResNet-50 22 -> 21 of 28), and it was off.
# The fit (batch 256) fills every core either way: the fitted efficiencies do not move.
CPU_CORE_OCCUPANCY = True


def tiling_for(device: HardwareSpec, *, cpu_occupancy: bool = CPU_CORE_OCCUPANCY) -> Tiling | None:
    """How ``device`` spreads GEMM tiles, or None when its unit count is unknown (TPUs,
    profiles without ``sm_count``) or it is a CPU and ``cpu_occupancy`` is off."""
    units = device.parallel_units
    if units is None or units < 1:
        return None
    if device.kind is DeviceKind.CPU:
        return Tiling(units=units, tile=CPU_TILE, split_k=False) if cpu_occupancy else None
    return Tiling(units=units, tile=GPU_TILE, split_k=True, units_source=device.sm_count_source)


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
    allreduce_s = 0.0
    if allreduce is not None and phase.allreduces:
        allreduce_s = allreduce.seconds(phase.allreduces, phase.allreduce_bytes)
    compute_s = prof.flops_suffix[split] / flops_per_s
    memory_s = prof.bytes_prefix[split] / bytes_per_s
    launch_s = phase.launches * cal.kernel_launch_overhead_s
    device_s = compute_s + memory_s + launch_s + allreduce_s
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
        host_wait_s=max(0.0, phase.launches * cal.host_dispatch_s - device_s),
        h2d_bytes=phase.h2d_bytes if link else 0,
        h2d_s=phase.h2d_bytes / link if link else 0.0,
        d2h_bytes=phase.d2h_bytes if link else 0,
        d2h_s=phase.d2h_bytes / link if link else 0.0,
        allreduces=phase.allreduces if allreduce else 0,
        allreduce_bytes=phase.allreduce_bytes if allreduce else 0,
        allreduce_s=allreduce_s,
        wave_efficiency=phase.flops / prof.flops_suffix[0] if prof.flops_suffix[0] else 1.0,
    )


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
    reason = unsupported_reason(device, request.scheme)
    dtype = compute_dtype_for(device, request.scheme)
    if reason is not None or dtype is None:
        raise RooflineInputError(f"{device.slug} cannot run {request.scheme.precision}: {reason}")
    cal = calibration
    peak = device.peak_flops_per_s[dtype]
    flops_per_s = peak * device.compute_fraction * cal.compute_efficiency_for(dtype)
    bytes_per_s = (
        device.memory_bandwidth_bytes_per_s * device.bandwidth_fraction * cal.memory_efficiency
    )
    link = None
    if device.needs_host_copy and device.host_link_bytes_per_s is not None:
        link = device.host_link_bytes_per_s * cal.host_link_efficiency
    allreduce = None
    if request.tensor_parallel > 1:
        allreduce = AllReduce.between(device, request.tensor_parallel, cal)
    tiling = tiling_for(device)
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
    latency = overhead + sum(t.latency_s * t.repeats for t in timings)
    if device.kind is DeviceKind.CPU:
        interval = latency
    else:
        interval = max(
            sum(t.kernel_s * t.repeats for t in timings),
            sum(t.h2d_s * t.repeats for t in timings),
            sum(t.d2h_s * t.repeats for t in timings),
            overhead,
        )
    first_token = per_token = None
    if request.decoder:
        first_token = overhead + timings[0].latency_s
        per_token = timings[1].latency_s if len(timings) > 1 else None
    return Prediction(
        device=device,
        precision=request.scheme.precision,
        batch=request.batch,
        compute_dtype=dtype,
        peak_flops_per_s=peak,
        peak_source=_peak_source(device, dtype),
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
        assumptions=request.assumptions + _precision_scale_note(cal, dtype),
        tensor_parallel=request.tensor_parallel,
        allreduce_link_source="" if allreduce is None else allreduce.source,
        tiling=tiling,
    )


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
