"""The ONNX importer on hand-built graphs: hostile inputs and odd corners, without a server."""

import onnx
import pytest
from onnx import TensorProto, helper

from app.importers.onnx_model import import_onnx
from app.importers.result import ImportRejected
from tests.importers import onnx_models


def test_external_data_is_rejected_before_anything_reads_it() -> None:
    with pytest.raises(ImportRejected) as caught:
        import_onnx(onnx_models.with_external_data())
    assert caught.value.kind == "external-data"


def test_unexpected_graph_shapes_are_422_not_500() -> None:
    model = onnx.load_from_string(onnx_models.small_cnn())
    del model.graph.node[0].attribute[:]  # Conv without kernel_shape: still mappable
    model.graph.node[0].input[1] = "missing-weight"
    with pytest.raises(ImportRejected):
        import_onnx(model.SerializeToString())


def test_symbolic_spatial_dims_are_rejected_with_advice() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H", "W"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(ImportRejected, match="export with fixed sizes"):
        import_onnx(model.SerializeToString())


def test_fixed_batch_is_kept_and_said() -> None:
    model = onnx.load_from_string(onnx_models.small_cnn())
    for info in (*model.graph.input, *model.graph.output):
        info.type.tensor_type.shape.dim[0].Clear()
        info.type.tensor_type.shape.dim[0].dim_value = 1
    imported = import_onnx(model.SerializeToString())
    assert imported.inputs[0].shape == (1, 3, 32, 32)
    assert any("fixed batch dimension 1" in note for note in imported.assumptions)
