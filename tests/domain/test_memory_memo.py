"""The memos a caller keeps across estimates (``plans=``, ``replays=``) change no figure: every
configuration of the memory snapshot, estimated in order with both memos shared (analyses
reused across precisions, runtimes and options hit them), gives the snapshot's entry."""

from __future__ import annotations

import json
from typing import Any

import app.domain.memory.estimate as M
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
