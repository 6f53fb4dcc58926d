"""Golden tests: the CUDA runtime rules read from PyTorch's source (each names its file)."""

from __future__ import annotations

import pytest

from app.domain.hardware import FrameworkOverhead, cublas_workspace


@pytest.mark.parametrize(
    ("architecture", "workspace_bytes"),
    [
        ("Hopper GH100", 32 * 2**20),  # sm90: ":4096:8"
        ("Hopper GH100 + Grace (72x Neoverse V2)", 32 * 2**20),
        ("Blackwell", 32 * 2**20),  # sm100 (PR #175344)
        ("Blackwell GB202", 32 * 2**20),  # sm120
        ("Ampere GA100", 2 * 4096 * 1024 + 8 * 16 * 1024),  # ":4096:2:16:8" = 8,519,680 B
        ("Ada Lovelace AD102", 8_519_680),
        ("Volta GV100", 8_519_680),
        (None, 32 * 2**20),  # no GPU named: the larger default
    ],
)
def test_cublas_workspace_per_architecture(architecture: str | None, workspace_bytes: int) -> None:
    size, source = cublas_workspace(architecture)
    assert size == workspace_bytes
    assert "CublasHandlePool.cpp" in source


def test_the_default_overhead_names_its_sources() -> None:
    overhead = FrameworkOverhead()
    assert overhead.workspace_bytes == 32 * 2**20
    assert "CublasHandlePool.cpp" in overhead.workspace_source
    assert "not measured" in overhead.context_source
    assert overhead.fragmentation_fraction is None  # the allocator replay decides
    assert overhead.expandable_segments is False  # PyTorch's default
