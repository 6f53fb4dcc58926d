"""Calibration classes and their fitted efficiencies and overheads: the roofline's constants as
data, each with its provenance (pure).

The figures are derived by ``benchmarks/calibration/calibrate.py`` from the rows under
``benchmarks/calibration/`` (see its README); a request may override them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from app.domain.hardware import (
    MAX_OVERHEAD_S,
    MIN_EFFICIENCY,
    DeviceKind,
    HardwareSpec,
    in_range,
    require_range,
)
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.precision_schemes import PrecisionScheme, compute_dtype_for
from app.domain.precision import DType


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
