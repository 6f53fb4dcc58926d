"""Runs of identical blocks in an inference forward's allocator events (a transformer's
layers), found on the events alone, for :meth:`CachingAllocator.run_blocks
<app.domain.memory.cuda_allocator.CachingAllocator.run_blocks>` to skip once the allocator's
state repeats from block to block. Speed only: a skip is taken only where it provably changes
nothing (see ``run_blocks``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from operator import eq, itemgetter
from typing import Any, NamedTuple

from app.domain.memory.cuda_allocator import Blocks, Event
from app.domain.memory.memo import PlanMemo

MIN_BLOCKS = 3  # a run needs a block to learn from, one to compare, one to skip
CANDIDATES = 2  # periods tried, the most common distances first


def _signatures(events: Sequence[Event]) -> list[object]:
    """Per event, what it does without its key, equal where two events do the same: a free,
    the distance back to the allocation of its key (a positive int; a unique marker for a key
    allocated before ``events``); an allocation of ``n`` bytes -2n - 1 and a transient of ``n``
    bytes -2n - 2 (negative ints, odd and even: no tuple per event); a "keep", itself."""
    allocated_at: dict[object, int] = {}
    signatures: list[object] = []
    add = signatures.append
    for index, (kind, key, size) in enumerate(events):
        if kind == "free":
            at = allocated_at.get(key)
            add(index - at if at is not None else ("before", index))
        elif kind == "alloc":
            allocated_at[key] = index
            add(-2 * size - 1)
        elif kind == "scratch":
            add(-2 * size - 2)
        else:  # "keep"
            add((kind, key))
    return signatures


def _periods(signatures: list[object]) -> list[int]:
    """Candidate periods: the events that occur once per block occur as often as each other,
    so of the counts that most distinct events share (at least :data:`MIN_BLOCKS`), the
    distance between the first two occurrences of an event of that count."""
    counts = Counter(signatures)
    shared = Counter(count for count in counts.values() if count >= MIN_BLOCKS)
    periods: list[int] = []
    for count, _ in shared.most_common(CANDIDATES):
        event = next(event for event, seen in counts.items() if seen == count)
        first = signatures.index(event)
        periods.append(signatures.index(event, first + 1) - first)
    return periods


def _refs(signatures: Sequence[object], start: int, period: int) -> tuple[int, ...] | None:
    """Offsets (from ``start``, negative) of the allocations before a block that its frees
    release; None when one reaches back further than one block."""
    refs = []
    for offset in range(period):
        distance = signatures[start + offset]
        if type(distance) is int and distance > 0:  # a free
            target = offset - distance
            if target < -period:
                return None
            if target < 0:
                refs.append(target)
    return tuple(sorted(refs))


def find_blocks(events: Sequence[Event]) -> list[Blocks]:
    """The maximal runs of at least :data:`MIN_BLOCKS` blocks of one period in ``events``:
    each event of a block is the one a period earlier (kind, bytes, and for a free the same
    distance back to its allocation), and a block's frees release only its own allocations
    and those of the block before it. The period: of the candidates :func:`_periods` names,
    the one whose runs cover the most events. Finding none, or fewer, only costs speed."""
    signatures = _signatures(events)
    best: list[Blocks] = []
    covered = 0
    for period in _periods(signatures):
        found = _runs(signatures, period)
        if sum(block.repeats for block in found) * period > covered:
            best, covered = found, sum(block.repeats for block in found) * period
    return best


class _Searched(NamedTuple):
    """A forward :func:`find_blocks` searched, by its events' kinds, keys and bytes."""

    kinds: list[str]
    keys: list[object]
    sizes: list[int]
    distinct: list[int]  # its distinct sizes, in order of first occurrence
    first_at: list[int]  # where each of them first occurs
    blocks: list[Blocks]


_KIND, _KEY, _SIZE = itemgetter(0), itemgetter(1), itemgetter(2)


def find_blocks_like(
    events: Sequence[Event],
    memo: PlanMemo | None,
    split: tuple[list[str], list[Any], list[int]] | None = None,
) -> list[Blocks]:
    """:func:`find_blocks`, searched once per shape of forward: the forwards of one model at
    other batch sizes and precisions have the same events but for their bytes. A forward with
    the kinds and keys of the one searched last (``memo``), whose bytes are that one's renamed
    one-to-one (equal where and only where that one's are equal), has the same signatures
    renamed one-to-one (:func:`_signatures`: a free's distance and a keep depend on kinds and
    keys only, an allocation's and a transient's on their kind and bytes), so the same counts,
    periods and runs, and gets that one's blocks without a search: per event a list
    comparison and a dict lookup instead of the search's signature, counting and matching.
    ``split``: the events' kinds, keys and bytes, if known (the lists of a template its
    forwards share: compared by identity before element by element)."""
    if memo is None:
        return find_blocks(events)
    if split is None:
        split = list(map(_KIND, events)), list(map(_KEY, events)), list(map(_SIZE, events))
    kinds, keys, sizes = split
    slot = ("forward blocks by shape", len(events), *keys[:1], *keys[-1:])
    found = memo.get(slot)
    if (
        isinstance(found, _Searched)
        and (found.kinds is kinds or found.kinds == kinds)
        and (found.keys is keys or found.keys == keys)
    ):
        renamed = {size: sizes[at] for size, at in zip(found.distinct, found.first_at, strict=True)}
        if len(set(renamed.values())) == len(renamed) and (
            list(map(renamed.__getitem__, found.sizes)) == sizes
        ):
            return found.blocks
    blocks = find_blocks(events)
    first: dict[int, int] = {}
    for at, size in enumerate(sizes):
        first.setdefault(size, at)
    memo.put(slot, _Searched(kinds, keys, sizes, list(first), list(first.values()), blocks))
    return blocks


def _runs(signatures: Sequence[object], period: int) -> list[Blocks]:
    """:func:`find_blocks` at one ``period``: where each event is the one ``period`` later."""
    found: list[Blocks] = []
    # 1 where an event is the one a period later
    alike = bytes(map(eq, signatures, signatures[period:]))
    for run in re.finditer(rb"\x01{%d,}" % ((MIN_BLOCKS - 1) * period), alike):
        start = run.start()
        refs = _refs(signatures, start, period)
        if refs is not None:
            found.append(Blocks(start, period, (run.end() - start + period) // period, refs))
    return found


def shifted(blocks: Sequence[Blocks], offset: int, insert_at: int | None = None) -> list[Blocks]:
    """``blocks`` found in a forward, for the copy of it that starts at event ``offset``;
    ``insert_at``: one event was inserted before the forward's event of that index (the
    warm-up's cuBLAS workspace), so the blocks that it or their predecessor spans are
    dropped and those after it move by one."""
    moved: list[Blocks] = []
    for start, period, count, refs in blocks:
        if insert_at is None:
            moved.append(Blocks(start + offset, period, count, refs))
            continue
        before = max(0, min(count, (insert_at - start) // period))  # blocks ending by it
        if before >= MIN_BLOCKS:
            moved.append(Blocks(start + offset, period, before, refs))
        first = max(0, -(-(insert_at - start) // period) + 1)  # predecessor starts after it
        if count - first >= MIN_BLOCKS:
            moved.append(Blocks(start + first * period + offset + 1, period, count - first, refs))
    return moved
