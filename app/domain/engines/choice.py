"""A workload's serving engine: which engine profile, its options (with the engine's names) and
the concurrency the workload asks of it. Engine-neutral: another engine is another entry of
:data:`ENGINE_PROFILES` and of the options it takes, not a fork of the computation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.domain.engines.vllm import VLLM_0_19, EngineProfile, VllmOptions

# The engines a workload may name, by the name it names them with.
ENGINE_PROFILES: dict[str, EngineProfile] = {VLLM_0_19.name: VLLM_0_19}


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineChoice:
    """An inference workload served by an engine: its requirement on a GPU or MIG slice is the
    engine's start-up memory (app.domain.fit.engine_requirement), and it fits where the engine
    starts with at least ``min_concurrency`` sequences of ``max_model_len`` tokens (1: starts).
    ``quantization`` / ``quantization_config``: vLLM's ``--quantization`` and the checkpoint's
    ``quantization_config`` (app.domain.engines.quant_schemes.resolve_scheme reads them).
    """

    name: str
    options: VllmOptions
    min_concurrency: int = 1
    quantization: str | None = None
    quantization_config: Mapping[str, Any] | None = None

    @property
    def profile(self) -> EngineProfile:
        """The engine's profile of constants (KeyError for an engine not in the table)."""
        return ENGINE_PROFILES[self.name]


__all__ = ["ENGINE_PROFILES", "EngineChoice"]
