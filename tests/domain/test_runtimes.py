"""Serving-runtime profiles: what each changes in a calibration (golden values)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.domain.graph.analysis import analyze
from app.domain.hardware import DeviceKind
from app.domain.performance.calibration import DEFAULT_CALIBRATIONS, CalibrationClass
from app.domain.performance.phases import decoder_request, forward_request
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.roofline import predict
from app.domain.performance.runtimes import (
    DEFAULT_RUNTIME,
    RUNTIME_PROFILES,
    ServingRuntime,
    with_decode_host_overhead,
)
from app.domain.precision import Precision
from app.domain.zoo import gpt2
from tests.domain.test_roofline import HAND_CAL, HAND_GPU, _mlp


def test_the_default_is_the_calibration_itself() -> None:
    assert DEFAULT_RUNTIME is ServingRuntime.TENSORRT
    profile = RUNTIME_PROFILES[DEFAULT_RUNTIME]
    assert profile.fuse_elementwise
    for cls, calibration in DEFAULT_CALIBRATIONS.items():
        assert profile.apply(calibration, cls.kind) is calibration


def test_eager_pytorch_on_a_gpu() -> None:
    gpu = DEFAULT_CALIBRATIONS[CalibrationClass.GPU]
    eager = RUNTIME_PROFILES[ServingRuntime.PYTORCH_EAGER]
    applied = eager.apply(gpu, DeviceKind.GPU)
    assert not eager.fuse_elementwise
    assert applied.compute_efficiency == pytest.approx(0.51 * 0.7)
    assert applied.host_dispatch_s == pytest.approx(50e-6)
    assert applied.kernel_launch_overhead_s == gpu.kernel_launch_overhead_s  # the GPU's own
    assert applied.memory_efficiency == gpu.memory_efficiency
    assert applied.request_overhead_s == gpu.request_overhead_s
    assert "served by pytorch_eager" in applied.basis


def test_torch_compile_and_tensorflow() -> None:
    gpu = DEFAULT_CALIBRATIONS[CalibrationClass.GPU]
    compiled = RUNTIME_PROFILES[ServingRuntime.TORCH_COMPILE].apply(gpu, DeviceKind.GPU)
    assert compiled.compute_efficiency == pytest.approx(0.51 * 1.6)
    assert compiled.host_dispatch_s == pytest.approx(80e-6)
    tf = RUNTIME_PROFILES[ServingRuntime.TENSORFLOW].apply(gpu, DeviceKind.GPU)
    assert tf.compute_efficiency == pytest.approx(0.51 * 0.2)
    assert tf.host_dispatch_s == pytest.approx(30e-6)
    for applied in (compiled, tf):
        assert applied.kernel_launch_overhead_s == gpu.kernel_launch_overhead_s
    assert not RUNTIME_PROFILES[ServingRuntime.TENSORFLOW].fuse_elementwise


def test_onnxruntime_on_the_hand_gpu() -> None:
    """Golden: the hand MLP (64 -> 128 relu -> 10) at batch 2 in fp32 on the hand GPU, served by
    ONNX Runtime's CUDA provider: fused, so 2 kernels as under TensorRT; both memory-bound
    (< 1 FLOP/B against a ridge of 1e12 x 0.5 x 0.65 / 5e10 = 6.5 FLOP/B), so memory 8.216e-7 s
    and launches 2 x 10 us as before: 2.08216e-5 s of device time, shorter than the host's
    2 x 12 us = 2.4e-5 s of dispatch, so the device waits 3.1784e-6 s for it; copies
    1.024e-7 + 1.6e-8 s; request 1e-4 s: latency 1.241184e-4 s (TensorRT: 1.209400e-4 s). At
    batch 4,096 fc1 is compute-bound (67.6 MFLOP over 3.18 MB, 21 FLOP/B) and takes 1 / 0.65
    of its TensorRT compute time; the kernels outlast the dispatch, so nothing waits."""
    ort = RUNTIME_PROFILES[ServingRuntime.ONNXRUNTIME]
    assert ort.fuse_elementwise
    calibration = ort.apply(HAND_CAL, DeviceKind.GPU)
    assert calibration.compute_efficiency == pytest.approx(0.325)
    assert calibration.kernel_launch_overhead_s == HAND_CAL.kernel_launch_overhead_s
    assert calibration.host_dispatch_s == pytest.approx(12e-6)
    assert calibration.basis.startswith("test; served by onnxruntime: fitted")
    fp32 = PRECISION_SCHEMES[Precision.FP32]
    request = forward_request(_mlp(2), fp32, batch=2, fuse_elementwise=ort.fuse_elementwise)
    served = predict(request, HAND_GPU, calibration)
    engine = predict(request, HAND_GPU, HAND_CAL)
    (phase,) = served.phases
    assert phase.compute_s == 0
    assert phase.memory_s == pytest.approx(8.216e-7)
    assert phase.launch_s == pytest.approx(2e-5)
    assert phase.host_wait_s == pytest.approx(3.1784e-6)
    assert phase.kernel_s == pytest.approx(2.4e-5)
    assert served.latency_s == pytest.approx(1.241184e-4)
    assert engine.latency_s == pytest.approx(1.209400e-4)
    assert engine.phases[0].host_wait_s == 0
    big = forward_request(_mlp(4096), fp32, batch=4096, fuse_elementwise=True)
    slow, fast = predict(big, HAND_GPU, calibration), predict(big, HAND_GPU, HAND_CAL)
    assert slow.phases[0].compute_s == pytest.approx(fast.phases[0].compute_s / 0.65)
    assert slow.phases[0].compute_s > 0
    assert slow.phases[0].host_wait_s == 0


def test_cpus_keep_their_calibration_but_under_eager_pytorch() -> None:
    for cls in (CalibrationClass.CPU, CalibrationClass.CPU_AMX):
        cpu = DEFAULT_CALIBRATIONS[cls]
        for runtime, profile in RUNTIME_PROFILES.items():
            if runtime is ServingRuntime.PYTORCH_EAGER:
                continue
            assert profile.cpu_compute_efficiency_scale is None
            assert profile.apply(cpu, cls.kind) is cpu


def test_eager_pytorch_on_a_cpu() -> None:
    """Golden: x 0.7 on both CPU classes (0.63 -> 0.441, AMX 0.40 -> 0.28); nothing else
    moves (the CPU launch and request overheads are the calibration's)."""
    eager = RUNTIME_PROFILES[ServingRuntime.PYTORCH_EAGER]
    assert eager.cpu_compute_efficiency_scale == 0.7
    for cls, expected in ((CalibrationClass.CPU, 0.441), (CalibrationClass.CPU_AMX, 0.28)):
        cpu = DEFAULT_CALIBRATIONS[cls]
        applied = eager.apply(cpu, DeviceKind.CPU)
        assert applied.compute_efficiency == pytest.approx(expected)
        assert applied.kernel_launch_overhead_s == cpu.kernel_launch_overhead_s
        assert applied.host_dispatch_s == cpu.host_dispatch_s == 0.0
        assert applied.request_overhead_s == cpu.request_overhead_s
        assert applied.memory_efficiency == cpu.memory_efficiency
        assert applied.activation_cache_share == cpu.activation_cache_share
        assert "served by pytorch_eager on a CPU" in applied.basis
    high = eager.apply(
        replace(DEFAULT_CALIBRATIONS[CalibrationClass.CPU], compute_efficiency=1.0), DeviceKind.CPU
    )
    assert high.compute_efficiency == pytest.approx(0.7)


def test_efficiency_stays_physical() -> None:
    edge = DEFAULT_CALIBRATIONS[CalibrationClass.EDGE]
    compiled = RUNTIME_PROFILES[ServingRuntime.TORCH_COMPILE]
    high = compiled.apply(replace(edge, compute_efficiency=0.9), DeviceKind.EDGE)
    assert high.compute_efficiency == 1.0  # 0.9 x 1.6 clamped: no more than the peak


def test_every_runtime_has_a_profile() -> None:
    assert set(RUNTIME_PROFILES) == set(ServingRuntime)
    for runtime, profile in RUNTIME_PROFILES.items():
        assert profile.runtime is runtime
        assert profile.basis


def test_vllm_scales_compute_and_adds_host_time_per_sequence_step() -> None:
    """Golden: a 2-layer GPT-2 decoder, batch 3, 16 prompt + 8 generated tokens on the hand
    GPU: one prefill and 7 decode steps, each paying 70 us x 3 sequences = 210 us of host work
    serially, so the latency and the interval grow by 8 x 210 us = 1.68 ms and each decode
    step (the per-token time) by 210 us; the compute efficiency is 0.5 x 0.7."""
    vllm = RUNTIME_PROFILES[ServingRuntime.VLLM]
    assert vllm.compute_efficiency_scale == pytest.approx(0.7)
    assert vllm.host_overhead_per_sequence_step_s == pytest.approx(70e-6)
    calibration = vllm.apply(HAND_CAL, DeviceKind.GPU)
    assert calibration.compute_efficiency == pytest.approx(0.35)
    model = gpt2(layers=2, hidden=64, heads=4, vocab=100, positions=64)
    prefill = analyze(model.inputs, model.layers, {"batch": 3, "seq": 16}, training=False)
    step = analyze(model.inputs, model.layers, {"batch": 3, "seq": 1}, training=False)
    fp32 = PRECISION_SCHEMES[Precision.FP32]
    request = decoder_request(prefill, step, fp32, batch=3, prompt_tokens=16, generated_tokens=8)
    base = predict(request, HAND_GPU, calibration)
    served = with_decode_host_overhead(base, vllm.host_overhead_per_sequence_step_s)
    assert served.latency_s - base.latency_s == pytest.approx(8 * 3 * 70e-6)
    assert served.interval_s - base.interval_s == pytest.approx(1.68e-3)
    assert base.per_token_s is not None
    assert served.per_token_s is not None
    assert served.per_token_s - base.per_token_s == pytest.approx(210e-6)
    assert base.first_token_s is not None
    assert served.first_token_s is not None
    assert served.first_token_s - base.first_token_s == pytest.approx(210e-6)
    assert served.request_overhead_s == pytest.approx(HAND_CAL.request_overhead_s + 1.68e-3)
    assert served.assumptions[-1] == (
        "serving engine host work between steps: 70 us per sequence x 3 sequences x 8 steps = "
        "1.68 ms per request, serial with the GPU (added to latency, interval, first token and "
        "every token)"
    )
    # an encoder (no first token) and a zero host term come back unchanged
    assert with_decode_host_overhead(base, 0.0) is base
    # and a CPU, which keeps its calibration under every runtime
    cpu = replace(HAND_GPU, kind=DeviceKind.CPU, cpu_cores=8)
    on_cpu = predict(request, cpu, HAND_CAL)
    assert with_decode_host_overhead(on_cpu, 70e-6) is on_cpu
