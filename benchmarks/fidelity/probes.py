"""Op-level probes: what each op keeps for backward on the CPU, and its transient peak.

Every probe builds fresh inputs, then measures three regions with :class:`MemoryMeter`:
an inference forward (``torch.no_grad``), a training forward (under
``saved_tensors_hooks`` that record every tensor autograd saves), and the backward. Saved
tensors are classified by storage: ``input``/``param``/``output`` storages already exist, so
only ``new`` ones are extra memory an estimator has to add for that op. The optimizer probes
measure ``optimizer.step()`` on parameters whose gradients are already populated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from memtrack import MemoryMeter, storage_key, unique_storage_bytes
from models import llama2_7b_config
from torch import Tensor, nn
from transformers.activations import NewGELUActivation
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

# Ops that only create views, metadata or empty buffers; hidden from the "kernels" column.
TRIVIAL_OPS = {
    "aten::_record_function_enter_new",
    "aten::_record_function_exit",
    "aten::alias",
    "aten::as_strided",
    "aten::detach",
    "aten::empty",
    "aten::empty_like",
    "aten::empty_strided",
    "aten::expand",
    "aten::lift_fresh",
    "aten::permute",
    "aten::reshape",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::select",
    "aten::slice",
    "aten::t",
    "aten::transpose",
    "aten::unsqueeze",
    "aten::view",
    "aten::_unsafe_view",
    "aten::squeeze",
    "aten::contiguous",
    "aten::result_type",
}


@dataclass(frozen=True)
class ProbeCase:
    """Tensors and callable for one probe; ``run`` returns the op's output tensor(s)."""

    run: Callable[[], tuple[Tensor, ...]]
    inputs: Sequence[Tensor]
    params: Sequence[Tensor] = ()


@dataclass(frozen=True)
class SavedTensor:
    """One tensor autograd saved for backward."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    origin: str  # input / param (parameter or buffer) / output / new

    def describe(self) -> str:
        """Compact ``dtype[shape] origin`` text, with bytes per element for new tensors."""
        dims = "x".join(map(str, self.shape)) or "scalar"
        text = f"{self.dtype}[{dims}] {self.origin}"
        numel = math.prod(self.shape)
        if self.origin == "new" and numel:
            text += f" ({self.nbytes / numel:g} B/el)"
        return text


@dataclass
class ProbeResult:
    """Measured behaviour of one op."""

    name: str
    setup: str
    input_bytes: int
    param_bytes: int
    output_bytes: int
    kernels_train: list[str]
    kernels_infer: list[str]
    infer_peak_extra: int
    train_fwd_peak_extra: int
    held_after_fwd: int
    bwd_peak_extra: int
    saved: list[SavedTensor] = field(default_factory=list)

    @property
    def saved_new_bytes(self) -> int:
        """Bytes of saved tensors that are neither inputs, params nor outputs."""
        return sum(s.nbytes for s in self.saved if s.origin == "new")

    @property
    def ref(self) -> tuple[str, int]:
        """Size the forward ratios are relative to: the output, or the input if the output is
        tiny (a scalar loss) or absent (an in-place op)."""
        if self.output_bytes * 16 >= self.input_bytes:
            return "out", self.output_bytes
        return "in", self.input_bytes


@dataclass(frozen=True)
class OptimizerProbeResult:
    """Measured behaviour of ``optimizer.step()``."""

    name: str
    setup: str
    impl: str
    param_bytes: int
    first_step_peak_extra: int
    first_step_state_bytes: int
    second_step_peak_extra: int


StorageKey = tuple[int, int]


def _origin(key: StorageKey, groups: dict[str, set[StorageKey]]) -> str:
    return next((name for name, keys in groups.items() if key in keys), "new")


def _kernels(meter: MemoryMeter) -> list[str]:
    return sorted(op.removeprefix("aten::") for op in meter.ops() - TRIVIAL_OPS)


def run_probe(name: str, setup: str, make: Callable[[], ProbeCase]) -> ProbeResult:
    """Measure one op: inference peak, saved tensors, training-forward and backward peaks."""
    case = make()
    with torch.no_grad(), MemoryMeter() as meter:
        outputs = case.run()
    infer_peak = meter.profiler_result.peak_extra
    del outputs, case

    case = make()
    input_keys = {k for t in case.inputs if (k := storage_key(t))}
    param_keys = {k for t in case.params if (k := storage_key(t))}
    saved_raw: list[Tensor] = []

    def pack(t: Tensor) -> Tensor:
        saved_raw.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), MemoryMeter() as fwd:
        outputs = case.run()
    output_keys = {k for t in outputs if (k := storage_key(t))} - input_keys
    groups = {"input": input_keys, "param": param_keys, "output": output_keys}
    saved: list[SavedTensor] = []
    seen: set[StorageKey] = set()
    for t in saved_raw:
        key = storage_key(t)
        if key is None or key in seen:
            continue
        seen.add(key)
        dtype = str(t.dtype).removeprefix("torch.")
        saved.append(SavedTensor(tuple(t.shape), dtype, key[1], _origin(key, groups)))
    saved_raw.clear()
    grads = [torch.randn_like(t) if t.requires_grad and t.numel() > 1 else None for t in outputs]
    with MemoryMeter() as bwd:
        torch.autograd.backward(
            [t for t in outputs if t.requires_grad],
            [g for t, g in zip(outputs, grads, strict=True) if t.requires_grad],
        )
    return ProbeResult(
        name=name,
        setup=setup,
        input_bytes=unique_storage_bytes(case.inputs),
        param_bytes=unique_storage_bytes(case.params),
        output_bytes=sum(nbytes for _, nbytes in output_keys),
        kernels_train=_kernels(fwd),
        kernels_infer=_kernels(meter),
        infer_peak_extra=infer_peak,
        train_fwd_peak_extra=fwd.profiler_result.peak_extra,
        held_after_fwd=fwd.profiler_result.final_extra,
        bwd_peak_extra=bwd.profiler_result.peak_extra,
        saved=saved,
    )


# --------------------------------------------------------------------------- probe definitions


def _leaf(*shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


def _module_case(module: nn.Module, x: Tensor) -> ProbeCase:
    return ProbeCase(lambda: (module(x),), [x], [*module.parameters(), *module.buffers()])


def _nonleaf_relu_case(inplace: bool) -> ProbeCase:
    x = _leaf(8, 64, 56, 56)
    h = x * 1.0  # a non-leaf activation, like a BN output, so in-place is allowed
    return ProbeCase(lambda: (F.relu(h, inplace=inplace),), [h])


def _sdpa_case(
    shape: tuple[int, int, int, int],
    dtype: torch.dtype = torch.float32,
    *,
    causal: bool = True,
    dropout: float = 0.0,
    mask: bool = False,
) -> ProbeCase:
    q, k, v = (_leaf(*shape, dtype=dtype) for _ in range(3))
    seq = shape[2]
    attn_mask = torch.zeros(1, 1, seq, seq, dtype=dtype) if mask else None

    def run() -> tuple[Tensor, ...]:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=causal and not mask
        )
        return (out,)

    return ProbeCase(run, [q, k, v] if attn_mask is None else [q, k, v, attn_mask])


def _lstm_case() -> ProbeCase:
    lstm = nn.LSTM(128, 256, num_layers=1, batch_first=True)
    x = _leaf(32, 128, 128)
    return ProbeCase(lambda: (lstm(x)[0],), [x], list(lstm.parameters()))


def _rotary_case() -> ProbeCase:
    config = llama2_7b_config("sdpa")
    rotary = LlamaRotaryEmbedding(config=config)
    q, k = _leaf(1, 32, 512, 128), _leaf(1, 32, 512, 128)
    positions = torch.arange(512).unsqueeze(0)

    def run() -> tuple[Tensor, ...]:
        cos, sin = rotary(q, positions)
        return apply_rotary_pos_emb(q, k, cos, sin)

    return ProbeCase(run, [q, k])


def _cross_entropy_case(dtype: torch.dtype) -> ProbeCase:
    logits = _leaf(512, 32000, dtype=dtype)
    labels = torch.randint(0, 32000, (512,))
    return ProbeCase(lambda: (F.cross_entropy(logits, labels),), [logits, labels])


def _hf_causal_loss_case() -> ProbeCase:
    logits = _leaf(1, 512, 32000, dtype=torch.bfloat16)
    labels = torch.randint(0, 32000, (1, 512))
    return ProbeCase(lambda: (ForCausalLMLoss(logits, labels, 32000),), [logits, labels])


PROBES: list[tuple[str, str, Callable[[], ProbeCase]]] = [
    (
        "conv2d 3x3",
        "x f32[8,64,56,56], Conv2d(64,64,3,p=1,bias=False)",
        lambda: _module_case(nn.Conv2d(64, 64, 3, padding=1, bias=False), _leaf(8, 64, 56, 56)),
    ),
    (
        "conv2d 7x7/2 stem",
        "x f32[1,3,224,224], Conv2d(3,64,7,s=2,p=3,bias=False)",
        lambda: _module_case(nn.Conv2d(3, 64, 7, 2, 3, bias=False), _leaf(1, 3, 224, 224)),
    ),
    (
        "batchnorm2d train",
        "x f32[8,64,56,56], BatchNorm2d(64).train()",
        lambda: _module_case(nn.BatchNorm2d(64).train(), _leaf(8, 64, 56, 56)),
    ),
    (
        "batchnorm2d eval",
        "x f32[8,64,56,56], BatchNorm2d(64).eval()",
        lambda: _module_case(nn.BatchNorm2d(64).eval(), _leaf(8, 64, 56, 56)),
    ),
    ("relu", "h f32[8,64,56,56] (non-leaf), F.relu", lambda: _nonleaf_relu_case(False)),
    (
        "relu inplace",
        "h f32[8,64,56,56] (non-leaf), F.relu(inplace=True)",
        lambda: _nonleaf_relu_case(True),
    ),
    (
        "maxpool2d 3x3/2",
        "x f32[8,64,112,112], MaxPool2d(3,2,1)",
        lambda: _module_case(nn.MaxPool2d(3, 2, 1), _leaf(8, 64, 112, 112)),
    ),
    (
        "dropout f32",
        "x f32[64,65536], Dropout(0.5).train()",
        lambda: _module_case(nn.Dropout(0.5).train(), _leaf(64, 65536)),
    ),
    (
        "dropout bf16",
        "x bf16[64,65536], Dropout(0.5).train()",
        lambda: _module_case(nn.Dropout(0.5).train(), _leaf(64, 65536, dtype=torch.bfloat16)),
    ),
    (
        "linear",
        "x f32[2048,768], Linear(768,3072)",
        lambda: _module_case(nn.Linear(768, 3072), _leaf(2048, 768)),
    ),
    (
        "layernorm",
        "x f32[4,512,768], LayerNorm(768)",
        lambda: _module_case(nn.LayerNorm(768), _leaf(4, 512, 768)),
    ),
    (
        "embedding",
        "ids i64[4,512], Embedding(30522,768)",
        lambda: _module_case(nn.Embedding(30522, 768), torch.randint(0, 30522, (4, 512))),
    ),
    (
        "softmax",
        "x f32[4,12,512,512], softmax(-1)",
        lambda: _module_case(nn.Softmax(-1), _leaf(4, 12, 512, 512)),
    ),
    (
        "gelu (exact)",
        "x f32[4,512,3072], F.gelu",
        lambda: _module_case(nn.GELU(), _leaf(4, 512, 3072)),
    ),
    (
        "gelu (tanh)",
        "x f32[4,512,3072], F.gelu(approximate='tanh')",
        lambda: _module_case(nn.GELU(approximate="tanh"), _leaf(4, 512, 3072)),
    ),
    (
        "HF gelu_new (GPT-2)",
        "x f32[4,512,3072], transformers NewGELUActivation",
        lambda: _module_case(NewGELUActivation(), _leaf(4, 512, 3072)),
    ),
    ("silu", "x f32[1,512,11008], F.silu", lambda: _module_case(nn.SiLU(), _leaf(1, 512, 11008))),
    ("lstm", "x f32[32,128,128], LSTM(128,256,batch_first)", _lstm_case),
    (
        "sdpa causal f32",
        "q,k,v f32[1,32,512,128], is_causal=True",
        lambda: _sdpa_case((1, 32, 512, 128)),
    ),
    (
        "sdpa causal bf16",
        "q,k,v bf16[1,32,512,128], is_causal=True",
        lambda: _sdpa_case((1, 32, 512, 128), torch.bfloat16),
    ),
    (
        "sdpa float mask",
        "q,k,v f32[1,32,512,128], additive f32[1,1,512,512] mask",
        lambda: _sdpa_case((1, 32, 512, 128), mask=True),
    ),
    (
        "sdpa dropout",
        "q,k,v f32[4,12,512,64], is_causal=True, dropout_p=0.1",
        lambda: _sdpa_case((4, 12, 512, 64), dropout=0.1),
    ),
    (
        "HF LlamaRMSNorm f32",
        "x f32[1,512,4096], LlamaRMSNorm(4096)",
        lambda: _module_case(LlamaRMSNorm(4096), _leaf(1, 512, 4096)),
    ),
    (
        "HF LlamaRMSNorm bf16",
        "x bf16[1,512,4096], LlamaRMSNorm(4096).bfloat16()",
        lambda: _module_case(
            LlamaRMSNorm(4096).bfloat16(), _leaf(1, 512, 4096, dtype=torch.bfloat16)
        ),
    ),
    (
        "HF rotary (Llama)",
        "q,k f32[1,32,512,128]; LlamaRotaryEmbedding + apply_rotary_pos_emb",
        _rotary_case,
    ),
    (
        "cross_entropy f32",
        "logits f32[512,32000], labels i64[512]",
        lambda: _cross_entropy_case(torch.float32),
    ),
    (
        "cross_entropy bf16",
        "logits bf16[512,32000], labels i64[512]",
        lambda: _cross_entropy_case(torch.bfloat16),
    ),
    (
        "HF ForCausalLMLoss bf16",
        "logits bf16[1,512,32000], labels i64[1,512]",
        _hf_causal_loss_case,
    ),
]


OptimizerFactory = Callable[[list[Tensor]], torch.optim.Optimizer]
EVEN = (2_500_000,) * 4
# The for-loop AdamW keeps the previous param's ``denom`` alive while it builds the next one;
# an uneven pair (small, then large) makes that visible.
UNEVEN = (1_000_000, 4_000_000)

OPTIMIZER_PROBES: list[tuple[str, str, OptimizerFactory, tuple[int, ...]]] = [
    ("SGD momentum", "SGD(lr=0.01, momentum=0.9)", lambda p: torch.optim.SGD(p, 0.01, 0.9), EVEN),
    ("AdamW default", "AdamW() (foreach=None)", lambda p: torch.optim.AdamW(p), EVEN),
    ("AdamW default, uneven", "AdamW() (foreach=None)", lambda p: torch.optim.AdamW(p), UNEVEN),
    ("AdamW foreach", "AdamW(foreach=True)", lambda p: torch.optim.AdamW(p, foreach=True), EVEN),
    ("AdamW fused", "AdamW(fused=True)", lambda p: torch.optim.AdamW(p, fused=True), EVEN),
]


def optimizer_impl(ops: set[str]) -> str:
    """Which optimizer code path ran, read from the ATen ops it dispatched."""
    if any(op.startswith("aten::_fused_") for op in ops):
        return "fused"
    if any(op.startswith("aten::_foreach_") for op in ops):
        return "foreach"
    return "for-loop (single tensor)"


def run_optimizer_probe(
    name: str, setup: str, make: OptimizerFactory, sizes: tuple[int, ...]
) -> OptimizerProbeResult:
    """Measure two ``step()`` calls on fp32 params of ``sizes`` elements (grads pre-set)."""
    params = [torch.randn(n, requires_grad=True) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = make(params)
    with MemoryMeter() as first:
        optimizer.step()
    with MemoryMeter() as second:
        optimizer.step()
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, Tensor)]
    return OptimizerProbeResult(
        name=name,
        setup=f"{setup}; f32 params of {' + '.join(f'{n / 1e6:g}M' for n in sizes)} elements",
        impl=optimizer_impl(first.ops()),
        param_bytes=unique_storage_bytes(params),
        first_step_peak_extra=first.profiler_result.peak_extra,
        first_step_state_bytes=unique_storage_bytes(state),
        second_step_peak_extra=second.profiler_result.peak_extra,
    )


def run_all(only: str | None = None) -> tuple[list[ProbeResult], list[OptimizerProbeResult]]:
    """Run every probe whose name contains ``only`` (all when ``None``)."""
    torch.manual_seed(0)
    ops = [run_probe(*p) for p in PROBES if only is None or only in p[0]]
    opts = [run_optimizer_probe(*p) for p in OPTIMIZER_PROBES if only is None or only in p[0]]
    return ops, opts


def _ratio(value: int, base: int) -> str:
    return f"{value / base:.2f}" if base else "-"


def to_markdown(ops: list[ProbeResult], opts: list[OptimizerProbeResult], header: str) -> str:
    """Render the probe results as a Markdown report."""
    lines = [
        "# Op-level memory probes (CPU)",
        "",
        header,
        "",
        "Bytes are what PyTorch's CPU allocator handed out (profiler `[memory]` events).",
        "`out B` = the op's new output storages; `ref` = the size the forward ratios use (the",
        "output, or the input when the output is a scalar loss or the op is in-place);",
        "`saved new B` = tensors autograd saved that are not inputs, params/buffers or outputs",
        "(extra memory held until backward); `no_grad fwd peak` / `train fwd peak` = max extra",
        "bytes during the forward, output included; `held after fwd` = extra bytes still live",
        "after the training forward (output + saved new); `bwd peak` = max extra bytes during",
        "backward (input/param grads and temporaries; the incoming output gradient is allocated",
        "beforehand). `B/el` = bytes per element of a saved tensor.",
        "",
        "| probe | setup | kernels | in B | params B | out B | ref | saved new B (x ref) "
        "| no_grad fwd peak (x ref) | train fwd peak (x ref) | held after fwd (x ref) "
        "| bwd peak (x (in+params)) | saved for backward |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in ops:
        saved = "; ".join(s.describe() for s in r.saved) or "nothing"
        kernels = ", ".join(r.kernels_train)
        if r.kernels_infer != r.kernels_train:
            kernels += f" (no_grad: {', '.join(r.kernels_infer)})"
        ref_name, ref = r.ref
        cells = [
            r.name,
            r.setup,
            kernels,
            f"{r.input_bytes:,}",
            f"{r.param_bytes:,}",
            f"{r.output_bytes:,}",
            ref_name,
            *(
                f"{v:,} ({_ratio(v, ref)})"
                for v in (r.saved_new_bytes, r.infer_peak_extra, r.train_fwd_peak_extra)
            ),
            f"{r.held_after_fwd:,} ({_ratio(r.held_after_fwd, ref)})",
            f"{r.bwd_peak_extra:,} ({_ratio(r.bwd_peak_extra, r.input_bytes + r.param_bytes)})",
            saved,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Optimizer step",
        "",
        "Two `step()` calls with gradients already set; extra bytes relative to params + grads.",
        "",
        "| optimizer | setup | path that ran | param B | 1st step peak extra (x params) "
        "| state after 1st step (x params) | 2nd step peak extra (x params) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for o in opts:
        lines.append(
            f"| {o.name} | {o.setup} | {o.impl} | {o.param_bytes:,} "
            f"| {o.first_step_peak_extra:,} ({_ratio(o.first_step_peak_extra, o.param_bytes)}) "
            f"| {o.first_step_state_bytes:,} ({_ratio(o.first_step_state_bytes, o.param_bytes)}) "
            f"| {o.second_step_peak_extra:,} ({_ratio(o.second_step_peak_extra, o.param_bytes)}) |"
        )
    return "\n".join(lines) + "\n"
