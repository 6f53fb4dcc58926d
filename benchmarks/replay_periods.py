"""How much of a training step's allocator replay a skip over repeated blocks could leave out.

Run: .venv/bin/python benchmarks/replay_periods.py [SLUG ...]   (default: llama-3-8b gpt-3-175b)

A skip needs the allocator's decisions to repeat from block to block up to a shift that grows
linearly with the block index (a free block carved by 8 MiB per block, a count of cached
blocks growing by one). This measures that on the events ``estimate_memory`` replays (the
CUDA defaults of ``benchmarks/estimate_speed.py``): each event is replayed one at a time and
described by the allocator's decision (allocation: its pool, its rounded size, whether it
opened a segment, the size of the cached block it took and the events since that block was
made; free: the events since its allocation and the sizes of the free blocks it left). An
event is *affine* at period P when the events P and 2P earlier have its kind and rounded size
and each number of the three descriptions has a second difference of 0. Per pool (blocks
never move between pools, so each pool can be skipped on its own) and per iteration (first,
steady), it prints the share of events that are affine at some period, and the share that lie
in runs affine at one period P >= 3 for at least two periods, past the first period of the
run: what a skip that replays one period to learn the shift could leave out, at most (the
proof that best fit decides the same for every block of the run is not attempted here).
Slow (a replay per event): about a minute for GPT-3 175B.
"""

from __future__ import annotations

import sys
from typing import Any, cast
from unittest.mock import patch

import app.domain.memory.cuda_allocator as cuda_allocator
import app.domain.memory.cuda_runtime as engine
from app.domain.memory.cuda_allocator import CachingAllocator, Event, Handle, round_size
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import Mode
from app.domain.zoo import ZOO

CASES = {
    "gpt-3-175b": (Precision.MIXED_BF16, {"batch": 1, "seq": 2048}),
    "llama-3-8b": (Precision.BF16, {"batch": 8, "seq": 8192}),
}
MAX_PERIOD = 200  # events of one pool


def _events(slug: str) -> tuple[list[Event], int]:
    """The training step's events and where the steady iteration starts."""
    precision, bindings = CASES[slug]
    captured: list[tuple[list[Event], int]] = []
    original = cuda_allocator.replay_steady

    def capture(events: Any, steady_from: int, **kwargs: Any) -> Any:
        captured.append((list(events), steady_from))
        return original(events, steady_from, **kwargs)

    with patch.object(engine, "replay_steady", capture):
        model = ZOO[slug]
        request = MemoryRequest(mode=Mode.TRAINING, precision=precision)
        estimate_memory(analyze_for(model.inputs, model.layers, bindings, request), request)
    return captured[0]


def _flat(events: list[Event], steady_from: int) -> list[tuple[Event, bool]]:
    """One allocation or free per event ("keep" and "scratch" taken apart), with whether it
    belongs to the steady iteration."""
    flat: list[tuple[Event, bool]] = []
    for index, (kind, key, size) in enumerate(events):
        steady = index >= steady_from
        if kind == "keep":
            kept = cast(tuple[int, ...], key)
            flat += [(("alloc", ("keep", index, i), s), steady) for i, s in enumerate(kept)]
        elif kind == "scratch":
            flat += [(("alloc", ("scratch", index), size), steady)]
            flat += [(("free", ("scratch", index), 0), steady)]
        else:
            flat.append(((kind, key, size), steady))
    return flat


def _described(
    flat: list[tuple[Event, bool]],
) -> list[tuple[bool, tuple[Any, ...], tuple[Any, ...]]]:
    """Per event: small pool or not, (kind, rounded size), and the decision's numbers."""
    allocator = CachingAllocator()
    handles: dict[object, Handle] = {}
    made: dict[int, int] = {}  # free block address -> the event that made it
    born: dict[object, int] = {}  # key -> the event that allocated it
    sizes: dict[object, int] = {}
    out: list[tuple[bool, tuple[Any, ...], tuple[Any, ...]]] = []
    for index, ((kind, key, size), _) in enumerate(flat):
        before = dict(allocator._free_at)
        segments = allocator.segments
        allocator.run(((kind, key, size),), handles)
        after = allocator._free_at
        changed = [a for a in after if before.get(a) != after[a]]
        if kind == "alloc":
            address = handles[key][0]
            born[key], sizes[key] = index, size
            if allocator.segments > segments:
                numbers: tuple[Any, ...] = (1, allocator.reserved, 0)
            else:
                numbers = (0, before[address], index - made.get(address, 0))
            signature: tuple[Any, ...] = (kind, round_size(size))
            small = round_size(size) <= cuda_allocator.SMALL_REQUEST_BYTES
        else:
            numbers = (index - born[key], tuple(sorted(after[a] for a in changed)))
            signature = (kind,)
            small = round_size(sizes[key]) <= cuda_allocator.SMALL_REQUEST_BYTES
        for address in changed:
            made[address] = index
        out.append((small, signature, numbers))
    return out


def _affine(x: Any, y: Any, z: Any) -> bool:
    """Whether every number of three descriptions has a second difference of 0."""
    if isinstance(x, tuple):
        return len(x) == len(y) == len(z) and all(
            _affine(a, b, c) for a, b, c in zip(x, y, z, strict=True)
        )
    return bool(x - 2 * y + z == 0)


def _shares(rows: list[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> tuple[int, int]:
    """Events affine at some period; events in runs affine at one period P >= 3 for at least
    two periods, past the run's first period."""
    anywhere = 0
    passes: dict[int, list[int]] = {}
    for i, (signature, numbers) in enumerate(rows):
        hit = False
        for period in range(1, min(MAX_PERIOD, i // 2) + 1):
            earlier, earliest = rows[i - period], rows[i - 2 * period]
            if earlier[0] == earliest[0] == signature and _affine(numbers, earlier[1], earliest[1]):
                hit = True
                passes.setdefault(period, []).append(i)
        anywhere += hit
    covered: set[int] = set()
    for period, indices in passes.items():
        if period < 3:
            continue
        run: list[int] = []
        for i in [*indices, -1]:
            if run and i != run[-1] + 1:
                if len(run) >= 2 * period:
                    covered.update(run[period:])
                run = []
            if i >= 0:
                run.append(i)
    return anywhere, len(covered)


def main() -> None:
    for slug in sys.argv[1:] or ["llama-3-8b", "gpt-3-175b"]:
        events, steady_from = _events(slug)
        flat = _flat(events, steady_from)
        described = _described(flat)
        print(f"{slug} training: {len(events):,} events, {len(flat):,} allocations and frees")
        print(f"  {'pool':<6} {'iteration':<9} {'events':>7} {'affine':>7} {'in runs':>8}")
        for small in (False, True):
            for steady in (False, True):
                rows = [
                    (signature, numbers)
                    for (is_small, signature, numbers), (_, in_steady) in zip(
                        described, flat, strict=True
                    )
                    if is_small == small and in_steady == steady
                ]
                anywhere, covered = _shares(rows)
                n = max(1, len(rows))
                print(
                    f"  {'small' if small else 'large':<6} {'steady' if steady else 'first':<9} "
                    f"{len(rows):>7,} {100 * anywhere / n:>6.1f}% {100 * covered / n:>7.1f}%"
                )


if __name__ == "__main__":
    main()
