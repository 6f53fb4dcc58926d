"""What a memory estimate answers: the breakdown lines, the per-layer view, the CUDA figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.domain.workload import Mode, Runtime


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryLine:
    """One line of the breakdown at the peak."""

    key: str
    bytes: int
    formula: str  # arithmetic over the numbers ``bytes`` was computed from; see below
    assumptions: tuple[str, ...] = ()

    # ``formula`` grammar: ``<expression> = <bytes> B`` where the expression is integers (thousands
    # separators), decimals, ``+``, ``-``, ``x``, ``/``, parentheses, ``ceil(...)`` and
    # ``floor(...)`` (where the engine rounds), and words in ``[...]`` saying what the number
    # before them is (ignored by the arithmetic). Evaluated exactly it equals ``bytes``
    # (tests/domain/test_formulas.py). Lines that are sums over the step's timeline (activations,
    # transient, gradients in backward) list their components, e.g. activations per producing op.


@dataclass(frozen=True, slots=True, kw_only=True)
class KeptTensor:
    """A tensor a layer keeps for backward, with the dtype it is stored in."""

    label: str
    source: str  # "input", "output" or "new" (created by the layer)
    elements: int
    dtype: str
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerMemory:
    """Per-layer view: what the layer produces and keeps."""

    name: str
    op: str
    output_shape: tuple[int, ...]
    params: int
    flops: int
    output_bytes: int
    saved_bytes: int  # new storages this layer keeps for backward (training)
    kept: tuple[KeptTensor, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """A footprint: lines that add up to the peak, the phase of the peak, and the rest."""

    mode: Mode
    runtime: Runtime
    params: int
    trainable_params: int
    lines: tuple[MemoryLine, ...]
    peak_bytes: int
    peak_phase: str
    phase_peaks: Mapping[str, int]
    first_iteration_peak_bytes: int | None
    first_iteration_peak_phase: str | None
    seed_rule_bytes: int | None
    layers: tuple[LayerMemory, ...]
    assumptions: tuple[str, ...]
    cuda: CudaMemory | None = None  # runtime pytorch_cuda: the allocator's figures
    # Host memory the step holds besides the device's peak (pinned activations offloaded to the
    # CPU, state offloaded by FSDP / ZeRO-3, paged optimizer state): not in peak_bytes. None:
    # the step holds none.
    host_lines: tuple[MemoryLine, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaMemory:
    """What PyTorch reports on a CUDA device for the step [B]: ``allocated`` is
    ``torch.cuda.max_memory_allocated()`` (the tensors, rounded by the caching allocator, and
    the cuBLAS workspace it allocates), ``reserved`` is ``torch.cuda.max_memory_reserved()``
    (allocated + cached free segments), and ``device_total`` adds the CUDA context: the device
    memory the process holds, which decides an out-of-memory error on a GPU or MIG slice."""

    allocated_bytes: int
    reserved_bytes: int
    context_bytes: int
    device_total_bytes: int
    first_iteration_allocated_bytes: int | None  # training: the step that creates the state
    first_iteration_reserved_bytes: int | None
    expandable_segments: bool


# The breakdown's order: persistent state, then what the step holds, then the runtime's lines.
LINE_ORDER = (
    "weights", "adapter_weights", "master_weights", "weight_cast_cache", "gradients",
    "ddp_buckets", "fsdp_buffers", "zero_gathered_params", "zero_reduce_bucket",
    "optimizer_state", "buffers", "inputs", "outputs", "previous_outputs",
    "activations", "adapter_activations", "adapter_transient", "loss", "transient", "kv_cache",
    "workspace",
    "allocator_rounding", "fragmentation_reserve", "cuda_context",
)  # fmt: skip


def breakdown(
    parts: Mapping[str, int],
    formulas: Mapping[str, str],
    notes: Mapping[str, Sequence[str]],
    *,
    training: bool,
) -> tuple[MemoryLine, ...]:
    """The lines of the peak's ``parts`` [B] in :data:`LINE_ORDER`, each with its formula (the
    key where none was written) and notes; inference has no gradients line."""
    return tuple(
        MemoryLine(
            key=key,
            bytes=parts[key],
            formula=formulas.get(key, key),
            assumptions=tuple(notes.get(key, [])),
        )
        for key in LINE_ORDER
        if key in parts and (training or key != "gradients")  # inference has no gradients
    )
