"""Reading ONNX protos: element types, stored data, subgraphs, the default opset, and
the rejection every check raises.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto

from app.importers.result import (
    ImportRejected,
)

_FLOAT_TYPES = frozenset(
    {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
)
_INT_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32})
_ITEM_BYTES: dict[int, int] = {
    TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2, TensorProto.DOUBLE: 8,
    TensorProto.INT64: 8, TensorProto.INT32: 4, TensorProto.INT16: 2, TensorProto.INT8: 1,
    TensorProto.UINT8: 1, TensorProto.BOOL: 1, TensorProto.UINT16: 2, TensorProto.UINT32: 4,
    TensorProto.UINT64: 8,
}  # fmt: skip


def _reject(detail: str, pointer: str = "/file", kind: str = "invalid-onnx") -> ImportRejected:
    return ImportRejected(detail, pointer=pointer, kind=kind)


SMALL_VALUES = 64  # int tensors up to this many elements are read for their values (shapes)


def _default_opset(model: ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise _reject("the model imports no opset of the default ONNX domain")


def _all_nodes(graph: GraphProto) -> Iterator[NodeProto]:
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in _subgraphs(attribute):
                yield from _all_nodes(sub)


def _subgraphs(attribute: AttributeProto) -> list[GraphProto]:
    graphs = list(attribute.graphs)
    if attribute.HasField("g"):
        graphs.append(attribute.g)
    return graphs


def _has_external_data(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data) > 0


def _stored_elements(tensor: TensorProto) -> int | None:
    """Elements actually present in the tensor's data, or None when that cannot be told."""
    if tensor.HasField("raw_data"):
        item = _ITEM_BYTES.get(tensor.data_type)
        return len(tensor.raw_data) // item if item else None
    for values in (
        tensor.float_data,
        tensor.int32_data,
        tensor.int64_data,
        tensor.double_data,
        tensor.uint64_data,
    ):
        if len(values):
            return len(values)
    return 0 if tensor.data_type != TensorProto.STRING else None


def _small_ints(tensor: TensorProto) -> tuple[int, ...] | None:
    if tensor.data_type not in _INT_TYPES or math.prod(tensor.dims) > SMALL_VALUES:
        return None
    if _has_external_data(tensor) or _stored_elements(tensor) != math.prod(tensor.dims):
        return None  # no data: the value is unknown (never read from a path)
    return tuple(int(v) for v in onnx.numpy_helper.to_array(tensor).reshape(-1).tolist())
