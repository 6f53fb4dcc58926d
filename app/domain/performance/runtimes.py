"""Serving runtimes: how the framework that runs a model changes the roofline (pure).

The shipped calibration (:data:`app.domain.performance.roofline.DEFAULT_CALIBRATIONS`) is
fitted on MLPerf results: an engine that fuses element-wise layers into the kernel before them
and launches little (TensorRT, the default here). A framework runs the same model with other
kernels and another host path: PyTorch eager launches one kernel per layer through Python,
``torch.compile`` fuses but keeps the framework's call path, TensorFlow without XLA runs op by
op. Each :class:`RuntimeProfile` says whether element-wise layers fuse, scales the calibrated
compute efficiency, and replaces the per-kernel launch overhead; the constants are fitted by
``benchmarks/calibration/runtimes.py`` on published same-model, same-device measurements
(``benchmarks/calibration/framework_measurements.yaml``, sources per row), and its report
gives each profile's error in sample and leaving each device out.

The profiles apply to accelerators (GPU, Jetson, TPU); CPUs keep their calibration (the
measurements are GPU runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from app.domain.hardware import DeviceKind
from app.domain.performance.roofline import Calibration

PROFILED_KINDS = frozenset({DeviceKind.GPU, DeviceKind.EDGE, DeviceKind.TPU})


class ServingRuntime(StrEnum):
    """The framework or engine that serves the model."""

    TENSORRT = "tensorrt"  # the calibration's own: MLPerf-grade engines
    TORCH_COMPILE = "torch_compile"
    PYTORCH_EAGER = "pytorch_eager"
    TENSORFLOW = "tensorflow"


DEFAULT_RUNTIME = ServingRuntime.TENSORRT


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeProfile:
    """What a runtime changes in an accelerator's calibration, and where it comes from."""

    runtime: ServingRuntime
    fuse_elementwise: bool  # element-wise layers run inside the kernel before them
    compute_efficiency_scale: float  # x the calibrated compute efficiency
    kernel_launch_overhead_s: float | None  # per kernel; None: the calibration's
    basis: str

    def apply(self, calibration: Calibration, kind: DeviceKind) -> Calibration:
        """The calibration of a device of ``kind`` served by this runtime."""
        if kind not in PROFILED_KINDS or self.runtime is DEFAULT_RUNTIME:
            return calibration
        launch = self.kernel_launch_overhead_s
        return replace(
            calibration,
            compute_efficiency=min(
                1.0, calibration.compute_efficiency * self.compute_efficiency_scale
            ),
            kernel_launch_overhead_s=(
                calibration.kernel_launch_overhead_s if launch is None else launch
            ),
            basis=f"{calibration.basis}; served by {self.runtime.value}: {self.basis}",
        )


_FIT = (
    "fitted (grids of 0.05 and the launch ladder, least squares on log predicted/measured) by "
    "benchmarks/calibration/runtimes.py on framework_measurements.yaml"
)
RUNTIME_PROFILES: Mapping[ServingRuntime, RuntimeProfile] = {
    ServingRuntime.TENSORRT: RuntimeProfile(
        runtime=ServingRuntime.TENSORRT,
        fuse_elementwise=True,
        compute_efficiency_scale=1.0,
        kernel_launch_overhead_s=None,
        basis="the calibration as fitted on MLPerf results (TensorRT and comparable engines)",
    ),
    ServingRuntime.TORCH_COMPILE: RuntimeProfile(
        runtime=ServingRuntime.TORCH_COMPILE,
        fuse_elementwise=True,
        compute_efficiency_scale=1.85,
        kernel_launch_overhead_s=60e-6,
        basis=f"{_FIT}: 6 Hugging Face rows (ResNet-50, ViT-B/16; A100, T4, V100), leaving "
        "one device out 4 of 6 within 1.5x, 6 of 6 within 2x",
    ),
    ServingRuntime.PYTORCH_EAGER: RuntimeProfile(
        runtime=ServingRuntime.PYTORCH_EAGER,
        fuse_elementwise=False,
        compute_efficiency_scale=0.95,
        kernel_launch_overhead_s=50e-6,
        basis=f"{_FIT}: 20 rows (DeepLearningExamples and Hugging Face ResNet-50, ViT-B/16, "
        "BERT-large, RoBERTa-base, MiniLM; T4, V100, A100), leaving one device out 8 of 20 "
        "within 1.5x, 17 of 20 within 2x: eager serving stacks differ more than engines do",
    ),
    ServingRuntime.TENSORFLOW: RuntimeProfile(
        runtime=ServingRuntime.TENSORFLOW,
        fuse_elementwise=False,
        compute_efficiency_scale=0.3,
        kernel_launch_overhead_s=20e-6,
        basis=f"{_FIT}: 10 DeepLearningExamples TF1/TF2 rows (ResNet-50, BERT-base and -large; "
        "A100, T4), leaving one device out 10 of 10 within 1.5x",
    ),
}
