"""Two independent ways to measure the live bytes held by PyTorch's CPU allocator.

Both trackers only see what is allocated *inside* the measured region; the caller adds the
bytes that were already live before it (``baseline``) to turn "max extra" into an absolute peak.

* :class:`ProfilerTimeline` replays the ``[memory]`` events that ``torch.profiler`` records
  from the c10 CPU allocator (every ``malloc``/``free`` with its signed size, including
  temporaries that kernels allocate internally and oneDNN buffers, which PyTorch routes through
  the same allocator). The running sum of the deltas is the live-bytes timeline.
* :class:`StorageTracker` is a ``TorchDispatchMode`` that sees every ATen op's outputs and tracks
  each new output storage until a ``weakref.finalize`` on it fires. It cannot see temporaries
  a kernel allocates and frees internally, so it reads lower than the profiler exactly where a
  kernel has such temporaries; elsewhere the two agree byte for byte.

:class:`MemoryMeter` runs both at once and labels the timeline with phases
(``forward``/``backward``/``optimizer``) so the peak can be attributed to one of them.
"""

from __future__ import annotations

import os
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C._autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

PHASE_PREFIX = "phase::"


@dataclass(frozen=True)
class RegionPeak:
    """What one tracker saw in a measured region, in bytes relative to the region's start."""

    peak_extra: int
    peak_phase: str | None
    final_extra: int
    phase_peaks: dict[str, int]


@contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Silence fd 2 (Kineto prints a log line on every profiler start and stop)."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)


def storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    """Identify a CPU tensor's storage by ``(data_ptr, nbytes)``; ``None`` if it has none."""
    if t.device.type != "cpu" or t.layout != torch.strided:
        return None
    storage = t.untyped_storage()
    ptr = storage.data_ptr()
    return (ptr, storage.nbytes()) if ptr else None


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct CPU storages behind ``tensors`` (views and ties counted once)."""
    keys = {key for t in tensors if (key := storage_key(t)) is not None}
    return sum(nbytes for _, nbytes in keys)


class ProfilerTimeline:
    """Live-bytes timeline rebuilt from ``torch.profiler``'s allocator events."""

    def __init__(self) -> None:
        self._prof = profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False
        )
        self.result: RegionPeak | None = None
        self.op_names: Counter[str] = Counter()

    def __enter__(self) -> ProfilerTimeline:
        with _stderr_silenced():
            self._prof.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with _stderr_silenced():
            self._prof.stop()
        events = self._prof.profiler.kineto_results.events()  # type: ignore[union-attr]
        phases: list[tuple[int, int, str]] = []
        deltas: list[tuple[int, int, int]] = []
        for index, event in enumerate(events):
            name = event.name()
            if name == "[memory]":
                if event.device_type() == DeviceType.CPU:
                    deltas.append((event.start_ns(), index, event.nbytes()))
            elif name.startswith(PHASE_PREFIX):
                phases.append((event.start_ns(), event.end_ns(), name[len(PHASE_PREFIX) :]))
            elif name.startswith("aten::"):
                self.op_names[name] += 1
        deltas.sort()
        live = peak = 0
        peak_phase: str | None = None
        phase_peaks: dict[str, int] = {}
        for time_ns, _, nbytes in deltas:
            live += nbytes
            phase = next((p for start, end, p in phases if start <= time_ns <= end), None)
            if phase is not None:
                phase_peaks[phase] = max(phase_peaks.get(phase, 0), live)
            if live > peak:
                peak, peak_phase = live, phase
        self.result = RegionPeak(peak, peak_phase, live, phase_peaks)


class StorageTracker(TorchDispatchMode):
    """Track live bytes of storages created by ATen ops (second, independent method)."""

    def __init__(self) -> None:
        super().__init__()
        self.phase: str | None = None
        self.op_names: Counter[str] = Counter()
        self._live: dict[int, int] = {}
        self._finalizers: list[weakref.finalize[Any, Any]] = []
        self._current = 0
        self._peak = 0
        self._peak_phase: str | None = None
        self._phase_peaks: dict[str, int] = {}

    def _release(self, ptr: int) -> None:
        self._current -= self._live.pop(ptr, 0)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self.op_names[f"aten::{func.overloadpacket.__name__}"] += 1
        known = {
            key[0]
            for leaf in tree_leaves((args, kwargs))
            if isinstance(leaf, torch.Tensor) and (key := storage_key(leaf)) is not None
        }
        out = func(*args, **kwargs)
        for leaf in tree_leaves(out):
            if not isinstance(leaf, torch.Tensor):
                continue
            key = storage_key(leaf)
            if key is None or key[0] in known or key[0] in self._live:
                continue
            ptr, nbytes = key
            self._live[ptr] = nbytes
            self._current += nbytes
            self._finalizers.append(weakref.finalize(leaf.untyped_storage(), self._release, ptr))
            known.add(ptr)
        if self._current > self._peak:
            self._peak, self._peak_phase = self._current, self.phase
        if self.phase is not None:
            self._phase_peaks[self.phase] = max(self._phase_peaks.get(self.phase, 0), self._current)
        return out

    def result(self) -> RegionPeak:
        """Peak and final live bytes of the region (call after the mode has exited)."""
        for finalizer in self._finalizers:
            finalizer.detach()
        return RegionPeak(self._peak, self._peak_phase, self._current, dict(self._phase_peaks))


@dataclass
class MemoryMeter:
    """Run :class:`ProfilerTimeline` and :class:`StorageTracker` over the same region."""

    profiler: ProfilerTimeline = field(default_factory=ProfilerTimeline)
    tracker: StorageTracker = field(default_factory=StorageTracker)

    def __enter__(self) -> MemoryMeter:
        self.profiler.__enter__()
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.tracker.__exit__(*exc)
        self.profiler.__exit__(*exc)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Label the allocations made inside this block with ``name``."""
        self.tracker.phase = name
        try:
            with record_function(PHASE_PREFIX + name):
                yield
        finally:
            self.tracker.phase = None

    @property
    def profiler_result(self) -> RegionPeak:
        """The profiler's reading (primary method)."""
        assert self.profiler.result is not None, "region not finished"
        return self.profiler.result

    @property
    def tracker_result(self) -> RegionPeak:
        """The dispatch-mode reading (cross-check)."""
        return self.tracker.result()

    def ops(self) -> set[str]:
        """Every ATen op name either tracker saw run in the region."""
        return set(self.profiler.op_names) | set(self.tracker.op_names)
