"""What the Hugging Face config importers share: typed reads of ``config.json`` fields that
name the field in every problem, and the head-count checks.

Standard library and :mod:`app.domain` only (``benchmarks/hf_params`` imports the importers
without the service's dependencies).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from app.domain.graph.format import MAX_DIM
from app.domain.zoo import transformers as builders
from app.importers.result import ImportRejected

# transformers' activation names -> the graph's MLP activations (plain, gated)
_PLAIN = {
    "gelu": "gelu",
    "gelu_new": "gelu_new",
    "gelu_fast": "gelu_new",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
_GATED = {
    "silu": "swiglu",
    "swish": "swiglu",
    "gelu": "geglu",
    "gelu_new": "geglu",
    "gelu_fast": "geglu",
    "gelu_pytorch_tanh": "geglu",
}


# Epsilons, dropout rates and ratios are small; a bound keeps NaN, infinity and 1e308 out.
MAX_NUMBER = 1e6


class _Config:
    """Typed reads of a config dict; every problem names its key as a JSON pointer."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw

    def _fail(self, key: str, message: str) -> ImportRejected:
        return ImportRejected(f"config field '{key}' {message}", pointer=f"/config/{key}")

    def size(self, key: str, default: int | None = None, *, alias: str | None = None) -> int:
        """A positive integer (sizes, counts)."""
        value = self.raw.get(key)
        if value is None and alias is not None:
            key, value = alias, self.raw.get(alias)
        if value is None:
            if default is None:
                raise self._fail(key, "is required for this model type")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIM:
            raise self._fail(key, f"must be a positive integer, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, f"must be true or false, got {value!r}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.raw.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(key, f"must be a non-negative number, got {value!r}")
        if (isinstance(value, float) and not math.isfinite(value)) or not 0 <= value <= MAX_NUMBER:
            raise self._fail(key, f"must be a finite number in [0, {MAX_NUMBER:g}], got {value!r}")
        return float(value)

    def text(self, key: str, default: str) -> str:
        value = self.raw.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._fail(key, f"must be a string, got {value!r}")
        return value

    def activation(self, key: str, default: str, *, gated: bool) -> str:
        name = self.text(key, default)
        table = _GATED if gated else _PLAIN
        if name not in table:
            raise self._fail(key, f"{name!r} is not supported; use one of {', '.join(table)}")
        return table[name]

    def dropout(self, key: str) -> float:
        value = self.number(key, 0.0)
        if value >= 1:
            raise self._fail(key, "must be below 1")
        return value

    def architectures(self) -> list[str]:
        value = self.raw.get("architectures") or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail("architectures", "must be a list of class names")
        return value


Built = tuple[builders.Graph, str, list[str], int | None]  # graph, reference, notes, positions


def _heads(config: _Config, hidden: int, key: str, *, alias: str | None = None) -> int:
    """The attention head count, which must divide the hidden size (no explicit head_dim)."""
    heads = config.size(key, alias=alias)
    if hidden % heads:
        name = key if key in config.raw or alias not in config.raw else alias
        raise ImportRejected(
            f"config field '{name}' ({heads}) must divide the hidden size {hidden}",
            pointer=f"/config/{name}",
        )
    return heads


def _kv_heads(config: _Config, heads: int) -> int:
    """``num_key_value_heads`` (default: every head), which must divide the head count."""
    kv_heads = config.size("num_key_value_heads", heads)
    if heads % kv_heads:
        raise ImportRejected(
            f"config field 'num_key_value_heads' ({kv_heads}) must divide "
            f"num_attention_heads {heads}",
            pointer="/config/num_key_value_heads",
        )
    return kv_heads
