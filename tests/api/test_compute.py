"""The compute runner (app.api.compute): deadline, client disconnect, abandoned work."""

from __future__ import annotations

import threading
import time
from typing import cast

import anyio
import pytest
from starlette.requests import Request

from app.api import compute as compute_module
from app.api.compute import Compute, ComputeOverrun
from app.domain.budget import checkpoint, current


class _Request:
    """The part of a Starlette request the runner uses: is the client still there?"""

    def __init__(self, gone_after_s: float) -> None:
        self.gone_at = time.monotonic() + gone_after_s

    async def is_disconnected(self) -> bool:
        return time.monotonic() >= self.gone_at


def _spin_until_stopped(calls: list[int]) -> None:
    while True:
        calls[0] += 1
        checkpoint()


def _runner(timeout_s: float = 30.0) -> Compute:
    return Compute(slots=2, queue_timeout_s=1.0, timeout_s=timeout_s, budget_units=1)


def test_the_result_comes_back_and_the_token_is_bound_in_the_worker_thread() -> None:
    runner = _runner()
    seen: list[object] = []

    def work() -> str:
        seen.append(current())
        seen.append(threading.current_thread() is threading.main_thread())
        return "answer"

    assert anyio.run(runner.run, work) == "answer"
    assert seen[0] is not None  # a CancelToken
    assert seen[1] is False
    assert current() is None  # nothing leaks into the caller
    assert (runner.running, runner.stuck) == (0, 0)


def test_errors_of_the_work_come_back_unwrapped() -> None:
    runner = _runner()

    def work() -> None:
        raise KeyError("bad")

    with pytest.raises(KeyError):
        anyio.run(runner.run, work)
    assert runner.running == 0


def test_work_past_its_deadline_stops_at_a_checkpoint_and_frees_its_slot() -> None:
    runner = _runner(timeout_s=0.1)
    stopped: list[str] = []
    runner.on_stopped = stopped.append
    calls = [0]
    with pytest.raises(ComputeOverrun) as caught:
        anyio.run(runner.run, lambda: _spin_until_stopped(calls))
    assert caught.value.reason == "deadline"
    assert "CAPPLAN_COMPUTE_TIMEOUT_S" in caught.value.detail
    assert calls[0] > 1
    assert stopped == ["deadline"]
    assert (runner.running, runner.stuck) == (0, 0)


def test_work_is_stopped_when_the_client_disconnects() -> None:
    runner = _runner(timeout_s=30.0)
    stopped: list[str] = []
    runner.on_stopped = stopped.append
    calls = [0]

    async def main() -> None:
        request = cast(Request, _Request(gone_after_s=0.05))
        await runner.run(lambda: _spin_until_stopped(calls), request=request)

    with pytest.raises(ComputeOverrun) as caught:
        anyio.run(main)
    assert caught.value.reason == "disconnected"
    assert stopped == ["disconnected"]
    assert (runner.running, runner.stuck) == (0, 0)


def test_work_without_checkpoints_is_abandoned_after_the_grace_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compute_module, "GRACE_S", 0.05)
    runner = _runner(timeout_s=0.05)
    stuck: list[int] = []
    runner.on_stuck = stuck.append
    release = threading.Event()
    with pytest.raises(ComputeOverrun) as caught:
        anyio.run(runner.run, lambda: release.wait(10))
    assert caught.value.reason == "deadline"
    assert (runner.running, runner.stuck) == (0, 1)  # slot free, thread still out
    release.set()
    for _ in range(200):
        if runner.stuck == 0:
            break
        time.sleep(0.01)
    assert runner.stuck == 0
    assert stuck == [1, -1]
