"""Work budgets and cooperative cancellation (app.domain.budget)."""

from __future__ import annotations

import threading
import time

import pytest

from app.domain.budget import (
    INFERENCE_LAYER_UNITS,
    PEAK_LAYER_UNITS,
    TRAINING_LAYER_UNITS,
    UNREPLAYED_LAYER_UNITS,
    CancelToken,
    GraphSize,
    WorkBudgetExceeded,
    WorkCancelled,
    WorkFactor,
    bound,
    check_budget,
    checkpoint,
    current,
    estimate_layer_units,
    estimate_work,
    graph_layers,
    work_units,
)
from app.domain.graph.analysis import InputDecl, analyze


def _linear(name: str) -> dict[str, object]:
    return {"name": name, "op": "linear", "out_features": 8}


def test_graph_layers_counts_written_and_executed_layers() -> None:
    # 2 plain + repeat(3) of [1 plain + repeat(4) of [2]]: written 2 + 1 + 1 + 1 + 2 = 7,
    # executed 2 + 1 + 3 * (1 + 1 + 4 * 2) = 33
    layers = [
        _linear("a"),
        _linear("b"),
        {
            "name": "r",
            "op": "repeat",
            "times": 3,
            "layers": [
                _linear("c"),
                {"name": "q", "op": "repeat", "times": 4, "layers": [_linear("d"), _linear("e")]},
            ],
        },
    ]
    assert graph_layers(layers) == GraphSize(written_layers=7, executed_layers=33)


def test_graph_layers_of_blocks_and_bad_records() -> None:
    layers = [
        {"name": "b", "op": "block", "times": 9, "layers": [_linear("x")]},  # block: times ignored
        {"name": "r", "op": "repeat", "times": "many", "layers": [_linear("y")]},  # counts once
        {"name": "t", "op": "repeat", "times": True, "layers": [_linear("z")]},
        "not a layer",
    ]
    assert graph_layers(layers) == GraphSize(written_layers=7, executed_layers=7)
    assert graph_layers([]) == GraphSize(written_layers=0, executed_layers=0)


def test_gpt3_sized_repeat_is_counted_without_walking_it() -> None:
    body = [_linear(f"l{i}") for i in range(8)]
    layers = [{"name": "blocks", "op": "repeat", "times": 99_999, "layers": body}]
    size = graph_layers(layers)
    assert size == GraphSize(written_layers=9, executed_layers=1 + 8 * 99_999)


def test_work_units_is_the_product_of_the_factors() -> None:
    estimate = work_units(
        WorkFactor(name="graph layers", value=1_000, field="/architecture/layers"),
        WorkFactor(name="devices", value=120, field="/devices"),
        WorkFactor(name="precisions", value=4, field="/precisions"),
        WorkFactor(name="batch sizes", value=17, field="/max_batch_size"),
    )
    assert estimate.units == 8_160_000
    assert estimate.describe() == (
        "1,000 graph layers x 120 devices x 4 precisions x 17 batch sizes"
    )
    # A factor of 0 (an empty list) still costs one pass.
    assert work_units(WorkFactor(name="layers", value=0, field="/layers")).units == 1


def test_check_budget_names_the_figures_and_what_to_reduce() -> None:
    estimate = work_units(
        WorkFactor(name="graph layers", value=1_000, field="/architecture/layers"),
        WorkFactor(name="devices", value=1, field="/devices"),
        WorkFactor(name="batch sizes", value=17, field="/max_batch_size"),
    )
    assert check_budget(estimate, 17_000, setting="CAPPLAN_MAX_WORK_UNITS") is estimate
    with pytest.raises(WorkBudgetExceeded) as caught:
        check_budget(estimate, 16_999, setting="CAPPLAN_MAX_WORK_UNITS")
    assert str(caught.value) == (
        "this request asks for 17,000 work units (1,000 graph layers x 1 devices x 17 batch "
        "sizes); the limit is 16,999 (CAPPLAN_MAX_WORK_UNITS); reduce /architecture/layers "
        "(graph layers: 1,000), /max_batch_size (batch sizes: 17) so that the product is under "
        "the limit"
    )
    assert caught.value.fields == ["/architecture/layers", "/max_batch_size"]


def test_estimates_of_a_graph_count_executed_layers_by_mode() -> None:
    size = GraphSize(written_layers=14, executed_layers=774)  # GPT-3 175B
    estimates = WorkFactor(name="estimates", value=15, field="/workload/batch_size")
    inference = estimate_work(size, estimates, field="/workload/model", training=False)
    training = estimate_work(size, estimates, field="/workload/model", training=True)
    assert inference.units == INFERENCE_LAYER_UNITS * 774 * 15 == 232_200
    assert training.units == TRAINING_LAYER_UNITS * 774 * 15 == 2_322_000
    assert inference.describe() == "20 x 774 executed layers x 15 estimates"


def test_estimates_past_the_allocator_replay_cost_the_same_per_layer_in_either_mode() -> None:
    size = GraphSize(written_layers=11, executed_layers=99_991)
    once = WorkFactor(name="estimates", value=1, field="/batch_size")
    for training in (False, True):
        work = estimate_work(size, once, field="/model", training=training, replayed=False)
        assert work.units == UNREPLAYED_LAYER_UNITS * 99_991 == 1_499_865
    assert estimate_layer_units(training=True, replayed=True) == TRAINING_LAYER_UNITS == 200
    assert estimate_layer_units(training=False, replayed=True) == INFERENCE_LAYER_UNITS == 20


def test_work_estimates_add_up_and_name_each_field_once() -> None:
    layers = "/architecture/layers"
    precisions = WorkFactor(name="precisions", value=4, field="/precisions")
    batches = WorkFactor(name="batch sizes", value=9, field="/max_batch_size")
    total = work_units(
        WorkFactor(name="graph layers", value=1_000, field=layers),
        WorkFactor(name="devices", value=144, field="/devices"),
        precisions,
        batches,
    ) + work_units(
        WorkFactor(name="executed layers", value=1_000, field=layers),
        precisions,
        batches,
        weight=PEAK_LAYER_UNITS,
    )
    assert total.units == 1_000 * 144 * 4 * 9 + 10 * 1_000 * 4 * 9 == 5_544_000
    assert total.describe() == (
        "1,000 graph layers x 144 devices x 4 precisions x 9 batch sizes + 10 x 1,000 executed "
        "layers x 4 precisions x 9 batch sizes"
    )
    with pytest.raises(WorkBudgetExceeded) as caught:
        check_budget(total, 4_000_000, setting="CAPPLAN_MAX_WORK_UNITS")
    assert caught.value.fields == [layers, "/devices", "/max_batch_size", "/precisions"]


def test_checkpoint_without_a_token_does_nothing() -> None:
    assert current() is None
    for _ in range(3):
        checkpoint()


def test_checkpoint_raises_once_the_token_is_cancelled() -> None:
    token = CancelToken.after(60.0)
    with bound(token):
        checkpoint()
        token.cancel("client disconnected")
        with pytest.raises(WorkCancelled) as caught:
            checkpoint()
    assert caught.value.reason == "client disconnected"
    assert current() is None  # unbound again after the block


def test_checkpoint_raises_once_the_deadline_has_passed() -> None:
    token = CancelToken(time.monotonic() + 0.05, 0.05)
    calls = 0

    def spin() -> None:
        nonlocal calls
        while True:
            calls += 1
            checkpoint()

    with bound(token), pytest.raises(WorkCancelled) as caught:
        spin()
    assert time.monotonic() >= token.deadline
    assert caught.value.reason == "deadline"
    assert caught.value.deadline_s == 0.05
    assert calls > 1
    assert token.reason == "deadline"
    assert token.expired()


def test_a_token_bound_in_one_thread_is_not_seen_in_another() -> None:
    token = CancelToken.after(60.0)
    token.cancel()
    seen: list[object] = []
    with bound(token):
        worker = threading.Thread(target=lambda: seen.append(current()))
        worker.start()
        worker.join()
    assert seen == [None]


def test_cancel_keeps_the_first_reason() -> None:
    token = CancelToken.after(60.0)
    assert not token.expired()
    token.cancel("client disconnected")
    token.cancel("deadline")
    assert token.reason == "client disconnected"


class _CancelAfterChecks(CancelToken):
    """A token that cancels itself at its ``checks``-th check (counts where checkpoints are)."""

    __slots__ = ("left",)

    def __init__(self, checks: int) -> None:
        super().__init__(float("inf"), 1.0)
        self.left = checks

    def check(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.cancel("test")
        super().check()


def test_the_iterations_of_a_long_repeat_pass_checkpoints() -> None:
    """Cloning 99,998 iterations of a repeat took ~0.3 s without a checkpoint (the walk checks
    once per written layer): now one per CHECK_EVERY iterations stops it midway."""
    inputs = (InputDecl(name="x", shape=("batch", 64)),)
    layers = [
        {
            "name": "stack",
            "op": "repeat",
            "times": 99_999,
            "layers": [{"name": "fc", "op": "linear", "out_features": 64}],
        }
    ]
    token = _CancelAfterChecks(20)
    with bound(token), pytest.raises(WorkCancelled):
        analyze(inputs, layers, {"batch": 1}, training=False)
    assert token.reason == "test"
    finished = analyze(inputs, layers, {"batch": 1}, training=False)  # unbound: no checks
    assert len(finished.layers) == 99_999
