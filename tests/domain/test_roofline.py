"""Golden numbers and properties of the roofline model (hand-computable cases, the seeds'
figures, monotonicity over the zoo)."""

import math
from dataclasses import replace
from typing import Any

import pytest

from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.hardware import DeviceKind, HardwareSpec, mig_slice, pcie_bandwidth_bytes_per_s
from app.domain.mig.layout import MigGeometry, MigProfileSpec
from app.domain.performance.calibration import (
    DEFAULT_CALIBRATIONS,
    Calibration,
    CalibrationClass,
    calibration_class,
)
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.kernels import (
    Kernel,
    build_kernels,
    expected_experts_read,
    moe_weight_elements,
)
from app.domain.performance.phases import (
    Phase,
    PhasedRequest,
    decoder_request,
    forward_request,
    is_decoder,
)
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.prediction import Bound
from app.domain.performance.roofline import kernel_points, predict, unsupported_reason
from app.domain.performance.tensor_parallel import AllReduce, shard
from app.domain.precision import DType, Precision
from app.domain.workload import Attention
from app.domain.zoo import ZOO, gpt2
from app.domain.zoo.cnn import resnet
from app.domain.zoo.transformers import llama as llama_graph

FP32 = PRECISION_SCHEMES[Precision.FP32]
FP16 = PRECISION_SCHEMES[Precision.FP16]
INT8 = PRECISION_SCHEMES[Precision.INT8]

MLP: list[dict[str, Any]] = [
    {"name": "fc1", "op": "linear", "out_features": 128},
    {"name": "act", "op": "relu"},
    {"name": "fc2", "op": "linear", "out_features": 10},
]

# Round numbers so that every figure below can be checked by hand.
HAND_GPU = HardwareSpec(
    slug="hand-gpu",
    name="Hand GPU",
    kind=DeviceKind.GPU,
    peak_flops_per_s={DType.FP32: 1e12},
    memory_bandwidth_bytes_per_s=1e11,
    memory_bytes=2**30,
    host_link_bytes_per_s=1e10,
    host_link_source="test",
    tdp_watts=100.0,
    price_usd_per_hour=3.6,
)
HAND_CAL = Calibration(
    compute_efficiency=0.5,
    memory_efficiency=0.5,
    activation_cache_share=0.0,
    host_link_efficiency=0.5,
    kernel_launch_overhead_s=1e-5,
    request_overhead_s=1e-4,
    basis="test",
)


def _mlp(batch: int) -> GraphAnalysis:
    inputs = (InputDecl(name="x", shape=("batch", 64)),)
    return analyze(inputs, MLP, {"batch": batch}, training=False)


def test_kernels_of_a_hand_computable_mlp() -> None:
    kernels = build_kernels(_mlp(2), FP32)
    assert [k.ops for k in kernels] == [("linear", "relu"), ("linear",)]
    first, second = kernels
    # fc1: 2*2*64*128 FLOPs + relu 2*128; weights (64*128 + 128) * 4 B; x 2*64*4; out 2*128*4
    assert (first.flops, first.weight_bytes, first.input_bytes, first.output_bytes) == (
        33_024,
        33_280,
        512,
        1_024,
    )
    # fc2: 2*2*128*10 FLOPs; weights (128*10 + 10) * 4 B; reads fc1's 1,024 B; out 2*10*4
    assert (second.flops, second.weight_bytes, second.input_bytes, second.output_bytes) == (
        5_120,
        5_160,
        1_024,
        80,
    )
    assert first.bytes_moved == 34_816
    assert first.dram_bytes(0.5) == 33_280 + 0.5 * (512 + 1_024)
    unfused = build_kernels(_mlp(2), FP32, fuse_elementwise=False)
    assert [k.ops for k in unfused] == [("linear",), ("relu",), ("linear",)]
    assert sum(k.flops for k in unfused) == sum(k.flops for k in kernels)


def test_half_precision_math_runs_at_the_scaled_efficiency() -> None:
    """Golden: the hand MLP at batch 4,096 on a GPU with 1e12 FLOP/s at fp32 and fp16; fc1
    (67,633,152 FLOPs over 3,179,008 B at fp32, 21.3 FLOP/B, and half of it at fp16) is
    compute-bound either way, fc2 memory-bound (ridges 10 and 15 FLOP/B). A 16-bit
    scale of 1.5 runs fp16 math at 0.5 x 1.5 = 0.75 of the peak, fp32 at 0.5; at an efficiency
    of 0.8 the product 1.2 is capped at the peak. The scale is said in the assumptions."""
    gpu = replace(HAND_GPU, peak_flops_per_s={DType.FP32: 1e12, DType.FP16: 1e12})
    cal = replace(HAND_CAL, half_precision_scale=1.5)
    assert cal.precision_scale(DType.FP16) == cal.precision_scale(DType.BF16) == 1.5
    assert cal.precision_scale(DType.INT8) == cal.precision_scale(DType.FP32) == 1.0
    fp16 = predict(forward_request(_mlp(4096), FP16, batch=4096), gpu, cal)
    fp32 = predict(forward_request(_mlp(4096), FP32, batch=4096), gpu, cal)
    assert fp16.effective_flops_per_s == pytest.approx(0.75e12)
    assert fp32.effective_flops_per_s == pytest.approx(0.5e12)
    assert fp16.phases[0].compute_s == pytest.approx(67_633_152 / 0.75e12)
    assert fp32.phases[0].compute_s == pytest.approx(67_633_152 / 0.5e12)
    assert any("fp16 math at 1.5 x the calibrated compute efficiency (0.5 -> 0.75)" in a
               for a in fp16.assumptions)  # fmt: skip
    assert not any("calibrated compute efficiency" in a for a in fp32.assumptions)
    capped = predict(
        forward_request(_mlp(4096), FP16, batch=4096), gpu, replace(cal, compute_efficiency=0.8)
    )
    assert capped.effective_flops_per_s == pytest.approx(1e12)


def test_the_gpu_classes_carry_the_fitted_half_precision_scale() -> None:
    for cls in (CalibrationClass.GPU, CalibrationClass.GPU_AMPERE, CalibrationClass.GPU_HOPPER):
        assert DEFAULT_CALIBRATIONS[cls].half_precision_scale == pytest.approx(1.28)
    for cls in (
        CalibrationClass.CPU,
        CalibrationClass.CPU_AMX,
        CalibrationClass.EDGE,
        CalibrationClass.TPU,
    ):
        assert DEFAULT_CALIBRATIONS[cls].half_precision_scale == 1.0


def test_hand_computed_latency_on_a_gpu() -> None:
    request = forward_request(_mlp(2), FP32, batch=2)
    p = predict(request, HAND_GPU, HAND_CAL)
    # P_eff = 1e12 * 0.5, BW_eff = 1e11 * 0.5: ridge 10 FLOP/B; both kernels (< 1 FLOP/B) are
    # memory-bound: (34,816 + 6,264) B / 5e10 B/s = 8.216e-7 s; two launches 2e-5 s;
    # copies 512 B and 80 B at 1e10 * 0.5 B/s; request 1e-4 s.
    (phase,) = p.phases
    assert phase.compute_s == 0
    assert phase.memory_s == pytest.approx(8.216e-7)
    assert phase.launch_s == pytest.approx(2e-5)
    assert phase.h2d_s == pytest.approx(1.024e-7)
    assert phase.d2h_s == pytest.approx(1.6e-8)
    assert p.latency_s == pytest.approx(1e-4 + 1.024e-7 + 8.216e-7 + 2e-5 + 1.6e-8)
    # the host-side request overhead (1e-4) is the longest stage: 2 / 1e-4 = 20,000 / s
    assert p.interval_s == pytest.approx(1e-4)
    assert p.throughput_per_s == pytest.approx(20_000)
    assert p.bound is Bound.OVERHEAD
    assert p.ridge_point_flops_per_byte == pytest.approx(10)
    assert p.arithmetic_intensity_flops_per_byte == pytest.approx(38_144 / 41_080)


def test_host_dispatch_overlaps_the_kernels_and_idles_the_device_only_when_longer() -> None:
    """Golden: the hand MLP as above with a framework issuing each kernel in 80 us from the
    host. At batch 2 the device's own time per pass is 8.216e-7 + 2 x 1e-5 = 2.08216e-5 s and
    the host's 2 x 8e-5 = 1.6e-4 s: the device waits 1.391784e-4 s, the kernels take 1.6e-4 s,
    the latency is 1e-4 + 1.184e-7 + 1.6e-4 s and the interval 1.6e-4 s (longer than the
    request overhead). At batch 4,096 the device's time (2.006e-4 s: fc1 compute-bound)
    outlasts the host's: nothing waits and the prediction is the engine's."""
    framework = replace(HAND_CAL, host_dispatch_s=8e-5)
    p = predict(forward_request(_mlp(2), FP32, batch=2), HAND_GPU, framework)
    (phase,) = p.phases
    assert phase.launch_s == pytest.approx(2e-5)  # the device's own launches stay serial
    assert phase.host_wait_s == pytest.approx(1.391784e-4)
    assert phase.kernel_s == pytest.approx(1.6e-4)
    assert p.latency_s == pytest.approx(1e-4 + 1.184e-7 + 1.6e-4)
    assert p.interval_s == pytest.approx(1.6e-4)
    assert p.time_split_s[Bound.OVERHEAD] == pytest.approx(1e-4 + 2e-5 + 1.391784e-4)
    assert p.bound is Bound.OVERHEAD
    big = forward_request(_mlp(4096), FP32, batch=4096)
    engine, served = predict(big, HAND_GPU, HAND_CAL), predict(big, HAND_GPU, framework)
    assert engine.phases[0].kernel_s == pytest.approx(2.006e-4, rel=1e-3)
    assert served.phases[0].host_wait_s == 0
    assert served.latency_s == engine.latency_s
    with pytest.raises(RooflineInputError, match="host_dispatch_s must be a finite number"):
        replace(HAND_CAL, host_dispatch_s=-1e-6)


def test_hand_computed_compute_bound_cpu() -> None:
    cpu = replace(HAND_GPU, kind=DeviceKind.CPU, peak_flops_per_s={DType.FP32: 1e8})
    p = predict(forward_request(_mlp(2), FP32, batch=2), cpu, HAND_CAL)
    (phase,) = p.phases
    # P_eff 5e7: ridge 0.001 FLOP/B, both kernels compute-bound: 38,144 / 5e7 s; no copies
    assert phase.compute_s == pytest.approx(38_144 / 5e7)
    assert phase.memory_s == 0
    assert phase.h2d_s == phase.d2h_s == 0
    assert p.latency_s == pytest.approx(1e-4 + 38_144 / 5e7 + 2e-5)
    assert p.interval_s == p.latency_s  # a CPU overlaps nothing
    assert p.bound is Bound.COMPUTE


def test_cache_share_only_discounts_activations() -> None:
    cal = replace(HAND_CAL, activation_cache_share=0.5)
    (phase,) = predict(forward_request(_mlp(2), FP32, batch=2), HAND_GPU, cal).phases
    # weights 33,280 + 5,160 B stay; activations (512 + 1,024) + (1,024 + 80) B are halved
    assert phase.dram_bytes == pytest.approx(38_440 + 0.5 * 2_640)
    assert phase.memory_s == pytest.approx((38_440 + 0.5 * 2_640) / 5e10)


def test_seed_resnet50_gops_per_image() -> None:
    """The seeds' ~7.72 GOPs per 224x224 image and '230 Gops for 30 fps'.

    Convention: a multiply-add is 2 operations. The seeds' figure is the original ResNet-50
    (v1, stride on the first 1x1 conv of a downsampling block) counting convolutions and the
    classifier: 2 x 3.858 G MACs. The zoo's ResNet-50 is torchvision's v1.5 (stride on the
    3x3 conv, what MLPerf runs): 8.18 GOPs in convolutions and classifier, 8.24 G with
    batchnorm, ReLU, residual adds and pooling, which is what the roofline counts.
    """
    inputs, layers = resnet(stride_on_3x3=False)
    v1 = analyze(inputs, layers, {"batch": 1, "image": 224}, training=False)
    matmul = sum(layer.flops for layer in v1.layers if layer.op in ("conv2d", "linear"))
    assert matmul == 7_715_946_496
    assert round(matmul / 1e9, 2) == 7.72
    assert matmul * 30 == 231_478_394_880  # "230 Gops for 30 fps"
    assert matmul * 30 == pytest.approx(230e9, rel=0.01)
    model = ZOO["resnet-50"]
    v15 = analyze(model.inputs, model.layers, {"batch": 1, "image": 224}, training=False)
    matmul15 = sum(layer.flops for layer in v15.layers if layer.op in ("conv2d", "linear"))
    assert matmul15 == 8_178_368_512
    request = forward_request(v15, INT8, batch=1)
    assert request.flops == v15.flops == 8_239_859_200
    assert v1.params == v15.params == 25_557_032
    # fused as TensorRT runs it: 53 convolutions (BN/ReLU/add in their epilogues), max pool,
    # average pool, classifier
    assert len(request.phases[0].kernels) == 56


def test_embedding_reads_rows_and_tied_head_reads_the_matrix() -> None:
    model = gpt2(layers=1, hidden=64, heads=4, vocab=100, positions=32)
    analysis = analyze(model.inputs, model.layers, {"batch": 2, "seq": 8}, training=False)
    kernels = {k.name: k for k in build_kernels(analysis, FP32)}
    # the token embedding gathers 2 x 8 rows of 64, not the 100 x 64 table
    assert kernels["wte"].weight_bytes == 2 * 8 * 64 * 4
    # the LM head owns no parameter (tied) but streams the whole 100 x 64 matrix
    head = kernels["lm_head"]
    assert head.weight_bytes == 100 * 64 * 4
    assert head.output_bytes == 2 * 8 * 100 * 4


def test_decode_reads_the_kv_cache() -> None:
    model = gpt2(layers=2, hidden=64, heads=4, vocab=100, positions=64)
    prefill = analyze(model.inputs, model.layers, {"batch": 3, "seq": 16}, training=False)
    step = analyze(model.inputs, model.layers, {"batch": 3, "seq": 1}, training=False)
    request = decoder_request(prefill, step, FP32, batch=3, prompt_tokens=16, generated_tokens=8)
    first, decode = request.phases
    assert (first.name, first.repeats, decode.name, decode.repeats) == ("prefill", 1, "decode", 7)
    # context = 16 + 8 // 2 = 20 cached tokens: each of the 2 attention layers reads
    # 2 (K, V) x 3 sequences x 20 tokens x 64 x 4 B and writes this step's 2 x 3 x 64 x 4 B
    kv = [k.kv_cache_bytes for k in decode.kernels if k.kv_cache_bytes]
    assert kv == [2 * 3 * 20 * 64 * 4 + 2 * 3 * 64 * 4] * 2
    # and attends to them: 4 x 3 x 20 x 64 FLOPs each beyond the one-token graph
    step_flops = sum(k.flops for k in build_kernels(step, FP32))
    assert decode.flops == step_flops + 2 * 4 * 3 * 20 * 64
    # the prefill writes the prompt's keys and values
    assert [k.kv_cache_bytes for k in first.kernels if k.kv_cache_bytes] == [
        2 * 3 * 16 * 64 * 4
    ] * 2
    # token ids in, one sampled id per sequence out
    assert (first.h2d_bytes, first.d2h_bytes, decode.h2d_bytes, decode.d2h_bytes) == (
        3 * 16 * 8,
        3 * 8,
        0,
        3 * 8,
    )
    p = predict(request, HAND_GPU, HAND_CAL)
    assert p.first_token_s == pytest.approx(1e-4 + p.phases[0].latency_s)
    assert p.per_token_s == pytest.approx(p.phases[1].latency_s)
    assert p.first_token_s is not None
    assert p.per_token_s is not None
    assert p.latency_s == pytest.approx(p.first_token_s + 7 * p.per_token_s)
    assert is_decoder(model.layers)
    assert not is_decoder(ZOO["bert-base"].layers)


A100_GEOMETRY = MigGeometry(
    gpu="a100",
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
            placements=(0, 1, 2, 3, 4, 5, 6),
        ),
        MigProfileSpec(
            name="3g.40gb",
            memory_mib=40192,
            compute_slices=3,
            memory_slices=4,
            max_instances=2,
            placements=(0, 4),
        ),
    ),
)


def test_mig_slices_get_their_share() -> None:
    gpu = replace(HAND_GPU, slug="a100")
    small, large = (mig_slice(gpu, A100_GEOMETRY, p) for p in A100_GEOMETRY.profiles)
    assert small.slug == "a100/1g.10gb"
    assert (small.compute_fraction, small.bandwidth_fraction) == (1 / 7, 1 / 8)
    assert (large.compute_fraction, large.bandwidth_fraction) == (3 / 7, 4 / 8)
    assert small.memory_bytes == 9728 * 2**20
    assert small.price_usd_per_hour == pytest.approx(3.6 / 7)
    assert small.tdp_watts == pytest.approx(100 / 7)
    assert small.host_link_bytes_per_s == gpu.host_link_bytes_per_s
    p = predict(forward_request(_mlp(2), FP32, batch=2), small, HAND_CAL)
    assert p.effective_flops_per_s == pytest.approx(1e12 / 7 * 0.5)
    assert p.effective_bandwidth_bytes_per_s == pytest.approx(1e11 / 8 * 0.5)
    assert p.phases[0].memory_s == pytest.approx(41_080 / (1e11 / 8 * 0.5))


def test_unsupported_precisions_and_links_give_reasons() -> None:
    reason = unsupported_reason(HAND_GPU, INT8)
    assert reason is not None
    assert "int8" in reason
    assert "fp32" in reason
    with pytest.raises(RooflineInputError, match="int8"):
        predict(forward_request(_mlp(1), INT8, batch=1), HAND_GPU, HAND_CAL)
    no_link = replace(HAND_GPU, host_link_bytes_per_s=None)
    assert "host-link" in (unsupported_reason(no_link, FP32) or "")
    soc = replace(no_link, kind=DeviceKind.EDGE)
    assert unsupported_reason(soc, FP32) is None  # unified memory: nothing to copy
    int4 = PRECISION_SCHEMES[Precision.INT4]
    bf16_only = replace(HAND_GPU, peak_flops_per_s={DType.BF16: 1e12})
    assert unsupported_reason(bf16_only, int4) is None  # W4A16 math at the bf16 peak


def test_pcie_bandwidth() -> None:
    assert pcie_bandwidth_bytes_per_s(3, 16) == pytest.approx(15.75e9)
    assert pcie_bandwidth_bytes_per_s(4, 16) == pytest.approx(31.5e9)
    assert pcie_bandwidth_bytes_per_s(5, 8) == pytest.approx(31.5e9)
    assert pcie_bandwidth_bytes_per_s(9, 16) is None


# The catalog's cpu.simd of each device (hardware_catalog/*.yaml), and the class its int8 math
# runs under
CPU = DeviceKind.CPU
EPYC_SIMD = "AVX-512 (executed on 256-bit datapaths) + AVX512_BF16/VNNI"
CPU_PEAKS = {DType.FP32: 7.168e12, DType.BF16: 114.7e12, DType.INT8: 229.4e12}


@pytest.mark.parametrize(
    ("slug", "kind", "simd", "expected"),
    [
        ("intel-xeon-platinum-8480plus", CPU, "AVX-512 + AMX (BF16/INT8 tiles)", "cpu_amx"),
        ("intel-xeon-platinum-8592plus", CPU, "AVX-512 + AMX", "cpu_amx"),
        ("intel-xeon-6980p", CPU, "AVX-512 + AMX (adds FP16)", "cpu_amx"),
        ("intel-xeon-platinum-8380", CPU, "AVX-512 (512-bit) + VNNI", "cpu"),
        ("intel-xeon-e5-2698-v4", CPU, "AVX2 (256-bit) + FMA3", "cpu"),
        ("amd-epyc-9654", CPU, EPYC_SIMD, "cpu"),
        ("aws-graviton3", CPU, "SVE 256-bit (2 pipes) / NEON, BF16, INT8 dot", "cpu"),
        ("a CPU without simd", CPU, None, "cpu"),
        ("apple-m2", DeviceKind.EDGE, "NEON 128-bit", "edge"),
        ("gpu", DeviceKind.GPU, None, "gpu"),
        ("tpu", DeviceKind.TPU, None, "tpu"),
    ],
)
def test_calibration_class_splits_cpus_by_amx(
    slug: str, kind: DeviceKind, simd: str | None, expected: str
) -> None:
    device = replace(HAND_GPU, slug=slug, kind=kind, simd=simd, peak_flops_per_s=CPU_PEAKS)
    assert calibration_class(device, INT8) == CalibrationClass(expected)
    assert calibration_class(device, INT8).kind is kind
    bf16 = PRECISION_SCHEMES[Precision.BF16]
    assert calibration_class(device, bf16) == CalibrationClass(expected)  # tiles run bf16 too
    # fp32 runs on the vector units (AVX-512 FMA), not the tiles: the AMX class is not its own
    assert calibration_class(device, FP32) == CalibrationClass(kind.value)


@pytest.mark.parametrize(
    ("architecture", "expected"),
    [
        ("Ampere GA100", "gpu_ampere"),
        ("Ampere GA102", "gpu_ampere"),
        ("Hopper GH100", "gpu_hopper"),
        ("Hopper GH100 + Grace (72x Neoverse V2)", "gpu_hopper"),
        ("hopper", "gpu_hopper"),  # any case
        ("NVIDIA Hopper (H100 PCIe)", "gpu_hopper"),  # any word
        ("GA100/Ampere", "gpu_ampere"),
        ("Ada Lovelace AD104", "gpu"),  # no class of its own: the pooled fit
        ("Turing TU104", "gpu"),
        ("Volta GV100", "gpu"),
        ("Blackwell GB202", "gpu"),
        ("Amperes", "gpu"),  # a word, not a prefix
        ("", "gpu"),
        (None, "gpu"),
    ],
)
def test_gpus_are_calibrated_by_architecture(architecture: str | None, expected: str) -> None:
    device = replace(HAND_GPU, architecture=architecture)
    assert calibration_class(device, INT8) == CalibrationClass(expected)
    assert calibration_class(device, FP32) == CalibrationClass(expected)  # every precision
    assert CalibrationClass(expected).kind is DeviceKind.GPU
    # an Ampere-based SoC stays edge: the Jetsons have their own fit
    soc = replace(device, kind=DeviceKind.EDGE)
    assert calibration_class(soc, INT8) is CalibrationClass.EDGE


def test_gpu_architecture_classes_are_fitted() -> None:
    """Fitted by benchmarks/calibration/calibrate.py on each architecture's ResNet-50 rows at
    the pooled GPU fit's share (pins: results.md, Derived defaults); everything else about a
    GPU is the pooled class's."""
    gpu = DEFAULT_CALIBRATIONS[CalibrationClass.GPU]
    ampere = DEFAULT_CALIBRATIONS[CalibrationClass.GPU_AMPERE]
    hopper = DEFAULT_CALIBRATIONS[CalibrationClass.GPU_HOPPER]
    assert (gpu.compute_efficiency, ampere.compute_efficiency, hopper.compute_efficiency) == (
        0.51,
        0.54,
        0.42,
    )  # pins
    for cal in (ampere, hopper):
        assert replace(cal, compute_efficiency=gpu.compute_efficiency, basis=gpu.basis) == gpu
    # a Hopper GPU is priced at Hopper's efficiency (ResNet-50 fp32 at batch 32)
    h100 = replace(HAND_GPU, architecture="Hopper GH100")
    model = ZOO["resnet-50"]
    analysis = analyze(model.inputs, model.layers, {"batch": 32, "image": 224}, training=False)
    request = forward_request(analysis, FP32, batch=32)
    pooled = predict(request, h100, gpu)
    own = predict(request, h100, DEFAULT_CALIBRATIONS[calibration_class(h100, FP32)])
    assert own.calibration is hopper
    assert own.effective_flops_per_s == pytest.approx(pooled.effective_flops_per_s * 0.42 / 0.51)
    assert own.throughput_per_s < pooled.throughput_per_s


def test_amx_cpus_have_their_own_calibration() -> None:
    """Fitted by benchmarks/calibration/calibrate.py on the AMX Xeons' ResNet-50 rows only
    (pins: results.md, Derived defaults)."""
    assert set(DEFAULT_CALIBRATIONS) == set(CalibrationClass)
    amx, cpu = (
        DEFAULT_CALIBRATIONS[CalibrationClass.CPU_AMX],
        DEFAULT_CALIBRATIONS[CalibrationClass.CPU],
    )
    assert (amx.compute_efficiency, amx.activation_cache_share) == (0.4, 0.85)  # pin
    assert (cpu.compute_efficiency, cpu.activation_cache_share) == (0.63, 0.4)  # pin
    assert amx.memory_efficiency == cpu.memory_efficiency  # assumed for every CPU


# --------------------------------------------------------------------------------------------
# Properties over the zoo
# --------------------------------------------------------------------------------------------

DEVICES = [
    HardwareSpec(  # A100-80GB-SXM-like
        slug="gpu",
        name="GPU",
        kind=DeviceKind.GPU,
        peak_flops_per_s={DType.FP32: 19.5e12, DType.BF16: 312e12, DType.INT8: 624e12},
        memory_bandwidth_bytes_per_s=2.039e12,
        memory_bytes=80 * 2**30,
        host_link_bytes_per_s=31.5e9,
        host_link_source="test",
        tdp_watts=400.0,
        price_usd_per_hour=4.1,
    ),
    HardwareSpec(  # Sapphire-Rapids-like socket
        slug="cpu",
        name="CPU",
        kind=DeviceKind.CPU,
        peak_flops_per_s={DType.FP32: 7.168e12, DType.BF16: 114.7e12, DType.INT8: 229.4e12},
        memory_bandwidth_bytes_per_s=307.2e9,
        memory_bytes=512 * 2**30,
        host_link_bytes_per_s=None,
        host_link_source="test",
        tdp_watts=350.0,
        price_usd_per_hour=None,
        simd="AVX-512 + AMX",
    ),
    HardwareSpec(  # Jetson-Orin-like SoC
        slug="soc",
        name="SoC",
        kind=DeviceKind.EDGE,
        peak_flops_per_s={DType.INT8: 137.5e12},
        memory_bandwidth_bytes_per_s=204.8e9,
        memory_bytes=64 * 2**30,
        host_link_bytes_per_s=None,
        host_link_source="test",
        tdp_watts=60.0,
        price_usd_per_hour=None,
    ),
]
DEVICES.append(mig_slice(DEVICES[0], A100_GEOMETRY, A100_GEOMETRY.profiles[0]))
BATCHES = [1, 2, 4, 8, 16, 32]
PROMPT, GENERATED = 32, 8


def _request(slug: str, batch: int, precision: Precision) -> PhasedRequest:
    model = ZOO[slug]
    scheme = PRECISION_SCHEMES[precision]
    bindings = {**model.default_bindings, "batch": batch}
    if is_decoder(model.layers):
        prefill = analyze(model.inputs, model.layers, {**bindings, "seq": PROMPT}, training=False)
        step = analyze(model.inputs, model.layers, {**bindings, "seq": 1}, training=False)
        return decoder_request(
            prefill, step, scheme, batch=batch, prompt_tokens=PROMPT, generated_tokens=GENERATED
        )
    if "seq" in bindings:
        bindings["seq"] = 128
    analysis = analyze(model.inputs, model.layers, bindings, training=False)
    return forward_request(analysis, scheme, batch=batch)


@pytest.fixture(scope="module")
def requests() -> dict[tuple[str, Precision], list[PhasedRequest]]:
    return {
        (slug, precision): [_request(slug, b, precision) for b in BATCHES]
        for slug in ZOO
        for precision in (Precision.FP32, Precision.INT8)
    }


def test_bigger_batch_never_lowers_throughput_or_latency(
    requests: dict[tuple[str, Precision], list[PhasedRequest]],
) -> None:
    checked = 0
    for (slug, precision), series in requests.items():
        for device in DEVICES:
            if unsupported_reason(device, series[0].scheme):
                continue
            cal = DEFAULT_CALIBRATIONS[calibration_class(device, series[0].scheme)]
            predictions = [predict(w, device, cal) for w in series]
            for small, big in zip(predictions, predictions[1:], strict=False):
                where = f"{slug} {precision} {device.slug} batch {small.batch}->{big.batch}"
                assert big.throughput_per_s >= small.throughput_per_s * (1 - 1e-12), where
                assert big.latency_s >= small.latency_s * (1 - 1e-12), where
                checked += 1
    assert checked >= len(ZOO) * 5 * 5


def test_a_faster_link_never_raises_latency(
    requests: dict[tuple[str, Precision], list[PhasedRequest]],
) -> None:
    gpu = DEVICES[0]
    for (slug, _), series in requests.items():
        for request in series:
            before = predict(request, gpu, DEFAULT_CALIBRATIONS[CalibrationClass.GPU])
            for factor in (2.0, 4.0):
                link = gpu.host_link_bytes_per_s or 0
                faster = replace(gpu, host_link_bytes_per_s=link * factor)
                after = predict(request, faster, DEFAULT_CALIBRATIONS[CalibrationClass.GPU])
                assert after.latency_s <= before.latency_s, slug
                assert after.throughput_per_s >= before.throughput_per_s, slug
                before = after


def test_closed_form_equals_the_per_kernel_loop(
    requests: dict[tuple[str, Precision], list[PhasedRequest]],
) -> None:
    for (slug, _), series in requests.items():
        request = series[2]
        for device in DEVICES:
            if unsupported_reason(device, request.scheme):
                continue
            cal = DEFAULT_CALIBRATIONS[calibration_class(device, request.scheme)]
            p = predict(request, device, cal)
            for phase, timing in zip(request.phases, p.phases, strict=True):
                points = kernel_points(phase, p)
                looped = sum(
                    k.flops / pt.achieved_flops_per_s
                    for k, pt in zip(phase.kernels, points, strict=True)
                    if k.flops
                )
                idle = sum(
                    k.dram_bytes(p.calibration.activation_cache_share)
                    / p.effective_bandwidth_bytes_per_s
                    + k.launches * p.calibration.kernel_launch_overhead_s
                    for k in phase.kernels
                    if not k.flops
                )
                assert looped + idle == pytest.approx(timing.kernel_s, rel=1e-9), slug
                computed = sum(1 for pt in points if pt.bound is Bound.COMPUTE)
                assert computed == timing.compute_bound_kernels, slug


def _all_flops(analysis: GraphAnalysis) -> int:
    return sum(layer.flops for layer in analysis.layers)


@pytest.mark.parametrize("slug", ["resnet-50", "bert-base", "vit-b-16", "lstm-classifier"])
def test_forward_flops_are_the_analysis_flops(slug: str) -> None:
    model = ZOO[slug]
    bindings: dict[str, Any] = {**model.default_bindings, "batch": 4}
    analysis = analyze(model.inputs, model.layers, bindings, training=False)
    for precision in Precision:
        request = forward_request(analysis, PRECISION_SCHEMES[precision], batch=4)
        assert request.flops == _all_flops(analysis)


def _moe_layer(tokens: int) -> Any:
    """A top-2-of-8 MoE layer (hidden 64, intermediate 128, SwiGLU) run on ``tokens`` tokens."""
    inputs = (InputDecl(name="x", shape=("batch", 1, 64)),)
    layers = [
        {"name": "moe", "op": "moe", "num_experts": 8, "experts_per_token": 2,
         "intermediate_size": 128},
    ]  # fmt: skip
    analysis = analyze(inputs, layers, {"batch": tokens}, training=False)
    return analysis.layers[0]


def test_moe_reads_only_the_experts_its_tokens_are_routed_to() -> None:
    router, per_expert = 8 * 64, 3 * 64 * 128
    one = _moe_layer(1)
    assert one.params == router + 8 * per_expert
    # One token (decode at batch 1) reads its 2 experts, not 8.
    assert expected_experts_read(8, 2, 1) == 2
    assert moe_weight_elements(one) == router + 2 * per_expert
    # Four tokens: 8 * (1 - (3/4)^4) = 5.46875 experts on average (uniform routing).
    assert moe_weight_elements(_moe_layer(4)) == router + math.ceil(5.46875 * per_expert)
    # A prefill's worth of tokens reads every expert (to within rounding).
    assert moe_weight_elements(_moe_layer(512)) == router + 8 * per_expert
    reads = [moe_weight_elements(_moe_layer(t)) for t in (1, 2, 4, 8, 16, 64)]
    assert reads == sorted(reads)
    # FLOPs stay top-k per token.
    assert _moe_layer(4).flops == 4 * _moe_layer(1).flops


# --------------------------------------------------------------------------------------------
# Mixture of experts in a decoder: bytes per phase
# --------------------------------------------------------------------------------------------

BF16 = PRECISION_SCHEMES[Precision.BF16]
MOE_ROUTER, MOE_EXPERT = 8 * 64, 3 * 64 * 128  # elements: router 8 x 64, one SwiGLU expert


def _moe_decoder(batch: int, prompt: int = 16, generated: int = 8) -> PhasedRequest:
    """A one-block Mixtral-like decoder (top-2 of 8 experts) at bf16."""
    inputs, layers = llama_graph(
        layers=1, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=100, experts=8
    )
    prefill = analyze(inputs, layers, {"batch": batch, "seq": prompt}, training=False)
    step = analyze(inputs, layers, {"batch": batch, "seq": 1}, training=False)
    return decoder_request(
        prefill, step, BF16, batch=batch, prompt_tokens=prompt, generated_tokens=generated
    )


def _moe_kernel(request: PhasedRequest, phase: int) -> Kernel:
    (kernel,) = (k for k in request.phases[phase].kernels if "moe" in k.ops)
    return kernel


def test_moe_decode_reads_k_experts_and_a_prefill_reads_all() -> None:
    one = _moe_decoder(1)
    # decode at batch 1: one token routed top-2 reads the router and 2 experts, at 2 B each
    assert _moe_kernel(one, 1).weight_bytes == (MOE_ROUTER + 2 * MOE_EXPERT) * 2 == 99_328
    # its prefill routes 16 tokens: 8 x (1 - 0.75^16) = 7.9198 experts, rounded up in elements
    assert _moe_kernel(one, 0).weight_bytes == (MOE_ROUTER + 194_638) * 2 == 390_300
    assert 8 * (1 - 0.75**16) * MOE_EXPERT == pytest.approx(194_637.48, abs=0.01)
    # decode at batch 4: 8 x (1 - 0.75^4) = 5.46875 experts = 134,400 elements exactly
    assert _moe_kernel(_moe_decoder(4), 1).weight_bytes == (MOE_ROUTER + 134_400) * 2 == 269_824
    # decode at batch 64 reads every expert (to within the rounding up)
    every = (MOE_ROUTER + 8 * MOE_EXPERT) * 2
    assert _moe_kernel(_moe_decoder(64), 1).weight_bytes == every == 394_240
    # monotone in the tokens routed per step, never beyond every expert
    reads = [_moe_kernel(_moe_decoder(b), 1).weight_bytes for b in (1, 2, 3, 4, 8, 16, 64)]
    assert reads == sorted(reads)
    assert len(set(reads)) == len(reads)  # strictly more with every token added here
    assert reads[-1] == every
    # FLOPs stay top-k per token: 4 tokens cost 4 x one token's
    assert _moe_kernel(_moe_decoder(4), 1).flops == 4 * _moe_kernel(one, 1).flops
    # the request says so, per phase
    assert (
        "decode: a mixture-of-experts layer reads the router and 2 of 8 experts = "
        "8 x (1 - (1 - 2/8)^1) for 1 token(s) routed top-2 (uniform routing); FLOPs count 2 "
        "experts per token"
    ) in one.assumptions


def test_moe_decode_is_faster_than_reading_every_expert() -> None:
    """Memory-bound decode at batch 1: the step time falls by the 6 unread experts' bytes."""
    request = _moe_decoder(1)
    gpu = replace(HAND_GPU, peak_flops_per_s={DType.BF16: 1e12})
    decode = predict(request, gpu, HAND_CAL).phases[1]
    assert decode.compute_bound_kernels == 0  # precondition: every kernel is memory-bound
    moe = _moe_kernel(request, 1)
    every = replace(moe, weight_bytes=(MOE_ROUTER + 8 * MOE_EXPERT) * 2)
    phase = request.phases[1]
    kernels = tuple(every if k is moe else k for k in phase.kernels)
    reading_all = replace(request, phases=(request.phases[0], replace(phase, kernels=kernels)))
    slower = predict(reading_all, gpu, HAND_CAL).phases[1]
    # BW_eff = 1e11 x 0.5: 6 experts x 24,576 elements x 2 B more per step
    assert slower.memory_s - decode.memory_s == pytest.approx(6 * MOE_EXPERT * 2 / 5e10)


# --------------------------------------------------------------------------------------------
# The one precision table in the roofline
# --------------------------------------------------------------------------------------------

# precision: (bytes per weight, per activation, per KV element, peaks, quantization named)
PRECISION_BYTES: dict[Precision, tuple[float, int, int, tuple[DType, ...], str]] = {
    Precision.FP32: (4, 4, 4, (DType.FP32,), "not quantized"),
    Precision.TF32: (4, 4, 4, (DType.TF32,), "not quantized"),
    Precision.BF16: (2, 2, 2, (DType.BF16,), "not quantized"),
    Precision.FP16: (2, 2, 2, (DType.FP16,), "not quantized"),
    Precision.AMP_BF16: (4, 2, 2, (DType.BF16,), "autocast at inference"),
    Precision.AMP_FP16: (4, 2, 2, (DType.FP16,), "autocast at inference"),
    Precision.MIXED_BF16: (2, 2, 2, (DType.BF16,), "master copy is training state"),
    Precision.MIXED_FP16: (2, 2, 2, (DType.FP16,), "master copy is training state"),
    Precision.FP8: (1, 1, 1, (DType.FP8,), "W8A8"),
    Precision.INT8: (1, 1, 1, (DType.INT8,), "W8A8"),
    Precision.INT8_WEIGHT_ONLY: (1, 2, 2, (DType.FP16, DType.BF16), "weight-only W8A16"),
    Precision.INT4: (0.5, 2, 2, (DType.FP16, DType.BF16), "weight-only W4A16"),
    Precision.FP4: (0.5, 2, 1, (DType.FP4,), "W4A4"),
}


def test_every_precision_has_golden_bytes() -> None:
    assert set(PRECISION_BYTES) == set(Precision) == set(PRECISION_SCHEMES)


@pytest.mark.parametrize("precision", list(Precision))
def test_bytes_per_weight_and_activation_follow_the_precision_table(precision: Precision) -> None:
    weight, act, kv, peaks, named = PRECISION_BYTES[precision]
    scheme = PRECISION_SCHEMES[precision]
    assert (float(scheme.weight_bytes), scheme.activation_bytes, scheme.kv_cache_bytes) == (
        weight,
        act,
        kv,
    )
    assert scheme.compute_dtypes == peaks
    assert named in scheme.assumption
    assert scheme.assumption.startswith(f"{precision.value}: ")
    fc1, fc2 = build_kernels(_mlp(2), scheme)
    # fc1 (+relu): (64 x 128 + 128) weights, 2 x 64 in, 2 x 128 out; fc2: 1,290 weights
    assert fc1.weight_bytes == math.ceil(8_320 * weight)
    assert (fc1.input_bytes, fc1.output_bytes) == (2 * 64 * act, 2 * 128 * act)
    assert fc2.weight_bytes == math.ceil(1_290 * weight)
    request = forward_request(_mlp(2), scheme, batch=2)
    assert request.assumptions[0] == scheme.assumption


def test_weight_only_runs_at_16_bit_peak_and_w8a8_at_8_bit() -> None:
    both = replace(HAND_GPU, peak_flops_per_s={DType.FP16: 2e12, DType.INT8: 4e12})
    int8, wo = INT8, PRECISION_SCHEMES[Precision.INT8_WEIGHT_ONLY]
    assert predict(forward_request(_mlp(1), int8, batch=1), both, HAND_CAL).compute_dtype is (
        DType.INT8
    )
    assert predict(forward_request(_mlp(1), wo, batch=1), both, HAND_CAL).compute_dtype is (
        DType.FP16
    )


def test_kv_cache_traffic_uses_the_kv_cache_dtype() -> None:
    model = gpt2(layers=2, hidden=64, heads=4, vocab=100, positions=64)
    prefill = analyze(model.inputs, model.layers, {"batch": 3, "seq": 16}, training=False)
    step = analyze(model.inputs, model.layers, {"batch": 3, "seq": 1}, training=False)
    fp8_cache = replace(BF16, kv_cache_bytes=1)  # a bf16 model with an 8-bit KV cache
    decode16, decode8 = (
        decoder_request(prefill, step, s, batch=3, prompt_tokens=16, generated_tokens=8).phases[1]
        for s in (BF16, fp8_cache)
    )
    kv16 = [k.kv_cache_bytes for k in decode16.kernels if k.kv_cache_bytes]
    kv8 = [k.kv_cache_bytes for k in decode8.kernels if k.kv_cache_bytes]
    # 2 (K, V) x 3 sequences x (20 cached + 1 new) tokens x 64, at 2 B then 1 B
    assert kv16 == [2 * 3 * 21 * 64 * 2] * 2
    assert kv8 == [2 * 3 * 21 * 64 * 1] * 2
    same = [(k.input_bytes, k.output_bytes, k.weight_bytes) for k in decode16.kernels]
    assert same == [(k.input_bytes, k.output_bytes, k.weight_bytes) for k in decode8.kernels]


# --------------------------------------------------------------------------------------------
# Attention implementation
# --------------------------------------------------------------------------------------------


def _gpt2_attention(attention: Attention | None, seq: int) -> GraphAnalysis:
    model = gpt2(layers=1, hidden=64, heads=4, vocab=100, positions=64)
    return analyze(
        model.inputs,
        model.layers,
        {"batch": 2, "seq": seq},
        training=False,
        attention=attention,
        precision=Precision.BF16,
    )


def _gpt2_decoder(attention: Attention | None) -> PhasedRequest:
    """Batch 2, 16 prompt tokens, 8 generated (decode at the mean context 16 + 4 = 20)."""
    prefill, step = _gpt2_attention(attention, 16), _gpt2_attention(attention, 1)
    return decoder_request(prefill, step, BF16, batch=2, prompt_tokens=16, generated_tokens=8)


def test_unfused_attention_moves_the_scores_and_fused_does_not() -> None:
    eager, flash, default = (_gpt2_decoder(a) for a in (Attention.EAGER, Attention.FLASH, None))
    assert eager.attention == ((Attention.EAGER, "requested"),)
    assert flash.attention == ((Attention.FLASH, "requested"),)
    (default_impl,) = default.attention  # CUDA bf16: SDPA's flash
    assert default_impl[0] is Attention.FLASH
    for request in (flash, default):
        assert all(k.intermediate_bytes == 0 for p in request.phases for k in p.kernels)
    (prefill_attn,) = (k for k in eager.phases[0].kernels if "attention" in k.ops)
    (decode_attn,) = (k for k in eager.phases[1].kernels if "attention" in k.ops)
    # prefill: fp32 scores and probabilities of 2 x 4 heads x 16 x 16, each written + read
    assert prefill_attn.intermediate_bytes == 2 * (2 * 4 * 16 * 16) * 2 * 4 == 32_768
    # decode: 1 query x (20 cached + 1) keys per head and sequence
    assert decode_attn.intermediate_bytes == 2 * (2 * 4 * 1 * 21) * 2 * 4 == 2_688
    # everything else is the same kernel
    for e_phase, f_phase in zip(eager.phases, flash.phases, strict=True):
        for e, f in zip(e_phase.kernels, f_phase.kernels, strict=True):
            assert replace(e, intermediate_bytes=0) == f
        assert e_phase.bytes_moved - f_phase.bytes_moved == sum(
            k.intermediate_bytes for k in e_phase.kernels
        )
    assert prefill_attn.dram_bytes(0.5) == pytest.approx(
        prefill_attn.weight_bytes
        + prefill_attn.kv_cache_bytes
        + 0.5 * (prefill_attn.input_bytes + prefill_attn.output_bytes + 32_768)
    )
    assert any("eager (requested): unfused" in a for a in eager.assumptions)
    assert any("flash (requested): fused" in a for a in flash.assumptions)
    gpu = replace(HAND_GPU, peak_flops_per_s={DType.BF16: 1e12})
    slow, fast = (predict(r, gpu, HAND_CAL) for r in (eager, flash))
    assert slow.attention == eager.attention
    assert slow.latency_s > fast.latency_s


def test_tensor_parallel_shards_the_kernels_and_adds_two_all_reduces_per_layer() -> None:
    """Megatron-style split over t GPUs: FLOPs, weights, KV cache / t per kernel; two ring
    all-reduces of the hidden state per attention layer; activations stay whole."""
    whole = _request("llama-2-7b", 4, Precision.FP16)
    half = shard(whole, 2)
    assert half.tensor_parallel == 2
    assert any("tensor parallel across 2 GPUs" in a for a in half.assumptions)
    for phase, share in zip(whole.phases, half.phases, strict=True):
        layers = sum(1 for k in phase.kernels if "attention" in k.ops)
        assert layers == 32
        assert share.allreduces == 2 * layers
        hidden = sum(k.output_bytes for k in phase.kernels if "attention" in k.ops)
        assert share.allreduce_bytes == 2 * hidden
        for k, h in zip(phase.kernels, share.kernels, strict=True):
            assert h.flops == -(-k.flops // 2)
            assert h.weight_bytes == -(-k.weight_bytes // 2)
            assert h.kv_cache_bytes == -(-k.kv_cache_bytes // 2)
            assert (h.input_bytes, h.output_bytes) == (k.input_bytes, k.output_bytes)
    with pytest.raises(RooflineInputError, match="no attention layer"):
        shard(forward_request(_mlp(2), FP32, batch=2), 2)
    with pytest.raises(RooflineInputError, match=">= 2 GPUs"):
        shard(whole, 1)


def test_a_request_is_timed_alike_whether_its_kernels_are_built_or_not() -> None:
    """A request at a precision and its tensor-parallel shares build their kernels when they
    are read: totals, kernel groups and timing are those of the same kernels built one by one
    and grouped kernel by kernel."""
    gpu = replace(HAND_GPU, peak_flops_per_s={DType.FP16: 1e14}, sm_count=108)
    for degree in (1, 2, 8):
        whole = _request("llama-2-7b", 4, Precision.FP16)
        lazy = whole if degree == 1 else shard(whole, degree)
        timed = predict(lazy, gpu, HAND_CAL)  # before all of its kernels are built
        built = replace(
            lazy,
            phases=tuple(
                Phase(
                    name=p.name,
                    kernels=tuple(p.kernels),
                    h2d_bytes=p.h2d_bytes,
                    d2h_bytes=p.d2h_bytes,
                    repeats=p.repeats,
                    allreduces=p.allreduces,
                    allreduce_bytes=p.allreduce_bytes,
                )
                for p in lazy.phases
            ),
        )
        assert timed == predict(built, gpu, HAND_CAL)
        for a, b in zip(lazy.phases, built.phases, strict=True):
            assert (a.flops, a.bytes_moved, a.launches) == (b.flops, b.bytes_moved, b.launches)
            assert a.kernels == b.kernels
            assert b.kernels == a.kernels
            assert a == b
            assert len(a.kernels) == len(b.kernels)
            assert (a.kernels[-1], a.kernels[1:3]) == (b.kernels[-1], b.kernels[1:3])
    fresh = shard(_request("llama-2-7b", 2, Precision.INT8), 4).phases[1].kernels
    assert fresh[-1] == tuple(fresh)[-1]  # one kernel read before the others
    with pytest.raises(IndexError):
        fresh[len(fresh)]


def test_all_reduces_cross_the_gpu_link_else_the_host_link() -> None:
    """t_ar = n x 10 us + 2 (t - 1) / t x bytes / (link x host-link efficiency)."""
    nvlink = replace(HAND_GPU, gpu_link_bytes_per_s=4e10)
    ring = AllReduce.between(nvlink, 4, HAND_CAL)
    assert ring.link_bytes_per_s == 4e10 * 0.5
    assert "GPU link" in ring.source
    assert ring.seconds(10, 2_000_000) == pytest.approx(10 * 10e-6 + 1.5 * 2e6 / 2e10)
    pcie = AllReduce.between(HAND_GPU, 4, HAND_CAL)
    assert pcie.link_bytes_per_s == 1e10 * 0.5
    assert "host link" in pcie.source
    whole = _request("llama-2-7b", 1, Precision.FP32)
    device = replace(nvlink, peak_flops_per_s={DType.FP32: 1e15}, memory_bytes=2**40)
    one = predict(whole, device, HAND_CAL)
    four = predict(shard(whole, 4), device, HAND_CAL)
    decode = four.phases[-1]
    assert decode.allreduce_s == pytest.approx(
        ring.seconds(decode.allreduces, decode.allreduce_bytes)
    )
    assert four.tensor_parallel == 4
    assert four.per_token_s is not None
    assert one.per_token_s is not None
    assert four.per_token_s < one.per_token_s  # a quarter of the weights per GPU
    assert four.time_split_s[Bound.TRANSFER] >= decode.allreduce_s * decode.repeats
