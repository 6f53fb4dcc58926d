"""The service's CUDA context (issue 32): the context table's figure for the GPU's compute
capability unless the hardware profile or the request gives one; defaults_used says which."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from app.schemas.estimates import OverheadSpec
from app.services.convert import hardware_overhead, overhead_sources

MIB = 2**20


def _gpu(capability: str | None, framework_overhead: dict[str, Any] | None = None) -> Any:
    return SimpleNamespace(
        slug="test-gpu",
        kind="gpu",
        architecture="Ampere GA102",
        compute_capability=capability,
        framework_overhead=framework_overhead or {},
    )


def test_no_gpu_named_gets_the_tables_figure_for_any_gpu() -> None:
    overhead = hardware_overhead(None)
    assert overhead.cuda_context_bytes == 400 * MIB  # CUDA 12, lazy loading, any GPU
    assert overhead.context_source.startswith("CUDA context table: ")
    assert "lazy module loading, CUDA 12" in overhead.context_default


def test_a_gpu_with_its_own_figure_gets_it() -> None:
    overhead = hardware_overhead(_gpu("8.6"))
    assert overhead.cuda_context_bytes == 256 * MIB
    assert "sm86's own figure" in overhead.context_default
    sources = overhead_sources(_gpu("8.6"))
    assert sources["cuda_context"].startswith("default, CUDA context table: ")


def test_a_profile_or_request_figure_replaces_the_default_and_is_not_a_default() -> None:
    profile = hardware_overhead(_gpu("8.0", {"cuda_context_bytes": 700 * MIB}))
    assert profile.cuda_context_bytes == 700 * MIB
    assert profile.context_default == ""
    assert profile.context_source == "CUDA context from the hardware profile test-gpu"
    request = hardware_overhead(_gpu("8.6"), OverheadSpec(cuda_context_bytes=5))
    assert request.cuda_context_bytes == 5
    assert request.context_default == ""
    assert request.context_source == "CUDA context, as the request set it"
