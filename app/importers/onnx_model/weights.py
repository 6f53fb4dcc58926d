"""Weights: the float data is released right after parsing (the planner needs dims, not
values), and copies of a parameter (a tied LM head) are found first, by digest or by the
exporter's provenance.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import GraphProto, ModelProto, TensorProto

from app.importers.onnx_model.proto import (
    _FLOAT_TYPES,
    SMALL_VALUES,
    _has_external_data,
    _stored_elements,
)


@dataclass(frozen=True, slots=True)
class Weightless:
    """Initializers whose data the import did not have or dropped, by reason."""

    external: int  # pointed at external data (the path is never opened)
    empty: int  # carried dims but no data (a graph-only export)
    dropped_bytes: int  # float weight data released right after parsing
    # initializer -> (the earlier initializer it copies, whether transposed): exporters write a
    # tied LM head as a transposed copy of the embedding table
    copies: dict[str, tuple[str, bool]] = field(default_factory=dict)


def strip_weights(model: ModelProto) -> Weightless:
    """Release the data of every float initializer (the planner needs dims, not values) and
    forget external-data references, so nothing later can read a path or copy weights.

    Int tensors of at most ``SMALL_VALUES`` elements keep their data (reshape targets, axes).
    """
    external = empty = dropped = 0
    copies = {**_provenance_copies(model.graph), **_copies(model.graph)}
    for tensor in model.graph.initializer:
        if _has_external_data(tensor):
            external += 1
            del tensor.external_data[:]
            tensor.data_location = TensorProto.DEFAULT
            continue
        numel = math.prod(tensor.dims)
        if numel and _stored_elements(tensor) == 0:
            empty += 1
        if tensor.data_type in _FLOAT_TYPES and numel > SMALL_VALUES:
            dropped += tensor.ByteSize()
            for name in ("raw_data", "float_data", "double_data", "int32_data"):
                tensor.ClearField(name)
    return Weightless(external=external, empty=empty, dropped_bytes=dropped, copies=copies)


def _copies(graph: GraphProto) -> dict[str, tuple[str, bool]]:
    """2-d float initializers whose data equals an earlier one's, or its transpose (by digest;
    read before the data is released). Tensors without data, and constant ones, are never
    copies; the mapper ties a linear layer through a copy only to an embedding table."""
    seen: dict[bytes, str] = {}
    found: dict[str, tuple[str, bool]] = {}
    for tensor in graph.initializer:
        if (
            tensor.data_type not in _FLOAT_TYPES
            or len(tensor.dims) != 2
            or math.prod(tensor.dims) <= SMALL_VALUES
            or _has_external_data(tensor)
            or _stored_elements(tensor) != math.prod(tensor.dims)
        ):
            continue
        array = onnx.numpy_helper.to_array(tensor)
        if array.min() == array.max():  # constant (zeros, ones): equal by value, not a copy
            continue
        digest = _digest(array)
        if digest in seen:
            found[tensor.name] = (seen[digest], False)
            continue
        transposed = _digest(array.T)
        if transposed in seen:
            found[tensor.name] = (seen[transposed], True)
            continue
        seen[digest] = tensor.name
    return found


_FX_PARAMETER = re.compile(r"%p_([A-Za-z0-9_]+)")


def _provenance_copies(graph: GraphProto) -> dict[str, tuple[str, bool]]:
    """2-d float initializers that a node's provenance metadata says are a parameter stored
    under another name, as is or transposed. The dynamo exporter (torch.onnx.export with
    dynamo=True) constant-folds ``linear``'s transposed weight into a new anonymous
    initializer and records the PyTorch node behind each ONNX node
    (``pkg.torch.onnx.fx_node``: ``aten.linear(%x, %p_lm_head_weight)``): so a graph-only
    file still tells that a tied LM head reads the embedding table."""
    dims = {t.name: tuple(t.dims) for t in graph.initializer
            if t.data_type in _FLOAT_TYPES and len(t.dims) == 2}  # fmt: skip
    by_fx_name = {"p_" + re.sub(r"[^A-Za-z0-9_]", "_", name): name for name in dims}
    found: dict[str, tuple[str, bool]] = {}
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        weight = node.input[1]
        if weight not in dims or weight in found:
            continue
        fx_node = next((p.value for p in node.metadata_props
                        if p.key == "pkg.torch.onnx.fx_node"), "")  # fmt: skip
        sources = {by_fx_name.get(f"p_{m}") for m in _FX_PARAMETER.findall(fx_node)} - {None}
        if len(sources) != 1:
            continue
        source = str(sources.pop())
        if source == weight:
            continue
        if dims[source] == dims[weight][::-1]:
            found[weight] = (source, True)
        elif dims[source] == dims[weight]:
            found[weight] = (source, False)
    return found


def _digest(array: np.ndarray) -> bytes:
    contiguous = np.ascontiguousarray(array)
    digest = hashlib.blake2b(repr(contiguous.shape).encode(), digest_size=16)
    digest.update(contiguous.data)  # the array's buffer itself: no copy of a large tensor
    return digest.digest()
