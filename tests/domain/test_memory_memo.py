"""The memos a caller keeps across estimates (``plans=``, ``replays=``) change no figure: every
configuration of the memory snapshot, estimated in order with both memos shared (analyses
reused across precisions, runtimes and options hit them), gives the snapshot's entry."""

from __future__ import annotations

import json
from typing import Any

import app.domain.memory.estimate as M
from app.domain.workload import Mode
from tests.domain.test_memory_snapshot import SNAPSHOT, _cases, _entry


class _Memo:
    """An unbounded memo."""

    def __init__(self) -> None:
        self.items: dict[tuple[object, ...], Any] = {}
        self.hits = 0

    def get(self, key: tuple[object, ...], /) -> Any:
        found = self.items.get(key)
        self.hits += found is not None
        return found

    def put(self, key: tuple[object, ...], value: Any, /) -> None:
        self.items[key] = value


def test_memoised_estimates_match_the_snapshot() -> None:
    expected: dict[str, list[Any]] = json.loads(SNAPSHOT.read_text())
    plans, replays = _Memo(), _Memo()
    changed = []
    for label, analysis, request, per_layer in _cases():
        try:
            estimate: M.MemoryEstimate | str = M.estimate_memory(
                analysis, request, per_layer=per_layer, plans=plans, replays=replays
            )
        except M.MemoryInputError as exc:
            estimate = str(exc)
        if _entry(estimate) != expected[label]:
            changed.append(label)
    assert not changed, f"{len(changed)} memoised estimates changed: {changed[:20]}"
    assert plans.hits > 1000


def test_the_inference_floor_is_the_weights_kv_cache_workspace_and_context_lines() -> None:
    """inference_floor_bytes is the sum of the estimate's weights, KV cache, workspace and CUDA
    context lines (so never above its peak); explain=False changes no byte."""
    plans = _Memo()
    checked = 0
    for _, analysis, request, _ in _cases():
        if request.mode is not Mode.INFERENCE:
            continue
        try:
            estimate = M.estimate_memory(analysis, request)
        except M.MemoryInputError:
            continue
        lines = {line.key: line.bytes for line in estimate.lines}
        floor = sum(lines.get(key, 0) for key in ("weights", "kv_cache", "workspace"))
        floor += lines.get("cuda_context", 0)
        assert M.inference_floor_bytes(analysis, request, plans=plans) == floor
        assert floor <= estimate.peak_bytes
        terse = M.estimate_memory(analysis, request, plans=plans, explain=False)
        assert terse.peak_bytes == estimate.peak_bytes
        assert [(li.key, li.bytes) for li in terse.lines] == list(lines.items())
        checked += 1
    assert checked > 100
