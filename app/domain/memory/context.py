"""The working state of one estimate: what its parts read and the explanations they add to,
the moments of the step and the training step's own tensors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from app.domain.graph.analysis import GraphAnalysis
from app.domain.memory.cuda_allocator import AllocatorPeaks, ReplayMemo
from app.domain.memory.formulas import PrecisionPlan, Sizer
from app.domain.memory.liveness import Peak, StoragePlan
from app.domain.memory.memo import LayerColumns, LayerTotals, PlanMemo
from app.domain.memory.request import MemoryRequest
from app.domain.peft import LoraPlan
from app.domain.peft.qlora import QuantizedBase


@dataclass(slots=True)
class Moment:
    """Composition of live memory at one moment."""

    phase: str
    parts: dict[str, int]
    at: str = "step"  # "forward" (during layer ``index``), "end" (of forward), "backward", "step"
    index: int = -1  # the layer, for "forward" and "backward"

    @property
    def total(self) -> int:
        return sum(self.parts.values())


@dataclass(slots=True)
class Estimation:
    """What the parts of one estimate read, and the explanations they add to."""

    analysis: GraphAnalysis
    request: MemoryRequest
    plan: PrecisionPlan
    sizer: Sizer
    storage_plan: StoragePlan
    params: int
    totals: LayerTotals  # sums over the analysis's layers (app.domain.memory.memo)
    static: dict[str, int]  # lines present in every phase (weights, buffers)
    inputs_bytes: int
    formulas: dict[str, str]
    notes: dict[str, list[str]]
    assumptions: list[str]
    # Training, for the formulas of the lines at the peak:
    grad_layers: list[int] = field(default_factory=list)  # per layer: gradient bytes
    grad_term: str = ""  # "ceil(<params> x <B> / <shard>)" of one layer, with {params}
    held_grads: str = ""  # the held gradients' expression (gradient accumulation)
    recompute: dict[str, int] = field(default_factory=dict)
    labels_rows: int = 0
    loss: str = ""  # the loss line's expression
    step_transient: str = ""  # the optimizer step's temporaries' expression
    step: StepTensors | None = None  # training: the step's tensors, for the allocator replay
    allocator: tuple[AllocatorPeaks, AllocatorPeaks] | None = None  # first, steady iteration
    kv_bytes: int = 0  # inference: the KV cache
    # keep_outputs: the previous step's outputs held through the forward (logits, K/V tensors)
    previous_outputs: list[int] = field(default_factory=list)
    comm_buffers: list[int] = field(default_factory=list)  # DDP buckets / FSDP gather buffers
    replays: ReplayMemo | None = None  # the caller's memo of allocator states after the weights
    plans: PlanMemo | None = None  # the caller's memo of what one analysis derives
    plan_key: tuple[object, ...] = ()  # inference: what the storage plan depends on
    columns: LayerColumns | None = None  # the analysis's layer columns (memo.layer_columns)
    lora: LoraPlan | None = None  # training with LoRA: what the adapters adapt and train
    grad_tensors: list[list[int]] | None = None  # LoRA: per layer, its trainable tensors' bytes
    cast_tensors: list[list[int]] | None = None  # LoRA: per layer, autocast's copies of them
    released_casts: list[int] | None = None  # autocast: per layer, copies its backward frees
    cast_cache_bytes: int = 0  # autocast: the weight_cast_cache line before any release
    qlora: QuantizedBase | None = None  # QLoRA: the 4-bit base's modules and bytes
    weight_tensors: list[list[int]] | None = None  # QLoRA: per layer, the base's tensors' bytes
    adapter_tensors: list[list[int]] | None = None  # LoRA: per layer, its adapters' weights [B]
    adapter_saved: dict[int, int] = field(default_factory=dict)  # LoRA: layer -> kept bytes
    # LoRA under full checkpointing: (bytes, formula) of the adapter tensors kept before the
    # backward recomputes a unit (those outside checkpointed units)
    adapter_early: tuple[int, str] | None = None
    offloaded_adapters: dict[int, int] = field(default_factory=dict)  # of those, on the host
    # Training options (app.domain.workload.TrainingOptions):
    held_words: str = "held across micro-batches"  # why held_grads are live
    # optimizer in backward: the largest parameter's gradient and step temporaries [B], its words
    in_backward_step: tuple[int, int, str] | None = None
    loss_transient: dict[str, tuple[int, str]] = field(default_factory=dict)  # at -> bytes, words
    output_dropped: bool = False  # training: the caller drops the logits before backward
    host: dict[str, int] = field(default_factory=dict)  # host (or unified) memory lines [B]
    offload_terms: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # at -> terms


@dataclass(frozen=True, slots=True)
class StepTensors:
    """Sizes of a training step's own tensors, as the allocator replay allocates them."""

    grad_element: Fraction  # bytes per gradient element
    grad_shard: int
    state_total: int  # optimizer state [B] (all shards' divisor applied)
    master_total: int
    cache_total: int  # autocast weight copies
    labels_bytes: int
    loss_bytes: int
    temporaries_total: int  # the optimizer step's temporaries [B]
    temporaries_largest: bool  # for-loop step: two temporaries of the largest parameter
    accumulate: bool  # gradients held across micro-batches (never freed in the step)
    in_backward: bool = False  # optimizer in backward: each gradient stepped and freed at once
    loss_upcast_bytes: int = 0  # HF ForCausalLMLoss: logits.float(), freed when it returns
    loss_grad_bytes: int = 0  # each of nll_loss's and log_softmax's gradients in backward
    loss_chunk_bytes: int = 0  # loss_chunks: one chunk's fp32 gradient (nll_loss's, log_softmax's)


def moment_at(phase: str, static: Mapping[str, int], peak: Peak, loss: int) -> Moment:
    parts = dict(static)
    parts["gradients"] = parts.get("gradients", 0) + peak.gradients
    parts["activations"] = peak.activations
    parts["transient"] = peak.transient
    if peak.cache_released and "weight_cast_cache" in parts:  # freed by their GEMM's backward
        parts["weight_cast_cache"] -= min(peak.cache_released, parts["weight_cast_cache"])
    if loss:
        parts["loss"] = loss
    return Moment(phase=phase, parts=parts, at=peak.at, index=peak.index)
