"""Golden numbers for a frozen base (LoRA training, app.domain.memory.frozen): what the graph
keeps for backward, against what autograd keeps for the same chains on the CPU
(benchmarks/peft_params/frozen_saved.py, frozen_results.md: torch 2.13.0, peft 0.21.2).

The chain: four Linear(256, 256, bias=False), fc0..fc3, on a [4096, 256] input; a value is
4096 x 256 x 4 B = 4 MiB in fp32, 2 MiB in 16 bits; a weight 256 x 256.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.memory.estimate import (
    MemoryRequest,
    estimate_memory,
    precision_plan,
    request_frozen_base,
)
from app.domain.memory.formulas import Sizer
from app.domain.memory.frozen import FrozenBase, frozen_base, trainable_lines
from app.domain.memory.liveness import build_plan, kept_storages
from app.domain.peft import lora_plan
from app.domain.peft.lora import LoraConfig
from app.domain.precision import Precision
from app.domain.workload import Checkpointing, Mode, Optimizer, Parallelism, Runtime

MIB = 1 << 20
ROWS, WIDTH = 4096, 256
CHAIN = [{"name": f"fc{i}", "op": "linear", "out_features": WIDTH, "bias": False} for i in range(4)]


def _chain() -> GraphAnalysis:
    return analyze([InputDecl(name="x", shape=(ROWS, WIDTH))], CHAIN, {}, training=True)


def _request(precision: Precision, lora: LoraConfig, **kwargs: object) -> MemoryRequest:
    return MemoryRequest(
        mode=Mode.TRAINING,
        precision=precision,
        optimizer=Optimizer.SGD,
        runtime=Runtime.CUDA,
        lora=lora,
        **kwargs,  # type: ignore[arg-type]
    )


def _frozen(analysis: GraphAnalysis, request: MemoryRequest) -> FrozenBase:
    assert request.lora is not None
    plan = precision_plan(request.precision)
    lora = lora_plan(analysis.layers, request.lora)
    return request_frozen_base(analysis, request, plan, lora, 4 * WIDTH * WIDTH)


def _kept_by_graph(analysis: GraphAnalysis, request: MemoryRequest) -> list[int]:
    """Per layer, the bytes of the storages it keeps for backward (each storage once, by its
    earliest keeper)."""
    sizer = Sizer(precision_plan(request.precision), request.runtime)
    plan = build_plan(analysis, sizer, request, True, frozen=_frozen(analysis, request))
    seen: set[int] = set()
    kept = []
    for keys in kept_storages(plan):
        kept.append(sum(plan.sizes[k] for k in keys if k not in seen))
        seen.update(keys)
    return kept


def _lines(request: MemoryRequest) -> dict[str, int]:
    return {line.key: line.bytes for line in estimate_memory(_chain(), request).lines}


def test_fp32_adapter_keeps_the_frozen_layers_input_and_nothing_else_is_kept() -> None:
    """LoRA r=8 on fc2, fp32, no dropout. fc0 and fc1 run before any trainable tensor: their
    inputs need no gradient, they keep nothing (rule 2). fc2's lora_A keeps its input, fc2's
    own input itself (out1: 4 MiB); fc3 is frozen, its mm keeps only the weight (rule 1).
    Measured on the CPU: 4,325,376 B = out1 + lora_A's 4096 x 8 fp32 output (the
    adapter_activations line), + an 8 B scalar (the scaling)."""
    request = _request(Precision.FP32, LoraConfig(r=8, target_modules=("fc2",)))
    frozen = _frozen(_chain(), request)
    assert frozen.first_trainable == 2
    assert frozen.kept == {2: frozenset({"input"})}
    assert _kept_by_graph(_chain(), request) == [0, 0, 4 * MIB, 0]
    assert _lines(request)["adapter_activations"] == ROWS * 8 * 4 == 131_072
    assert 4 * MIB + 131_072 == 4_325_376


def test_full_fine_tuning_keeps_every_input() -> None:
    """The same chain without LoRA: each Linear keeps its input (16,777,216 B measured)."""
    request = MemoryRequest(mode=Mode.TRAINING, precision=Precision.FP32, optimizer=Optimizer.SGD)
    sizer = Sizer(precision_plan(request.precision), request.runtime)
    plan = build_plan(_chain(), sizer, request, True)
    sizes = [sum(plan.sizes[k] for k in keys) for keys in kept_storages(plan)]
    assert sizes == [4 * MIB] * 4
    assert sum(sizes) == 16_777_216


def test_bf16_base_adapter_keeps_its_fp32_copy_not_the_base_input() -> None:
    """A bf16 base, LoRA r=8 on fc2: lora_A keeps the fp32 copy of its input
    (``_cast_input_dtype``: 4096 x 256 x 4 B, in adapter_activations with lora_A's output), the
    graph keeps nothing (4,325,376 B measured, as the fp32 chain's)."""
    request = _request(Precision.BF16, LoraConfig(r=8, target_modules=("fc2",)))
    assert _frozen(_chain(), request).kept == {}
    assert _kept_by_graph(_chain(), request) == [0, 0, 0, 0]
    assert _lines(request)["adapter_activations"] == ROWS * WIDTH * 4 + ROWS * 8 * 4 == 4_325_376


def test_autocast_keeps_each_frozen_weights_cast() -> None:
    """An fp32 base under autocast(bf16), LoRA r=8 on fc1: fc2 and fc3 are frozen and their
    inputs need a gradient, so each mm keeps its 16-bit weight cast (autocast caches only leaf
    tensors that require grad): 2 x 256 x 256 x 2 B = 262,144 B in the graph (rule 3); fc1's
    lora_A keeps its bf16 input cast and output (2 MiB + 64 KiB). Measured: 2,428,936 B =
    262,144 + 4,096 (lora_B's cached weight cast, the weight_cast_cache line) + 2,162,688 + 8."""
    request = _request(Precision.AMP_BF16, LoraConfig(r=8, target_modules=("fc1",)))
    frozen = _frozen(_chain(), request)
    assert frozen.cast_numel == {2: WIDTH * WIDTH, 3: WIDTH * WIDTH}
    assert _kept_by_graph(_chain(), request) == [0, 0, 131_072, 131_072]
    lines = _lines(request)
    assert lines["adapter_activations"] == ROWS * WIDTH * 2 + ROWS * 8 * 2 == 2_162_688
    assert lines["weight_cast_cache"] == 2 * 8 * WIDTH * 2 == 8_192


def test_modules_to_save_copy_keeps_its_input_and_trains_at_the_base_dtype() -> None:
    """modules_to_save=["fc3"] beside LoRA r=8 on fc1 (fp32): fc3's trainable copy keeps its
    input (out2, 4 MiB; measured 8,519,680 B = out0 + out2 + lora_A's output). On a bf16 base
    with AdamW the copy's gradient and state are bf16 (PEFT deep-copies the module; torch's
    state is zeros_like(param)): 65,536 x 2 B and 2 x 65,536 x 2 B, the adapters' fp32."""
    config = LoraConfig(r=8, target_modules=("fc1",), modules_to_save=("fc3",))
    request = _request(Precision.FP32, config)
    assert _kept_by_graph(_chain(), request) == [0, 4 * MIB, 0, 4 * MIB]
    bf16 = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.BF16,
        optimizer=Optimizer.ADAMW,
        runtime=Runtime.CUDA,
        lora=config,
    )
    lines = _lines(bf16)
    adapters, copy = 2 * 8 * WIDTH, WIDTH * WIDTH
    assert lines["optimizer_state"] == adapters * 2 * 4 + copy * 2 * 2 == 294_912
    assert lines["gradients"] == 0  # the peak is the loss's: no gradient yet (set_to_none)
    lora = lora_plan(_chain().layers, config)
    split = trainable_lines(
        lora, bf16, replace(precision_plan(Precision.BF16), grad=Fraction(4), master=0,
                            state_slot=4), precision_plan(Precision.BF16), 1
    )  # fmt: skip
    assert split.grad_bytes == adapters * 4 + copy * 2 == 147_456
    assert split.state_bytes == 294_912
    # the foreach step's temporaries: one list per group at its own element size
    assert split.temporaries.bytes == adapters * 4 + copy * 2


def test_frozen_base_rules_need_a_trainable_tensor() -> None:
    """Without adapters before a layer, it keeps nothing; a modules_to_save layer keeps what
    full training keeps (variant None)."""
    analysis = _chain()
    lora = lora_plan(
        analysis.layers, LoraConfig(r=8, target_modules=("fc3",), modules_to_save=("fc1",))
    )
    frozen = frozen_base(analysis.layers, lora, adapter_shares_input=False, cast_bytes=0)
    assert frozen.first_trainable == 1
    assert [frozen.variant(i) for i in range(4)] == [
        ("nothing",),
        None,
        ("frozen", frozenset(), 0),
        ("frozen", frozenset(), 0),
    ]


VOCAB = 8192
BLOCKS = [
    {"name": f"layers.{i}.fc", "op": "linear", "out_features": WIDTH, "bias": False}
    for i in range(4)
] + [{"name": "head", "op": "linear", "out_features": VOCAB, "bias": False}]


def test_checkpointed_units_adapters_and_transients_exist_only_while_a_layer_runs() -> None:
    """DoRA r=8 on every block's fc (fp32, CUDA), a 4096 x 8192 head whose loss is the peak.
    Under full checkpointing no unit has been recomputed at the loss's backward: no adapter
    tensor is kept there (all are inside units); no layer runs: DoRA's weight norm (a layer's
    temporary, 3 x 256 x 256 x 4 B) is not there either. Without checkpointing the four units'
    adapter tensors are kept from the forward: lora_A's output (4096 x 8 x 4 B), lora_A's input
    (the graph's, fp32), DoRA's base_result and lora_result (4096 x 256 x 4 B each) and three
    fp32 out-vectors, the first unit's input needing no gradient aside (its mag_norm_scale - 1
    is still counted: an upper bound by 1 KiB)."""
    analysis = analyze([InputDecl(name="x", shape=(ROWS, WIDTH))], BLOCKS, {}, training=True)
    config = LoraConfig(r=8, target_modules=("fc",), use_dora=True)
    lines = {}
    for policy in (Checkpointing.FULL, Checkpointing.NONE):
        request = MemoryRequest(
            mode=Mode.TRAINING,
            precision=Precision.FP32,
            optimizer=Optimizer.SGD,
            runtime=Runtime.CUDA,
            checkpointing=policy,
            lora=config,
        )
        estimate = estimate_memory(analysis, request)
        assert estimate.peak_phase == "backward"
        assert "the log-probabilities" in next(
            line.formula for line in estimate.lines if line.key == "transient"
        )
        lines[policy] = {line.key: line.bytes for line in estimate.lines}
    assert "adapter_activations" not in lines[Checkpointing.FULL]
    assert "adapter_transient" not in lines[Checkpointing.FULL]
    assert "adapter_transient" not in lines[Checkpointing.NONE]
    unit = ROWS * 8 * 4 + ROWS * WIDTH * (4 + 4) + 3 * WIDTH * 4
    assert lines[Checkpointing.NONE]["adapter_activations"] == 4 * unit == 34_091_008


def test_deepspeed_zero3_linear_keeps_every_frozen_input_after_the_first_adapter() -> None:
    """The same chain, LoRA on fc2, under DeepSpeed ZeRO-3: zero.Init's
    ``LinearFunctionForZeroStage3`` saves (input, weight, bias) whatever needs a gradient, so
    fc3 keeps its input (the 4 MiB out2) as in full training; fc0 and fc1 still keep nothing
    (their autograd Function records no graph: no input needs a gradient)."""
    lora = LoraConfig(r=8, target_modules=("fc2",))
    zero3 = _request(Precision.FP32, lora, parallelism=Parallelism(zero_stage=3))
    assert zero3.parallelism.uses_deepspeed  # one data rank: ZeRO-3 is DeepSpeed's
    frozen = _frozen(_chain(), zero3)
    assert frozen.kept == {2: frozenset({"input"}), 3: frozenset({"input"})}
    assert _kept_by_graph(_chain(), zero3) == [0, 0, 4 * MIB, 4 * MIB]
    plain = _request(Precision.FP32, lora)
    assert _kept_by_graph(_chain(), plain) == [0, 0, 4 * MIB, 0]


def test_autocast_casts_a_trainable_linear_copy_but_no_norm_copy() -> None:
    """Under autocast a modules_to_save copy is a leaf that requires grad: a Linear's copy is
    cached once (weight_cast_cache, no per-use cast in the graph), a LayerNorm's copy is never
    cast (norms run in fp32: liveness.UNCAST_OPS), so it adds nothing to the line. LoRA r=8 on
    fc1 of a LayerNorm + four-Linear chain: the adapters' casts 2 x 8 x 256 x 2 B = 8,192 B."""
    norm: list[dict[str, object]] = [{"name": "ln", "op": "layernorm"}]
    analysis = analyze([InputDecl(name="x", shape=(ROWS, WIDTH))], norm + CHAIN, {}, training=True)
    casts = {}
    for saved in ("ln", "fc3"):
        config = LoraConfig(r=8, target_modules=("fc1",), modules_to_save=(saved,))
        request = _request(Precision.AMP_BF16, config)
        assert lora_plan(analysis.layers, config).saved_params > 0
        estimate = estimate_memory(analysis, request)
        casts[saved] = {line.key: line.bytes for line in estimate.lines}["weight_cast_cache"]
    adapters = 2 * 8 * WIDTH * 2
    assert (
        casts
        == {"ln": adapters, "fc3": adapters + WIDTH * WIDTH * 2}
        == {
            "ln": 8_192,
            "fc3": 139_264,
        }
    )
