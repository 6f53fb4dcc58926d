"""Golden numbers for the closed-form memory rules (app/domain/memory/formulas.py), worked out
by hand from each rule's formula and source."""

from fractions import Fraction

import pytest

from app.domain.graph.analysis import InputDecl, analyze
from app.domain.memory.formulas import (
    StepTemporaries,
    TemporariesLayout,
    ddp_bucket_sizes_bytes,
    fsdp_buffer_bytes,
    gradient_bytes,
    kv_cache_bytes,
    optimizer_state_bytes,
    optimizer_step_temporaries,
    precision_plan,
    weights_bytes,
)
from app.domain.memory.request import MemoryRequest
from app.domain.precision import Precision
from app.domain.units import MIB
from app.domain.workload import Mode, Optimizer, OptimizerImpl, Runtime
from app.domain.zoo import ZOO

# A 1024 x 1024 weight and a 1024 bias: 1,049,600 parameter elements
SHAPES = [(1024, 1024), (1024,)]
PARAMS = 1_049_600


@pytest.mark.parametrize(
    ("optimizer", "precision", "expected"),
    [
        (Optimizer.SGD, Precision.FP32, 0),
        (Optimizer.SGD_MOMENTUM, Precision.FP32, 4_198_400),  # 1 slot x 1,049,600 x 4 B
        (Optimizer.ADAMW, Precision.FP32, 8_396_800),  # 2 slots x 1,049,600 x 4 B
        (Optimizer.ADAMW, Precision.BF16, 4_198_400),  # 2 slots x 1,049,600 x 2 B
        (Optimizer.ADAMW, Precision.MIXED_BF16, 8_396_800),  # fp32 moments
        # 2 x 1,049,600 B of moments + 2 x (512 + 1 blocks of 2048) x 4 B of absmax
        (Optimizer.ADAM_8BIT, Precision.FP32, 2_103_304),
        # fp32 (1024 rows + 1024 cols) of the matrix + the 1024-element bias
        (Optimizer.ADAFACTOR, Precision.FP32, 12_288),
    ],
)
def test_optimizer_state_bytes(optimizer: Optimizer, precision: Precision, expected: int) -> None:
    state, note = optimizer_state_bytes(SHAPES, PARAMS, optimizer, precision_plan(precision))
    assert state == expected
    assert note


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        # CPU default: for-loop, two temporaries of the largest tensor, 2 x 1,048,576 x 4 B
        (
            MemoryRequest(mode=Mode.TRAINING, runtime=Runtime.CPU),
            (8_388_608, TemporariesLayout.LARGEST_TWICE),
        ),
        # CUDA default: foreach, one temporary per parameter, 1,049,600 x 4 B
        (MemoryRequest(mode=Mode.TRAINING), (4_198_400, TemporariesLayout.PER_PARAMETER)),
        # bf16 state: 2 B per temporary element
        (
            MemoryRequest(mode=Mode.TRAINING, precision=Precision.BF16),
            (2_099_200, TemporariesLayout.PER_PARAMETER),
        ),
        # mixed precision defaults to the fused step, and SGD updates in place
        (
            MemoryRequest(mode=Mode.TRAINING, precision=Precision.MIXED_BF16),
            (0, TemporariesLayout.IN_PLACE),
        ),
        (
            MemoryRequest(
                mode=Mode.TRAINING, optimizer=Optimizer.SGD, optimizer_impl=OptimizerImpl.FOR_LOOP
            ),
            (0, TemporariesLayout.IN_PLACE),
        ),
    ],
)
def test_optimizer_step_temporaries(
    request_: MemoryRequest, expected: tuple[int, TemporariesLayout]
) -> None:
    found = optimizer_step_temporaries(SHAPES, PARAMS, request_, precision_plan(request_.precision))
    assert isinstance(found, StepTemporaries)
    assert (found.bytes, found.layout) == expected


@pytest.mark.parametrize(
    ("params", "element", "shard", "expected"),
    [
        (124_439_808, Fraction(4), 1, 497_759_232),  # GPT-2, fp32 gradients
        (124_439_808, Fraction(2), 8, 31_109_952),  # bf16, ZeRO-2 over 8 ranks
        (1_000_001, Fraction(2), 4, 500_001),  # 500,000.5 rounds up
    ],
)
def test_gradient_bytes(params: int, element: Fraction, shard: int, expected: int) -> None:
    assert gradient_bytes(params, element, shard) == expected


# Llama-2-7B at 4,096 tokens, batch 1: 2 x 32 layers x 32 kv heads x 128 x 4,096 elements
LLAMA2_KV_ELEMENTS = 2 * 32 * 32 * 128 * 4096


@pytest.mark.parametrize(
    ("elements", "element_bytes", "shard", "expected"),
    [
        (LLAMA2_KV_ELEMENTS, 2, 1, 2 * 1024**3),  # 0.5 MiB per token in fp16: 2 GiB
        (LLAMA2_KV_ELEMENTS, 2, 2, 1024**3),  # tensor parallel 2: each GPU its heads
        (LLAMA2_KV_ELEMENTS, 1, 1, 1024**3),  # fp8 cache
        (3, 1, 2, 2),  # rounds up
    ],
)
def test_kv_cache_bytes(elements: int, element_bytes: int, shard: int, expected: int) -> None:
    assert kv_cache_bytes(elements, element_bytes, shard) == expected


@pytest.mark.parametrize(
    ("total", "expected"),
    [
        (512 * 1024, [512 * 1024]),
        (MIB, [MIB]),
        (26 * MIB, [MIB, 25 * MIB]),
        (60 * MIB, [MIB, 25 * MIB, 25 * MIB, 9 * MIB]),
    ],
)
def test_ddp_bucket_sizes_bytes(total: int, expected: list[int]) -> None:
    assert ddp_bucket_sizes_bytes(total) == expected


@pytest.mark.parametrize(
    ("unit_params", "weight", "grad", "shard", "expected"),
    [
        # a GPT-3 175B block (12 x 12,288^2 + 13 x 12,288 params) in bf16 on one GPU per rank
        (1_812_099_072, Fraction(2), Fraction(2), 1, (3_624_198_144,) * 3),
        # the same split over tensor 8: each GPU gathers its eighth
        (1_812_099_072, Fraction(2), Fraction(2), 8, (453_024_768,) * 3),
        # fp32 gradients beside bf16 weights; 4-bit weights round up per shard
        (1_000, Fraction(2), Fraction(4), 3, (667, 667, 1_334)),
        (1_001, Fraction(1, 2), Fraction(2), 1, (501, 501, 2_002)),
    ],
)
def test_fsdp_buffer_bytes(
    unit_params: int, weight: Fraction, grad: Fraction, shard: int, expected: tuple[int, ...]
) -> None:
    assert fsdp_buffer_bytes(unit_params, weight, grad, shard) == expected


def test_weights_bytes_unquantized_are_params_times_element_bytes() -> None:
    model = ZOO["gpt-2"]
    bindings = {**model.default_bindings, "batch": 1}
    analysis = analyze(model.inputs, model.layers, bindings, training=False)
    for precision, expected in ((Precision.FP32, 497_759_232), (Precision.BF16, 248_879_616)):
        stored, notes = weights_bytes(analysis, precision_plan(precision), precision)
        assert (stored, notes) == (expected, ())


def test_int4_weights_keep_scales_and_a_16_bit_head() -> None:
    layers = [
        {"name": "fc1", "op": "linear", "out_features": 4096, "bias": False},
        {"name": "head", "op": "linear", "out_features": 10, "bias": False},
    ]
    analysis = analyze([InputDecl(name="x", shape=(1, 1024))], layers, {}, training=False)
    stored, (note,) = weights_bytes(analysis, precision_plan(Precision.INT4), Precision.INT4)
    # fc1: 4,194,304 x 0.5 B + ceil(4,194,304 / 128) groups x 4 B (fp16 scale and zero);
    # the head (the last layer with weights) stays fp16: 40,960 x 2 B
    assert stored == 2_097_152 + 131_072 + 81_920 == 2_310_144
    assert note.startswith("4,194,304 of 4,235,264 parameters quantized")
