"""Caches shared by the use cases (pure functions of their key), and a pause of the cyclic
garbage collector for use cases that build large object graphs."""

from __future__ import annotations

import gc
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from prometheus_client import Counter

K = TypeVar("K", bound=Hashable)

# Registered by each app's metrics (app.api.metrics); with several worker processes the values
# are written to PROMETHEUS_MULTIPROC_DIR and summed over the workers.
CACHE_LOOKUPS = Counter(
    "capplan_cache_lookups_total",
    "Lookups in the in-process answer caches by cache and result (hit or miss); hit rate = "
    "hit / (hit + miss). Caches: admission_decisions and mig_fits (valid in one generation of "
    "the planning data: an answer of an older generation is a miss), estimate_runs, "
    "graph_analyses, request_shapes, memory_peaks.",
    ["cache", "result"],
    registry=None,
)


class LookupCounter:
    """Hits and misses of one named cache (the labelled children, bound once: a lookup costs
    one increment)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._hit = CACHE_LOOKUPS.labels(name, "hit")
        self._miss = CACHE_LOOKUPS.labels(name, "miss")

    def count(self, hit: bool) -> None:
        """Count one lookup."""
        (self._hit if hit else self._miss).inc()


V = TypeVar("V")


class LruCache(Generic[K, V]):
    """A small thread-safe LRU for pure functions of their key."""

    def __init__(self, size: int, name: str | None = None) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        # Named caches count their lookups (capplan_cache_lookups_total).
        self._lookups = LookupCounter(name) if name else None

    def get(self, key: K) -> V | None:
        """The value for ``key``, or None (and mark it recently used)."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
        if self._lookups is not None:
            self._lookups.count(value is not None)
        return value

    def put(self, key: K, value: V) -> None:
        """Store ``value``, evicting the least recently used beyond ``size``."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (benchmarks time cold requests)."""
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


_PAUSE_LOCK = threading.Lock()
_pause_depth = 0  # callers inside collector_paused(), all threads
_pause_reenable = False  # whether the collector was enabled when the first of them entered
_paused_since = 0.0  # time.monotonic() when the collector was last switched off or run
# Overlapping callers keep the collector off; under a steady stream of them it would never come
# back on and cyclic garbage would pile up. A caller that leaves while others are still inside
# runs a full collection itself once the pause has lasted this long.
MAX_PAUSE_S = 10.0


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with Python's cyclic garbage collector off (reference counting still
    frees everything that is not in a cycle); it is switched back on when the last caller in
    any thread leaves, if it was on when the first one came in.

    A recommendation builds ~250,000 long-lived objects (kernels, GEMMs, layer records, memory
    estimates) that it drops when it returns. While the heap grows like that, the collector runs
    a full collection every time the objects that survived since the last one exceed a quarter
    of the heap: about six full scans of a growing heap for GPT-3 175B, half of a cold request's
    CPU time. With the collector paused, what the request left behind is scanned once, by the
    next young collection after it. Under overlapping callers the pause lasts at most about
    :data:`MAX_PAUSE_S`: a caller that leaves after that runs a full collection.
    """
    global _pause_depth, _pause_reenable, _paused_since
    with _PAUSE_LOCK:
        if _pause_depth == 0:
            _pause_reenable = gc.isenabled()
            _paused_since = time.monotonic()
            gc.disable()
        _pause_depth += 1
    try:
        yield
    finally:
        collect = False
        with _PAUSE_LOCK:
            _pause_depth -= 1
            if _pause_depth == 0 and _pause_reenable:
                gc.enable()
            elif _pause_depth > 0 and _pause_reenable:
                now = time.monotonic()
                if now - _paused_since >= MAX_PAUSE_S:
                    _paused_since, collect = now, True
        if collect:
            gc.collect()  # others are still inside: bound the pause (MAX_PAUSE_S)
