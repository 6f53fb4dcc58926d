"""Tiles and waves: a GEMM's efficiency as a function of its size and the device's units
(pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from app.domain.hardware import DeviceKind, HardwareSpec
from app.domain.performance.errors import RooflineInputError

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
    # Hashed once: a device's profiles and wave costs are looked up by it for every kernel
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.units, self.tile, self.split_k)))

    def __hash__(self) -> int:
        return self._hash

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
