"""``context_free`` (app.domain.memory.cuda_runtime): an estimate's peak is that of the request
without its CUDA context (and, off CUDA, without its framework overhead) plus the context, so a
caller may share one estimate between devices that differ only there (the recommendation's
memo, app.services.recommendation_source)."""

from __future__ import annotations

from dataclasses import replace

import app.domain.memory.estimate as M
from app.domain.memory.cuda_runtime import context_bytes, context_free
from app.domain.units import MIB
from app.domain.workload import Mode, Runtime
from tests.domain.test_memory_memo import _Memo
from tests.domain.test_memory_snapshot import _cases


def test_the_context_only_adds_to_the_peak() -> None:
    """Configurations of the memory snapshot (every model, runtime and allocator option; every
    7th inference and every 23rd training one, to keep the test short: both prime to the 20
    variants per precision and runtime), estimated with their
    own CUDA context and with 256 MiB, have the peak (and at inference the floor,
    inference_floor_bytes) of their context-free request plus that context."""
    plans, replays = _Memo(), _Memo()
    checked = dict.fromkeys(Runtime, 0)
    for index, (_, analysis, request, _) in enumerate(_cases()):
        if index % (7 if request.mode is Mode.INFERENCE else 23):
            continue
        try:
            free = M.estimate_memory(analysis, context_free(request), plans=plans, replays=replays)
        except M.MemoryInputError:
            continue
        other = replace(
            request.overhead,
            cuda_context_bytes=256 * MIB,
            context_default="CUDA context 256 MiB (a test's)",
        )
        for asked in (request, replace(request, overhead=other)):
            assert context_free(asked) == context_free(request)
            peak = M.estimate_memory(analysis, asked, plans=plans, replays=replays).peak_bytes
            assert peak == free.peak_bytes + context_bytes(asked)
            if request.mode is Mode.INFERENCE:  # and so is its floor
                floor = M.inference_floor_bytes(analysis, asked, plans=plans)
                free_floor = M.inference_floor_bytes(analysis, context_free(asked), plans=plans)
                assert floor == free_floor + context_bytes(asked)
        checked[request.runtime] += 1
    assert all(count > 100 for count in checked.values()), checked


def test_off_cuda_the_overhead_is_dropped_and_on_cuda_only_the_context() -> None:
    """A CPU request loses its whole framework overhead (nothing off CUDA reads it); a CUDA
    request keeps the workspace, the allocator options and its replay, loses the context."""
    _, _, request, _ = next(c for c in _cases() if c[2].mode is Mode.INFERENCE)
    overhead = replace(
        request.overhead, workspace_bytes=32 * MIB, expandable_segments=True, cuda_context_bytes=1
    )
    cpu = context_free(replace(request, runtime=Runtime.CPU, overhead=overhead))
    assert cpu.overhead == M.MemoryRequest(mode=Mode.INFERENCE).overhead
    assert context_bytes(replace(request, runtime=Runtime.CPU, overhead=overhead)) == 0
    cuda = context_free(replace(request, runtime=Runtime.CUDA, overhead=overhead))
    assert cuda.overhead.workspace_bytes == 32 * MIB
    assert cuda.overhead.expandable_segments
    assert cuda.overhead.cuda_context_bytes == 0
    assert context_bytes(replace(request, runtime=Runtime.CUDA, overhead=overhead)) == 1
