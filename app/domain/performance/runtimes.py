"""Serving runtimes: how the framework that runs a model changes the roofline (pure).

The shipped calibration (:data:`app.domain.performance.calibration.DEFAULT_CALIBRATIONS`) is
fitted on MLPerf results: an engine that fuses element-wise layers into the kernel before them
and launches little (TensorRT, the default here). A framework runs the same model with other
kernels and another host path: PyTorch eager launches one kernel per layer through Python,
``torch.compile`` fuses but keeps the framework's call path, TensorFlow without XLA runs op by
op. Each :class:`RuntimeProfile` says whether element-wise layers fuse, scales the calibrated
compute efficiency, and sets the framework's host time per kernel (``host_dispatch_s``): the
host issues kernels one at a time while the device runs the ones before (launches are
asynchronous), so that time is hidden behind long kernels and idles the device between short
ones (:func:`app.domain.performance.roofline.predict`); the device's own per-kernel launch
overhead stays the calibration's. The constants are fitted by
``benchmarks/calibration/runtimes.py`` on published same-model, same-device measurements
(``benchmarks/calibration/framework_measurements.yaml``, sources per row), and its report
gives each profile's error in sample and leaving each device out.

The profiles apply to accelerators (GPU, Jetson, TPU). On CPUs a profile changes the
calibration only where it has a CPU scale of its own (``cpu_compute_efficiency_scale``):
``pytorch_eager``, fitted on Intel's published ratios of its optimized PyTorch stack to stock
PyTorch on a Xeon 8380 (the CPU calibration is fitted on MLPerf rows, which Intel ran with the
optimized stacks). The other runtimes have no CPU measurements: CPUs keep their calibration.

``onnxruntime`` is ONNX Runtime with its CUDA execution provider: its graph optimizer fuses
GELU, bias + GELU, layer normalization, residual + bias + layer normalization, the embedding
layer and attention of transformer encoders into single kernels, so element-wise layers fuse.
ONNX Runtime's TensorRT execution provider hands the graph to TensorRT, which builds its own
engine: that is the ``tensorrt`` profile, not this one.

``vllm`` is a decoder-serving profile, fitted by ``benchmarks/calibration/llm_serving.py`` on
published vLLM runs: besides the compute-efficiency scale it adds the host work vLLM's engine
does between decode steps (:func:`with_decode_host_overhead`), which runs serially with the GPU.

References
----------
ONNX Runtime documentation, "Graph Optimizations in ONNX Runtime" (extended level: GELU, layer
normalization, BERT embedding layer, attention, skip layer normalization and bias GELU fusions on
the CPU and CUDA execution providers).
vLLM team, "vLLM v0.6.0: 2.7x Throughput Improvement and 5x Latency Reduction", 2024-09-05
(Performance Diagnosis: for Llama 3 8B on one H100 before v0.6.0 the GPU executed for 38% of the
time; the API server's per-token output processing took 33% and scheduling plus input
preparation 29%). LambdaLabsML/vllm-benchmark, benchmark_v0.md: v0.6.0 with 10 scheduler steps
per host pass gives 2.04x the output throughput of 1 step on the same Llama 3.1 8B workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from app.domain.hardware import DeviceKind
from app.domain.performance.calibration import (
    DEFAULT_CALIBRATIONS,
    GPU_CLASSES,
    Calibration,
    CalibrationClass,
)
from app.domain.performance.prediction import Prediction

PROFILED_KINDS = frozenset({DeviceKind.GPU, DeviceKind.EDGE, DeviceKind.TPU})


class ServingRuntime(StrEnum):
    """The framework or engine that serves the model."""

    TENSORRT = "tensorrt"  # the calibration's own: MLPerf-grade engines
    TORCH_COMPILE = "torch_compile"
    PYTORCH_EAGER = "pytorch_eager"
    TENSORFLOW = "tensorflow"
    ONNXRUNTIME = "onnxruntime"  # the CUDA execution provider (its TensorRT provider: tensorrt)
    VLLM = "vllm"  # decoder LLM serving only


DECODER_ONLY = frozenset({ServingRuntime.VLLM})  # profiles fitted on decoder serving alone


DEFAULT_RUNTIME = ServingRuntime.TENSORRT


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeProfile:
    """What a runtime changes in an accelerator's calibration, and where it comes from."""

    runtime: ServingRuntime
    fuse_elementwise: bool  # element-wise layers run inside the kernel before them
    compute_efficiency_scale: float  # x the calibrated compute efficiency
    # the framework's host time per kernel, overlapped with the device's work (the
    # calibration's host_dispatch_s); the device's own launch overhead stays the calibration's
    host_dispatch_s: float
    basis: str
    # decoders: host work per sequence in each engine step (prefill and every decode step),
    # serial with the GPU [s]
    host_overhead_per_sequence_step_s: float = 0.0
    # CPUs: x the calibrated compute efficiency (None: CPUs keep their calibration)
    cpu_compute_efficiency_scale: float | None = None
    cpu_basis: str = ""

    def apply(self, calibration: Calibration, kind: DeviceKind) -> Calibration:
        """The calibration of a device of ``kind`` served by this runtime."""
        if self.runtime is DEFAULT_RUNTIME:
            return calibration
        if kind is DeviceKind.CPU:
            return self._apply_cpu(calibration)
        if kind not in PROFILED_KINDS:
            return calibration
        return replace(
            calibration,
            compute_efficiency=min(
                1.0, calibration.compute_efficiency * self.compute_efficiency_scale
            ),
            host_dispatch_s=self.host_dispatch_s,
            basis=f"{calibration.basis}; served by {self.runtime.value}: {self.basis}",
        )

    def _apply_cpu(self, calibration: Calibration) -> Calibration:
        scale = self.cpu_compute_efficiency_scale
        if scale is None:
            return calibration
        return replace(
            calibration,
            compute_efficiency=min(1.0, calibration.compute_efficiency * scale),
            basis=f"{calibration.basis}; served by {self.runtime.value} on a CPU: {self.cpu_basis}",
        )


def decode_host_seconds(
    decoder: bool,
    kind: DeviceKind,
    batch: int,
    steps: int,
    host_overhead_per_sequence_step_s: float,
) -> tuple[float, float] | None:
    """The host time :func:`with_decode_host_overhead` adds per step and per request of
    ``batch`` sequences over ``steps`` steps (prefill and decode repetitions) [s], or None
    where it adds none (not a decoder, no host term, not an accelerator)."""
    if not decoder or host_overhead_per_sequence_step_s <= 0.0 or kind not in PROFILED_KINDS:
        return None
    per_step_s = host_overhead_per_sequence_step_s * batch
    return per_step_s, per_step_s * steps


def with_decode_host_overhead(
    prediction: Prediction, host_overhead_per_sequence_step_s: float
) -> Prediction:
    """A decoder prediction with the serving engine's host work between steps added.

    Parameters
    ----------
    prediction : a decoder's prediction (``first_token_s`` set) on an accelerator; others (and
        CPUs, whose engines this host term was not fitted on) come back unchanged
    host_overhead_per_sequence_step_s : host time per sequence in one engine step [s]

    Returns
    -------
    prediction : latency, steady-state interval, first-token and per-token times with
        ``t_host = h * b`` added per step, and ``request_overhead_s`` carrying the total

    Notes
    -----
    An engine that schedules, prepares inputs and processes outputs on the host between steps
    (vLLM's engine loop: one host pass per step) leaves the GPU idle meanwhile, so per request
    of ``b`` sequences with one prefill and ``g - 1`` decode steps the time grows by
    ``h * b * g`` and each decode step by ``h * b`` (serial, not overlapped with the kernels).
    Beams are not counted apart: ``b`` is the requests in the batch.
    """
    steps = sum(t.repeats for t in prediction.phases)
    added = decode_host_seconds(
        prediction.first_token_s is not None,
        prediction.device.kind,
        prediction.batch,
        steps,
        host_overhead_per_sequence_step_s,
    )
    if added is None or prediction.first_token_s is None:
        return prediction
    per_step_s, total_s = added
    per_token = prediction.per_token_s
    said = (
        f"serving engine host work between steps: {host_overhead_per_sequence_step_s * 1e6:g} "
        f"us per sequence x {prediction.batch} sequences x {steps} steps = "
        f"{total_s * 1e3:.4g} ms per request, serial with the GPU (added to latency, interval, "
        "first token and every token)"
    )
    return replace(
        prediction,
        request_overhead_s=prediction.request_overhead_s + total_s,
        latency_s=prediction.latency_s + total_s,
        interval_s=prediction.interval_s + total_s,
        first_token_s=prediction.first_token_s + per_step_s,
        per_token_s=None if per_token is None else per_token + per_step_s,
        assumptions=(*prediction.assumptions, said),
    )


_FIT = (
    "fitted (grids of 0.05 and the host-dispatch ladder, least squares on log "
    "predicted/measured) by benchmarks/calibration/runtimes.py on framework_measurements.yaml"
)
RUNTIME_PROFILES: Mapping[ServingRuntime, RuntimeProfile] = {
    ServingRuntime.TENSORRT: RuntimeProfile(
        runtime=ServingRuntime.TENSORRT,
        fuse_elementwise=True,
        compute_efficiency_scale=1.0,
        host_dispatch_s=0.0,
        basis="the calibration as fitted on MLPerf results (TensorRT and comparable engines)",
    ),
    ServingRuntime.TORCH_COMPILE: RuntimeProfile(
        runtime=ServingRuntime.TORCH_COMPILE,
        fuse_elementwise=True,
        compute_efficiency_scale=1.6,
        host_dispatch_s=80e-6,
        basis=f"{_FIT}: 6 Hugging Face rows (ResNet-50, ViT-B/16; A100, T4, V100), leaving "
        "one device out 5 of 6 within 1.5x, 6 of 6 within 2x",
    ),
    ServingRuntime.PYTORCH_EAGER: RuntimeProfile(
        runtime=ServingRuntime.PYTORCH_EAGER,
        fuse_elementwise=False,
        compute_efficiency_scale=0.7,
        host_dispatch_s=50e-6,
        basis=f"{_FIT}: 20 rows (DeepLearningExamples and Hugging Face ResNet-50, ViT-B/16, "
        "BERT-large, RoBERTa-base, MiniLM; T4, V100, A100), leaving one device out 12 of 20 "
        "within 1.5x, 17 of 20 within 2x: eager serving stacks differ more than engines do",
        cpu_compute_efficiency_scale=0.7,
        cpu_basis="compute efficiency x 0.7, element-wise layers unfused; the scale fitted "
        "(grid of 0.05, least squares on log ratio) by benchmarks/calibration/runtimes.py on 20 "
        "published ratios of Intel's optimized PyTorch (IPEX 1.10 / 1.11) to stock PyTorch on "
        "a Xeon 8380 (ResNet-50, MobileNet v2, BERT-base, BERT-large, DistilBERT; int8 and fp32) "
        "and a Xeon 8380H (BERT-base and -large, bf16), batch 1 on 4 cores and batch 56-160 on a "
        "socket, the optimized side taken at the CPU calibration: within 1.5x 17 of 20 in sample "
        "and leaving each model out, 16 of 20 leaving each CPU out (10 of 20 without the scale); "
        "stock int8 transformers run further behind IPEX than this predicts (measured 1.6-2.8x, "
        "predicted 1.44x), fp32 transformers closer (1.0-1.3x), and MobileNet v2 closer "
        "(1.1-1.5x against 2.4-2.6x: its unfused element-wise layers)",
    ),
    ServingRuntime.ONNXRUNTIME: RuntimeProfile(
        runtime=ServingRuntime.ONNXRUNTIME,
        fuse_elementwise=True,
        compute_efficiency_scale=0.65,
        host_dispatch_s=12e-6,
        basis=f"{_FIT}: 16 rows of the CUDA execution provider (ONNX Runtime's BERT notebook: "
        "BERT-base fp16 batch 1-64 and fp32 on a V100 PCIe; transformer-deploy: MiniLM-L6, "
        "RoBERTa-base and -large fp16 and fp32 on a T4), element-wise layers fused as ORT's "
        "graph optimizer does for transformer encoders; in sample 12 of 16 within 1.5x, 13 of 16 "
        "within 2x; leaving one device out 5 of 16 within 1.5x, 11 of 16 within 2x (each device "
        "is one source: the two disagree, T4 rows run slower than the V100 ones predict); no CNN "
        "rows: ResNet-50 and ViT under ORT are extrapolated",
    ),
    ServingRuntime.VLLM: RuntimeProfile(
        runtime=ServingRuntime.VLLM,
        fuse_elementwise=True,
        compute_efficiency_scale=0.7,
        host_dispatch_s=0.0,
        host_overhead_per_sequence_step_s=70e-6,
        basis="decoder serving only; compute-efficiency scale and host time per sequence per "
        "engine step fitted (grid of 0.05 and a ladder in us, least squares on log "
        "predicted/measured) by benchmarks/calibration/llm_serving.py on 5 published vLLM rows "
        "(4 vLLM v0.5.4 ShareGPT 320-request bursts, Llama-3-8B and Mistral-7B on A100 80GB SXM "
        "and H100 SXM, and one batch-1 decode rate of a recent vLLM on an A100 40GB): in sample "
        "and leaving each device out 5 of 5 within 1.5x (left out 0.74-1.24x); the host term "
        "is v0.5.4's, later versions with multi-step or asynchronous scheduling spend less",
    ),
    ServingRuntime.TENSORFLOW: RuntimeProfile(
        runtime=ServingRuntime.TENSORFLOW,
        fuse_elementwise=False,
        compute_efficiency_scale=0.2,
        host_dispatch_s=30e-6,
        basis=f"{_FIT}: 10 DeepLearningExamples TF1/TF2 rows (ResNet-50, BERT-base and -large; "
        "A100, T4), leaving one device out 10 of 10 within 1.5x",
    ),
}


def calibrations_for(
    runtime: ServingRuntime, overrides: Mapping[CalibrationClass, Mapping[str, float]]
) -> dict[CalibrationClass, Calibration]:
    """The default calibration of every class under a serving runtime's profile, with a
    request's overrides (:class:`Calibration` field names and units) applied on top.

    An override of ``gpu`` reaches every GPU class; an architecture class's own override is
    applied after it, so its fields win. An empty override changes nothing.
    """
    profile = RUNTIME_PROFILES[runtime]
    result = {cls: profile.apply(cal, cls.kind) for cls, cal in DEFAULT_CALIBRATIONS.items()}
    gpu_override = overrides.get(CalibrationClass.GPU)
    steps = [] if gpu_override is None else [(cls, gpu_override) for cls in GPU_CLASSES]
    steps += [(cls, o) for cls, o in overrides.items() if cls is not CalibrationClass.GPU]
    for cls, values in steps:
        if not values:
            continue
        changed = ", ".join(sorted(values))
        base = result[cls]
        result[cls] = replace(
            base, **values, basis=f"request override of {changed}; otherwise: {base.basis}"
        )
    return result
