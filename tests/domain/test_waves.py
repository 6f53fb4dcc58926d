"""Golden numbers of tile and wave quantization (issue 15: GEMM efficiency by problem size)."""

from dataclasses import replace

import pytest

from app.domain.graph.analysis import InputDecl, analyze
from app.domain.hardware import DeviceKind, HardwareInputError, HardwareSpec, mig_slice
from app.domain.mig.layout import MigGeometry, MigProfileSpec
from app.domain.performance.calibration import DEFAULT_CALIBRATIONS, CalibrationClass
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.kernels import Kernel, build_kernels
from app.domain.performance.phases import Phase, PhasedRequest
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.roofline import predict
from app.domain.performance.tiling import (
    GPU_TILE,
    Gemm,
    Tiling,
    gemm_efficiency,
    split_k_factor,
    tiling_for,
    wave_efficiency,
)
from app.domain.precision import DType, Precision

FP16 = PRECISION_SCHEMES[Precision.FP16]


@pytest.mark.parametrize(
    ("tiles", "units", "expected"),
    [
        (108, 108, 1.0),  # one full wave on an A100
        (109, 108, 109 / 216),  # one tile spills into a second wave: 0.50463
        (1568, 108, 1568 / 1620),  # 15 waves, the last 56 of 108 full: 0.96790
        (64, 132, 64 / 132),  # fewer tiles than H100 SXM SMs: 0.48485
        (264, 132, 1.0),  # exactly two waves
        (1, 40, 1 / 40),
    ],
)
def test_wave_efficiency_golden(tiles: int, units: int, expected: float) -> None:
    assert wave_efficiency(tiles, units) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("tiles", "units"), [(0, 108), (10, 0), (-1, 4)])
def test_wave_efficiency_needs_tiles_and_units(tiles: int, units: int) -> None:
    with pytest.raises(RooflineInputError):
        wave_efficiency(tiles, units)


def test_tiles_of_a_gemm_at_128() -> None:
    """M = 4096, N = 4096: 32 x 32 tiles; M = 300, N = 1000: 3 x 8 (tile quantization)."""
    assert Gemm(m=4096, n=4096, k=4096, count=1, flops=0).tiles(GPU_TILE) == 1024
    assert Gemm(m=300, n=1000, k=64, count=1, flops=0).tiles(GPU_TILE) == 24
    assert Gemm(m=300, n=1, k=9, count=32, flops=0).tiles(GPU_TILE) == 96  # depthwise: per channel


def test_split_k_fills_the_sms_when_the_tiles_do_not() -> None:
    assert split_k_factor(16, 108, k_steps=36) == 6  # 96 of 108 SMs busy
    assert split_k_factor(16, 108, k_steps=2) == 2  # a short reduction cannot split further
    assert split_k_factor(200, 108, k_steps=36) == 1  # enough tiles: no split
    gemm = Gemm(m=49, n=2048, k=4608, count=1, flops=1)  # ResNet-50's last 3x3 conv at batch 1
    tiling = Tiling(units=108, tile=GPU_TILE, split_k=True)
    assert gemm_efficiency(gemm, tiling) == pytest.approx(96 / 108)
    assert gemm_efficiency(gemm, replace(tiling, split_k=False)) == pytest.approx(16 / 108)


def _gpu(sm_count: int | None) -> HardwareSpec:
    return HardwareSpec(
        slug="gpu",
        name="GPU",
        kind=DeviceKind.GPU,
        peak_flops_per_s={DType.FP16: 100e12},
        memory_bandwidth_bytes_per_s=1e12,
        memory_bytes=2**36,
        host_link_bytes_per_s=32e9,
        host_link_source="test",
        tdp_watts=None,
        price_usd_per_hour=None,
        sm_count=sm_count,
    )


def _geometry(*profiles: MigProfileSpec) -> MigGeometry:
    return MigGeometry(
        gpu="gpu",
        total_compute_slices=7,
        total_memory_slices=8,
        max_gpu_instances=7,
        profiles=profiles,
    )


def _profile(name: str, compute_slices: int, sm_count: int | None) -> MigProfileSpec:
    return MigProfileSpec(
        name=name,
        memory_mib=9728,
        compute_slices=compute_slices,
        memory_slices=compute_slices,
        max_instances=1,
        placements=(0,),
        sm_count=sm_count,
    )


@pytest.mark.parametrize(
    ("gpu_sms", "name", "compute_slices", "profile_sms", "expected"),
    [
        # NVIDIA MIG User Guide, "Supported MIG Profiles": not floor(108 x 1/7) = 15
        (108, "1g.10gb", 1, 14, 14),  # A100 80GB
        (108, "7g.80gb", 7, 98, 98),  # A100 80GB: not all 108 SMs
        (132, "1g.20gb", 1, 26, 26),  # H100 SXM: not floor(132 / 7) = 18
        (132, "4g.40gb", 4, 64, 64),  # H100 SXM: not floor(132 x 4/7) = 75
        (None, "1g.10gb", 1, 14, 14),  # the profile's own figure needs no GPU count
        # no figure for the profile: floor(GPU SMs x compute slices / 7), an approximation
        (148, "3g.90gb", 3, None, 63),  # B200: floor(444 / 7)
        (148, "7g.180gb", 7, None, 148),
        (None, "3g.90gb", 3, None, None),  # nothing known: no wave quantization
    ],
)
def test_a_mig_slice_has_its_profiles_sms_else_the_proportional_share(
    gpu_sms: int | None,
    name: str,
    compute_slices: int,
    profile_sms: int | None,
    expected: int | None,
) -> None:
    profile = _profile(name, compute_slices, profile_sms)
    part = mig_slice(_gpu(gpu_sms), _geometry(profile), profile)
    assert part.sm_count == expected
    assert part.compute_fraction == pytest.approx(compute_slices / 7)  # peaks still by slices


def test_the_tiling_says_where_a_slices_sms_come_from() -> None:
    known, unknown = _profile("1g.10gb", 1, 14), _profile("2g.20gb", 2, None)
    geometry = _geometry(known, unknown)
    own = tiling_for(mig_slice(_gpu(108), geometry, known))
    assert own is not None
    assert own.units == 14
    assert own.assumption.endswith("; MIG 1g.10gb: the profile's own SM count")
    share = tiling_for(mig_slice(_gpu(108), geometry, unknown))
    assert share is not None
    assert share.units == 30  # floor(108 x 2/7)
    assert "MIG 2g.20gb: approximated as floor(108 GPU SMs x 2/7 compute slices)" in (
        share.assumption
    )
    whole = tiling_for(_gpu(108))
    assert whole is not None
    assert "MIG" not in whole.assumption
    assert share == Tiling(units=30, tile=GPU_TILE, split_k=True)  # the source is not a key


@pytest.mark.parametrize("sm_count", [0, -14, 109, True, 14.0])
def test_a_profile_sm_count_outside_its_gpu_is_refused(sm_count: object) -> None:
    profile = _profile("1g.10gb", 1, sm_count)  # type: ignore[arg-type]
    with pytest.raises(HardwareInputError) as raised:
        mig_slice(_gpu(108), _geometry(profile), profile)
    assert str(raised.value) == (
        f"gpu MIG 1g.10gb: sm_count {sm_count!r} must be an integer between 1 and the GPU's "
        "sm_count of 108"
    )


def test_a_kernels_time_with_and_without_wave_quantization() -> None:
    """One compute-bound GEMM of 10 x 11 = 110 tiles: on 108 SMs it takes two waves, the second
    2/108 full, so t = F / (P_eff * 110/216); on 110 SMs one full wave, t = F / P_eff."""
    flops = 2 * 1280 * 1408 * 4096  # M = 1280 (10 tiles) x N = 1408 (11 tiles) = 110 tiles
    kernel = Kernel(
        name="gemm",
        ops=("linear",),
        flops=flops,
        weight_bytes=1,
        input_bytes=0,
        output_bytes=0,
        kv_cache_bytes=0,
        launches=1,
        gemms=(Gemm(m=1280, n=1408, k=4096, count=1, flops=flops),),
    )
    request = PhasedRequest(
        batch=1,
        scheme=FP16,
        phases=(Phase(name="forward", kernels=(kernel,), h2d_bytes=0, d2h_bytes=0),),
    )
    cal = replace(DEFAULT_CALIBRATIONS[CalibrationClass.GPU], request_overhead_s=0.0)
    p_eff = 100e12 * cal.compute_efficiency * cal.half_precision_scale  # fp16 math
    plain = predict(request, _gpu(None), cal).phases[0]
    waved = predict(request, _gpu(108), cal).phases[0]
    assert plain.compute_s == pytest.approx(flops / p_eff)
    assert plain.wave_efficiency == 1.0
    assert waved.wave_efficiency == pytest.approx(110 / 216)
    assert waved.compute_s == pytest.approx(flops / (p_eff * 110 / 216))
    full = predict(request, _gpu(110), cal).phases[0]  # 110 tiles on 110 SMs: one full wave
    assert full.compute_s == pytest.approx(flops / p_eff)


def test_linear_and_attention_layers_carry_their_gemm_shapes() -> None:
    analysis = analyze(
        [InputDecl(name="x", shape=("batch", 256, 1024))],
        [
            {"name": "fc", "op": "linear", "in_features": 1024, "out_features": 4096},
            {"name": "attn", "op": "attention", "num_heads": 32},
        ],
        {"batch": 2},
        training=False,
    )
    fc, attn = build_kernels(analysis, FP16)
    assert fc.gemms == (Gemm(m=512, n=4096, k=1024, count=1, flops=fc.flops),)
    assert [g.n for g in attn.gemms] == [4096, 4096, 4096, 4096, 4096]  # q, k, v, o, core
    assert sum(g.flops for g in attn.gemms) == attn.flops
    core = attn.gemms[-1]
    assert (core.m, core.k) == (512, 256)  # tokens x q_dim over the 256 keys


def test_mig_slices_get_their_share_of_the_sms_and_cpus_their_cores() -> None:
    geometry = MigGeometry(
        gpu="gpu",
        total_compute_slices=7,
        total_memory_slices=8,
        max_gpu_instances=7,
        profiles=(
            MigProfileSpec(
                name="1g.10gb",
                memory_mib=9728,
                compute_slices=1,
                memory_slices=1,
                max_instances=7,
                placements=(0,),
            ),
        ),
    )
    part = mig_slice(_gpu(108), geometry, geometry.profiles[0])
    assert part.sm_count == 15  # floor(108 / 7)
    tiling = tiling_for(part)
    assert tiling is not None
    assert tiling.units == 15
    assert tiling_for(_gpu(None)) is None
    cpu = replace(_gpu(None), kind=DeviceKind.CPU, cpu_cores=56)
    assert tiling_for(cpu, cpu_occupancy=False) is None
    occupied = tiling_for(cpu)  # on by default
    assert occupied is not None
    assert (occupied.units, occupied.split_k) == (56, False)
