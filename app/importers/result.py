"""What an importer returns, and the error it raises."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.domain.errors import GraphError
from app.domain.graph.analysis import InputDecl, analyze

# What a stored model may hold (ModelBase in app/schemas/models.py; a test keeps these equal).
# Importers reject a source that cannot fit before they do the expensive work, not after.
MAX_STORED_LAYERS = 10_000  # top-level layers (imported graphs are flat)
MAX_STORED_INPUTS = 16
MAX_STORED_INPUT_RANK = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class OpMapping:
    """How one kind of source operation became graph ops."""

    source_op: str  # ONNX op type, or a Hugging Face module
    count: int
    mapped_to: tuple[str, ...]  # graph ops; empty when folded away (shape arithmetic, identity)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnsupportedOp:
    """A source operation with no graph equivalent."""

    source_op: str
    count: int
    nodes: tuple[str, ...]  # the first few node names


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportedGraph:
    """A model in the graph format, with what the importer did to get there."""

    name: str
    family: str
    description: str
    inputs: tuple[InputDecl, ...]
    layers: list[dict[str, Any]]
    default_bindings: dict[str, int]
    parameter_count: int  # the graph's, from shape inference
    source_parameter_count: int | None  # ONNX: from the initializers; None for HF configs
    reference: str  # what the count is compared with (a transformers class, ONNX initializers)
    op_mapping: tuple[OpMapping, ...]
    unsupported: tuple[UnsupportedOp, ...] = ()
    assumptions: tuple[str, ...] = ()


class ImportRejected(Exception):
    """The source cannot be imported; ``problems`` are ``(pointer, message)`` pairs."""

    def __init__(
        self,
        detail: str,
        *,
        pointer: str | None = None,
        problems: Sequence[tuple[str, str]] = (),
        kind: str = "invalid-import",
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.pointer = pointer
        self.problems = tuple(problems)
        self.kind = kind


def graph_parameter_count(
    inputs: Sequence[InputDecl], layers: Sequence[Mapping[str, Any]], bindings: Mapping[str, int]
) -> int:
    """Parameters of an imported graph, by the same shape inference every estimate uses."""
    try:
        analysis = analyze(inputs, layers, {"batch": 1, **bindings}, training=False)
    except GraphError as exc:
        raise ImportRejected(
            f"the imported graph does not pass shape inference: {exc}",
            pointer=f"/layers/{exc.layer}" if exc.layer else "/layers",
        ) from exc
    return analysis.params


def top_level_mapping(layers: Sequence[Mapping[str, Any]]) -> tuple[OpMapping, ...]:
    """One entry per top-level layer (a repeat lists its body's ops once, with its count)."""
    entries = []
    for layer in layers:
        if layer["op"] == "repeat":
            ops = tuple(inner["op"] for inner in layer["layers"])
            entries.append(OpMapping(source_op=layer["name"], count=layer["times"], mapped_to=ops))
        else:
            entries.append(OpMapping(source_op=layer["name"], count=1, mapped_to=(layer["op"],)))
    return tuple(entries)
