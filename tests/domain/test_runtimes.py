"""Serving-runtime profiles: what each changes in a calibration (golden values)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.domain.hardware import DeviceKind
from app.domain.performance.roofline import DEFAULT_CALIBRATIONS, CalibrationClass
from app.domain.performance.runtimes import (
    DEFAULT_RUNTIME,
    RUNTIME_PROFILES,
    ServingRuntime,
)


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
    assert applied.compute_efficiency == pytest.approx(0.51 * 0.95)
    assert applied.kernel_launch_overhead_s == pytest.approx(50e-6)
    assert applied.memory_efficiency == gpu.memory_efficiency
    assert applied.request_overhead_s == gpu.request_overhead_s
    assert "served by pytorch_eager" in applied.basis


def test_torch_compile_and_tensorflow() -> None:
    gpu = DEFAULT_CALIBRATIONS[CalibrationClass.GPU]
    compiled = RUNTIME_PROFILES[ServingRuntime.TORCH_COMPILE].apply(gpu, DeviceKind.GPU)
    assert compiled.compute_efficiency == pytest.approx(min(1.0, 0.51 * 1.85))
    assert compiled.kernel_launch_overhead_s == pytest.approx(60e-6)
    tf = RUNTIME_PROFILES[ServingRuntime.TENSORFLOW].apply(gpu, DeviceKind.GPU)
    assert tf.compute_efficiency == pytest.approx(0.51 * 0.3)
    assert tf.kernel_launch_overhead_s == pytest.approx(20e-6)
    assert not RUNTIME_PROFILES[ServingRuntime.TENSORFLOW].fuse_elementwise


def test_cpus_keep_their_calibration_and_efficiency_stays_physical() -> None:
    for cls in (CalibrationClass.CPU, CalibrationClass.CPU_AMX):
        cpu = DEFAULT_CALIBRATIONS[cls]
        for profile in RUNTIME_PROFILES.values():
            assert profile.apply(cpu, cls.kind) is cpu
    edge = DEFAULT_CALIBRATIONS[CalibrationClass.EDGE]
    compiled = RUNTIME_PROFILES[ServingRuntime.TORCH_COMPILE]
    high = compiled.apply(replace(edge, compute_efficiency=0.9), DeviceKind.EDGE)
    assert high.compute_efficiency == 1.0  # 0.9 x 2.0 clamped: no more than the peak


def test_every_runtime_has_a_profile() -> None:
    assert set(RUNTIME_PROFILES) == set(ServingRuntime)
    for runtime, profile in RUNTIME_PROFILES.items():
        assert profile.runtime is runtime
        assert profile.basis
