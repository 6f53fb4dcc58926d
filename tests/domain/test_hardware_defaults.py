"""Golden rules: precision and attention defaults by a GPU's compute capability, as PyTorch's
SDPA dispatcher picks (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp)."""

import pytest

from app.domain.graph.analysis import analyze
from app.domain.hardware import DeviceKind, HardwareSpec
from app.domain.precision import (
    ComputeCapability,
    DType,
    Precision,
    cannot_run,
    unsupported_dtype,
)
from app.domain.workload import (
    Attention,
    GpuTraits,
    Mode,
    Runtime,
    WorkloadSpec,
    choose_precision,
    default_attention,
    resolve,
)
from app.domain.zoo import ZOO

T4 = GpuTraits(name="nvidia-t4", compute_capability=ComputeCapability(7, 5))
V100 = GpuTraits(name="nvidia-v100", compute_capability=ComputeCapability(7, 0))
A100 = GpuTraits(name="nvidia-a100", compute_capability=ComputeCapability(8, 0))
A10 = GpuTraits(name="nvidia-a10", compute_capability=ComputeCapability(8, 6))
H100 = GpuTraits(name="nvidia-h100", compute_capability=ComputeCapability(9, 0))
MAXWELL = GpuTraits(name="titan-x", compute_capability=ComputeCapability(5, 2))
KEPLER = GpuTraits(name="k80", compute_capability=ComputeCapability(3, 7))
UNKNOWN = GpuTraits(name="lab-gpu", compute_capability=None)


@pytest.mark.parametrize(
    ("gpu", "mode", "precision"),
    [
        (T4, Mode.INFERENCE, Precision.FP16),
        (T4, Mode.TRAINING, Precision.AMP_FP16),
        (V100, Mode.INFERENCE, Precision.FP16),
        (V100, Mode.TRAINING, Precision.AMP_FP16),
        (MAXWELL, Mode.INFERENCE, Precision.FP16),
        (A100, Mode.INFERENCE, Precision.BF16),
        (A100, Mode.TRAINING, Precision.AMP_BF16),
        (A10, Mode.TRAINING, Precision.AMP_BF16),
        (H100, Mode.INFERENCE, Precision.BF16),
        (H100, Mode.TRAINING, Precision.AMP_BF16),
        (UNKNOWN, Mode.INFERENCE, Precision.BF16),  # no figure: the Ampere-or-newer default
        (None, Mode.TRAINING, Precision.AMP_BF16),
    ],
)
def test_the_default_precision_exists_on_the_gpu(
    gpu: GpuTraits | None, mode: Mode, precision: Precision
) -> None:
    chosen, reason = choose_precision(mode, Runtime.CUDA, gpu)
    assert chosen is precision
    if gpu is not None and gpu.compute_capability is not None:
        cap = gpu.compute_capability
        assert f"{gpu.name} (compute capability {cap}, {cap.sm})" in reason
        assert unsupported_dtype(chosen, cap) is None


def test_cpu_defaults_are_unchanged() -> None:
    assert choose_precision(Mode.INFERENCE, Runtime.CPU, None) == (
        Precision.FP32,
        "inference on pytorch_cpu",
    )
    assert default_attention(Runtime.CPU, Precision.FP32, training=False, dropout=False) == (
        Attention.FLASH,
        "CPU: SDPA runs the fused flash kernel",
    )


@pytest.mark.parametrize(
    ("gpu", "precision", "training", "dropout", "head_dim", "expected"),
    [
        # T4 sm75: no flash (sm80+); mem_efficient for fp16 and fp32, math for bf16
        (T4, Precision.FP16, False, False, 64, Attention.MEM_EFFICIENT),
        (T4, Precision.AMP_FP16, True, True, 128, Attention.MEM_EFFICIENT),
        (T4, Precision.FP32, False, False, 64, Attention.MEM_EFFICIENT),
        (T4, Precision.BF16, False, False, 64, Attention.SDPA_MATH),
        (V100, Precision.FP16, False, False, 64, Attention.MEM_EFFICIENT),
        (V100, Precision.AMP_BF16, True, False, 64, Attention.SDPA_MATH),
        # 16-bit inputs on tensor cores need head_dim divisible by 8 for mem_efficient
        (V100, Precision.FP16, False, False, 36, Attention.SDPA_MATH),
        (V100, Precision.FP32, False, False, 36, Attention.MEM_EFFICIENT),  # no alignment
        (MAXWELL, Precision.FP16, False, False, 64, Attention.MEM_EFFICIENT),
        (KEPLER, Precision.FP16, False, False, 64, Attention.SDPA_MATH),  # below sm50
        # A100 sm80: flash for fp16/bf16
        (A100, Precision.BF16, False, False, 128, Attention.FLASH),
        (A100, Precision.AMP_BF16, True, True, 128, Attention.FLASH),
        (A100, Precision.FP16, False, False, 256, Attention.FLASH),
        (A100, Precision.BF16, False, False, 320, Attention.MEM_EFFICIENT),  # head_dim > 256
        (A100, Precision.FP32, False, False, 64, Attention.MEM_EFFICIENT),
        (A100, Precision.TF32, True, False, 64, Attention.MEM_EFFICIENT),
        (A100, Precision.FP32, False, False, 66, Attention.SDPA_MATH),  # 66 % 4 on sm80
        # sm86/89 train head_dim 193-224 without flash; A100 (sm80) and H100 do
        (A10, Precision.AMP_BF16, True, False, 208, Attention.MEM_EFFICIENT),
        (A10, Precision.BF16, False, False, 208, Attention.FLASH),
        (A100, Precision.AMP_BF16, True, False, 208, Attention.FLASH),
        (A10, Precision.AMP_BF16, True, True, 240, Attention.MEM_EFFICIENT),  # + dropout
        (A10, Precision.AMP_BF16, True, False, 240, Attention.FLASH),
        (H100, Precision.BF16, False, False, 128, Attention.FLASH),
        (H100, Precision.AMP_BF16, True, True, 128, Attention.FLASH),
        # W8A8 / NVFP4 engines run their own fused kernel (priced as flash)
        (T4, Precision.INT8, False, False, 64, Attention.FLASH),
        # no compute capability: the rules before it was known
        (UNKNOWN, Precision.BF16, False, False, 64, Attention.FLASH),
        (UNKNOWN, Precision.FP32, False, False, 64, Attention.MEM_EFFICIENT),
    ],
)
def test_sdpa_backend_rules_per_compute_capability(
    gpu: GpuTraits,
    precision: Precision,
    training: bool,
    dropout: bool,
    head_dim: int,
    expected: Attention,
) -> None:
    impl, reason = default_attention(
        Runtime.CUDA, precision, training=training, dropout=dropout, gpu=gpu, head_dim=head_dim
    )
    assert impl is expected, reason
    cap = gpu.compute_capability
    if cap is not None and precision is not Precision.INT8:
        assert f"compute capability {cap}, {cap.sm}" in reason
    if expected is Attention.SDPA_MATH:
        assert reason.endswith("SDPA falls back to math")


def test_the_t4_reason_says_why_not_flash() -> None:
    impl, reason = default_attention(
        Runtime.CUDA, Precision.FP16, training=False, dropout=False, gpu=T4, head_dim=64
    )
    assert impl is Attention.MEM_EFFICIENT
    assert reason == (
        "CUDA fp16 on nvidia-t4 (compute capability 7.5, sm75): flash needs sm80-sm121, "
        "nvidia-t4 is sm75: SDPA picks mem_efficient"
    )


@pytest.mark.parametrize(
    ("gpu", "attention"),
    [(T4, Attention.MEM_EFFICIENT), (V100, Attention.MEM_EFFICIENT), (A100, Attention.FLASH),
     (H100, Attention.FLASH)],
)  # fmt: skip
def test_resolve_and_analyse_a_decoder_on_each_gpu(gpu: GpuTraits, attention: Attention) -> None:
    """The whole path: resolve's defaults, then the graph's per-layer choice (GPT-2: 12 heads
    of 64)."""
    model = ZOO["gpt-2"]
    resolved = resolve(
        WorkloadSpec(mode=Mode.INFERENCE, batch_size=1, sequence_length=128),
        model_bindings=model.default_bindings,
        hardware_runtime=Runtime.CUDA,
        gpu=gpu,
    )
    analysis = analyze(
        model.inputs, model.layers, dict(resolved.bindings), training=False,
        runtime=resolved.runtime, precision=resolved.precision, logits=resolved.logits,
        gpu=resolved.gpu,
    )  # fmt: skip
    assert {impl for impl, _ in analysis.attention_used} == {attention}
    used = {d.option: d for d in resolved.defaults_used}
    assert used["precision"].value == resolved.precision.value
    assert str(gpu.compute_capability) in used["precision"].reason


@pytest.mark.parametrize(
    ("precision", "capability", "missing"),
    [
        (Precision.BF16, ComputeCapability(7, 5), DType.BF16),
        (Precision.AMP_BF16, ComputeCapability(7, 0), DType.BF16),
        (Precision.MIXED_BF16, ComputeCapability(8, 0), None),
        (Precision.TF32, ComputeCapability(7, 0), DType.TF32),
        (Precision.FP8, ComputeCapability(8, 0), DType.FP8),
        (Precision.FP8, ComputeCapability(8, 9), None),
        (Precision.FP4, ComputeCapability(9, 0), DType.FP4),
        (Precision.FP4, ComputeCapability(10, 0), None),
        (Precision.FP16, ComputeCapability(5, 2), None),
        (Precision.INT4, ComputeCapability(7, 0), None),  # weight-only: fp16 math
    ],
)
def test_what_a_compute_capability_runs(
    precision: Precision, capability: ComputeCapability, missing: DType | None
) -> None:
    assert unsupported_dtype(precision, capability) is missing


def test_cannot_run_names_the_reason() -> None:
    volta = ComputeCapability(7, 0)
    assert cannot_run(Precision.BF16, compute_capability=volta, peak_dtypes={"fp16"}) == (
        "compute capability 7.0 has no bf16 (it needs 8.0+)"
    )
    assert cannot_run(Precision.INT8, compute_capability=volta, peak_dtypes={"fp16"}) == (
        "no int8 peak in its profile"
    )
    assert cannot_run(Precision.FP16, compute_capability=volta, peak_dtypes={"fp16"}) is None


@pytest.mark.parametrize("text", ["8", "8.", ".0", "8.10", "x.0", "sm80", "", "0.5"])
def test_bad_compute_capabilities_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="compute capability"):
        ComputeCapability.parse(text)


def test_a_mig_slice_has_its_gpus_compute_capability() -> None:
    spec = HardwareSpec(
        slug="gpu/1g.10gb", name="x", kind=DeviceKind.GPU, peak_flops_per_s={DType.BF16: 1e14},
        memory_bandwidth_bytes_per_s=1e12, memory_bytes=10 * 2**30, host_link_bytes_per_s=None,
        host_link_source="", tdp_watts=None, price_usd_per_hour=None,
        compute_capability=ComputeCapability(8, 0),
    )  # fmt: skip
    assert spec.gpu == GpuTraits(name="gpu/1g.10gb", compute_capability=ComputeCapability(8, 0))
    cpu = HardwareSpec(
        slug="cpu", name="x", kind=DeviceKind.CPU, peak_flops_per_s={DType.FP32: 1e12},
        memory_bandwidth_bytes_per_s=1e11, memory_bytes=2**30, host_link_bytes_per_s=None,
        host_link_source="", tdp_watts=None, price_usd_per_hour=None,
    )  # fmt: skip
    assert cpu.gpu is None
