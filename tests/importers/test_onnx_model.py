"""The ONNX importer on hand-built graphs: hostile inputs and odd corners, without a server."""

import math
from collections.abc import Callable
from typing import Any

import annotated_types
import onnx
import pytest
from onnx import TensorProto, helper
from pydantic.fields import FieldInfo

from app.domain.graph.analysis import analyze
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import Mode, Runtime
from app.importers import result
from app.importers.onnx_model import attention, import_onnx, importer, parsing
from app.importers.onnx_model.weights import strip_weights
from app.importers.result import ImportRejected
from app.schemas.models import InputSpec, ModelCreate
from tests.importers import onnx_models


def test_external_data_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """An initializer pointing at '../../../etc/passwd' imports from its dims alone: no file
    is opened while importing (open and os.open fail if anything tries)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the importer tried to open {args[:1]}")

    monkeypatch.setattr("builtins.open", refuse)
    monkeypatch.setattr("os.open", refuse)
    imported = import_onnx(onnx_models.with_external_data())
    assert imported.parameter_count == imported.source_parameter_count == 2_970
    assert any("refer to external data (never read)" in a for a in imported.assumptions)


@pytest.mark.parametrize("external", [False, True])
@pytest.mark.parametrize(
    "build", [onnx_models.small_cnn, onnx_models.tiny_attention], ids=["cnn", "attention"]
)
def test_a_graph_without_weights_imports_like_the_full_file(
    build: Callable[[], bytes], external: bool
) -> None:
    full = import_onnx(build())
    bare_bytes = onnx_models.without_weights(build(), external=external)
    assert len(bare_bytes) < len(build())
    bare = import_onnx(bare_bytes)
    assert bare.parameter_count == full.parameter_count == bare.source_parameter_count
    assert bare.layers == full.layers
    assert bare.inputs == full.inputs
    floats = sum(
        1 for t in onnx.load_from_string(build()).graph.initializer
        if t.data_type == TensorProto.FLOAT
    )  # fmt: skip
    external_count, empty_count = (floats, 0) if external else (0, floats)
    assert (
        f"shapes without weights: {external_count} initializer(s) refer to external data "
        f"(never read) and {empty_count} carry no data"
    ) in " ".join(bare.assumptions)


def test_weight_data_is_released_after_parsing() -> None:
    """Float weights over 64 elements lose their data right after parsing; small ones keep it."""
    model = onnx.load_from_string(onnx_models.small_cnn())
    before = {t.name: t.ByteSize() for t in model.graph.initializer}
    weightless = strip_weights(model)
    floats = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT]
    large = [t for t in floats if math.prod(t.dims) > 64]
    small = [t for t in floats if math.prod(t.dims) <= 64]
    assert large  # preconditions: the CNN has both
    assert small
    assert all(not t.raw_data and not len(t.float_data) for t in large)
    assert all(t.ByteSize() == before[t.name] for t in small)
    assert weightless.dropped_bytes == sum(before[t.name] for t in large)
    assert (weightless.external, weightless.empty) == (0, 0)


@pytest.mark.parametrize(
    ("op", "bidirectional", "use_state", "params"),
    [
        ("LSTM", False, True, 400 + 1_664 + 34),
        ("LSTM", True, False, 400 + 2 * 1_664 + 66),
        ("GRU", False, True, 400 + 1_248 + 34),
        ("GRU", True, True, 400 + 2 * 1_248 + 66),
    ],
)
def test_recurrent_layers_map_to_the_recurrent_op(
    op: str, bidirectional: bool, use_state: bool, params: int
) -> None:
    imported = import_onnx(onnx_models.recurrent_classifier(op, bidirectional=bidirectional,
                                                            use_state=use_state))  # fmt: skip
    assert imported.parameter_count == imported.source_parameter_count == params
    (layer,) = [layer for layer in imported.layers if layer["op"] == op.lower()]
    assert layer["hidden_size"] == 16
    assert layer["bidirectional"] is bidirectional
    assert layer["bias"] is True
    assert not imported.unsupported
    assert [i.shape for i in imported.inputs] == [("batch", "seq")]  # dynamic batch and seq
    analysis = analyze(imported.inputs, imported.layers, {"batch": 3, "seq": 7}, training=True)
    assert analysis.output_shape == (3, 2)
    assert analysis.params == params


def test_gelu_written_out_in_any_order_is_one_gelu() -> None:
    imported = import_onnx(onnx_models.gelu_by_hand())
    assert [layer["op"] for layer in imported.layers] == ["linear", "gelu", "linear"]
    assert imported.layers[1]["approximate"] == "tanh"


@pytest.mark.parametrize(
    "kwargs", [{"half": 0.6}, {"share_inner": True}], ids=["not gelu", "shared intermediate"]
)
def test_what_is_not_exactly_gelu_stays_element_wise(kwargs: dict[str, Any]) -> None:
    imported = import_onnx(onnx_models.gelu_by_hand(**kwargs))
    ops = [layer["op"] for layer in imported.layers]
    assert "gelu" not in ops
    assert "tanh" in ops
    assert not any("GELU" in a for a in imported.assumptions)


@pytest.mark.parametrize("transposed", [True, False], ids=["transposed copy", "same copy"])
def test_a_head_that_copies_the_embedding_is_tied_to_it(transposed: bool) -> None:
    imported = import_onnx(onnx_models.lm_with_head_copy(transposed=transposed))
    assert imported.parameter_count == imported.source_parameter_count == 50 * 16
    (head,) = [layer for layer in imported.layers if layer["op"] == "linear"]
    (embedding,) = [layer for layer in imported.layers if layer["op"] == "embedding"]
    assert head["tied_to"] == embedding["name"]
    kind = "transposed copy" if transposed else "copy"
    assert any(f"'head_weight' is a {kind} of 'wte'" in a for a in imported.assumptions)


def test_a_head_with_its_own_values_is_not_tied() -> None:
    imported = import_onnx(onnx_models.lm_with_head_copy(same_values=False))
    assert imported.parameter_count == imported.source_parameter_count == 2 * 50 * 16
    (head,) = [layer for layer in imported.layers if layer["op"] == "linear"]
    assert "tied_to" not in head


@pytest.mark.parametrize(
    ("producer", "drop_batch_norm", "warned"),
    [("pytorch", True, True), ("pytorch", False, False), ("capplan-tests", True, False)],
)
def test_an_eval_mode_export_with_folded_batch_norm_is_flagged(
    producer: str, drop_batch_norm: bool, warned: bool
) -> None:
    """small_cnn's convolutions have biases; without its BatchNormalization node, a PyTorch
    export looks like one whose batch norm was folded in eval mode: the report says so."""
    model = onnx.load_from_string(onnx_models.small_cnn())
    model.producer_name = producer
    if drop_batch_norm:
        (bn,) = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
        for node in model.graph.node:
            node.input[:] = [bn.input[0] if i == bn.output[0] else i for i in node.input]
        model.graph.node.remove(bn)
        used = {i for n in model.graph.node for i in n.input}
        for tensor in [t for t in model.graph.initializer if t.name not in used]:
            model.graph.initializer.remove(tensor)
    imported = import_onnx(model.SerializeToString())
    flagged = [a for a in imported.assumptions if "folded it into the convolutions" in a]
    assert bool(flagged) is warned
    if warned:
        assert flagged[0].startswith("2 convolution(s) carry a bias")
    marked = [layer for layer in imported.layers if layer.get("batchnorm_folded")]
    assert len(marked) == (2 if warned else 0)
    # The mark is stored with the graph: every training estimate says what it cannot see.
    for mode in Mode:
        request = MemoryRequest(mode=mode, precision=Precision.FP32, runtime=Runtime.CPU)
        analysis = analyze_for(imported.inputs, imported.layers, {"batch": 2}, request)
        said = [a for a in estimate_memory(analysis, request).assumptions
                if a.startswith("cannot see batch norm: 2 convolution(s)")]  # fmt: skip
        assert bool(said) is (warned and mode is Mode.TRAINING)


@pytest.mark.parametrize(
    ("kind", "op", "params"),
    [("rms", "rmsnorm", 16 + 64), ("layer", "layernorm", 32 + 64)],
)
def test_norms_written_out_are_one_norm(kind: str, op: str, params: int) -> None:
    imported = import_onnx(onnx_models.norm_by_hand(kind))
    assert [layer["op"] for layer in imported.layers] == ["add", op, "linear"]
    assert imported.parameter_count == imported.source_parameter_count == params
    label = "RMSNorm" if kind == "rms" else "LayerNorm"
    assert any(f"{label} written out -> {label.lower()}" in a for a in imported.assumptions)


def test_a_mean_over_another_axis_is_not_a_norm() -> None:
    imported = import_onnx(onnx_models.norm_by_hand("rms", axis=1), lenient=True)
    ops = [layer["op"] for layer in imported.layers]
    assert "rmsnorm" not in ops
    assert not any("written out" in a for a in imported.assumptions)


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


# -- structural caps: checked before shape inference and mapping ------------------------------


def _no_expensive_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if shape inference (the first costly step) or graph analysis runs."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("expensive work ran before the structural caps rejected the file")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", forbidden)
    monkeypatch.setattr(result, "analyze", forbidden)


def test_stored_model_limits_are_the_schemas() -> None:
    def max_length(field: FieldInfo) -> int:
        return next(m.max_length for m in field.metadata if isinstance(m, annotated_types.MaxLen))

    assert result.MAX_STORED_LAYERS == max_length(ModelCreate.model_fields["layers"])
    assert result.MAX_STORED_INPUTS == max_length(ModelCreate.model_fields["inputs"])
    assert result.MAX_STORED_INPUT_RANK == max_length(InputSpec.model_fields["shape"])


def test_49000_nodes_that_cannot_fit_the_layer_cap_are_rejected_before_shape_inference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = onnx_models.chain(49_000)
    _no_expensive_work(monkeypatch)
    with pytest.raises(ImportRejected, match="at most 10000 layers") as caught:
        import_onnx(data, lenient=True)
    assert caught.value.kind == "invalid-onnx"
    assert "49000 nodes" in caught.value.detail


def test_the_layer_bound_counts_only_nodes_that_must_become_layers() -> None:
    # Identity nodes alias their input: 12,000 of them map to no layer, so no early rejection
    # (the file is then refused for mapping to nothing, after shape inference).
    with pytest.raises(ImportRejected, match="nothing to import"):
        import_onnx(onnx_models.chain(12_000, "Identity"))


def test_more_layers_than_a_model_holds_stops_the_mapping_at_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A Transpose without perm may be an identity (rank 1) so the early bound does not count
    # it; at rank 2 each is a layer, and the mapping stops at the cap: before the graph's own
    # (slow) shape inference.
    data = onnx_models.chain(10_002, "Transpose")
    model = onnx.load_from_string(data)
    assert parsing._least_layers(model.graph, {"x"}) == 0
    monkeypatch.setattr(result, "analyze", lambda *a, **k: pytest.fail("analysis ran"))
    with pytest.raises(ImportRejected, match="maps to more than 10000 layers"):
        import_onnx(data)


LAYER_BOUND_CASES: dict[str, tuple[Callable[[], bytes], int]] = {
    "cnn": (onnx_models.small_cnn, 10),  # every node, the residual Add of two activations too
    # an attention fusion may absorb every node between the projections' input and output, and
    # a feed-forward behind each of its two norms may become one layer: no bound is left
    "attention": (onnx_models.tiny_attention, 0),
    "attention, untied": (lambda: onnx_models.tiny_attention(tied=False), 0),
    "unsupported ops": (onnx_models.with_unsupported, 4),
    "relu stack": (onnx_models.relu_mlp_stack, 6),
    # a feed-forward behind a norm may become one mlp layer
    "relu stack behind a norm": (lambda: onnx_models.relu_mlp_stack(norm=True), 0),
    "adds": (lambda: onnx_models.chain(50, "Add"), 50),  # of two activations: no bias
    "transposes": (lambda: onnx_models.chain(50, "Transpose"), 0),
    "relus": (lambda: onnx_models.chain(50), 50),
}


@pytest.mark.parametrize("case", list(LAYER_BOUND_CASES))
def test_the_early_layer_bound_never_exceeds_the_mapped_layers(case: str) -> None:
    build, at_least = LAYER_BOUND_CASES[case]
    data = build()
    model = onnx.load_from_string(data)
    initializers = {t.name for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input if i.name not in initializers}
    least = parsing._least_layers(model.graph, inputs)
    assert least >= at_least
    assert least <= len(import_onnx(data, lenient=True).layers)


@pytest.mark.parametrize(
    ("build", "words", "pointer"),
    [
        (lambda: onnx_models.with_inputs(17), "17 inputs", "/graph/input"),
        (lambda: onnx_models.with_inputs(1, rank=9), "9 dims", "/graph/input"),
    ],
)
def test_what_a_stored_model_cannot_hold_is_rejected_up_front(
    monkeypatch: pytest.MonkeyPatch, build: Callable[[], bytes], words: str, pointer: str
) -> None:
    data = build()
    _no_expensive_work(monkeypatch)
    with pytest.raises(ImportRejected, match=words) as caught:
        import_onnx(data)
    assert caught.value.pointer == pointer


@pytest.mark.parametrize(
    ("cap", "value", "words"),
    [
        ("MAX_NODES", 5, "more than 5 nodes"),
        ("MAX_NODE_EDGES", 10, "more than 10 inputs and outputs"),
        ("MAX_TENSORS", 5, "10 initializers"),
        ("MAX_DECLARED_VALUES", 1, "declares 2 values"),
    ],
)
def test_counting_caps(monkeypatch: pytest.MonkeyPatch, cap: str, value: int, words: str) -> None:
    data = onnx_models.small_cnn()  # 9 nodes, 10 initializers, 1 input + 1 output
    assert import_onnx(data).layers  # within the real caps
    monkeypatch.setattr(parsing, cap, value)
    _no_expensive_work(monkeypatch)
    with pytest.raises(ImportRejected, match=words):
        import_onnx(data)


def test_attribute_tensors_count_towards_the_tensor_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    constants = [
        helper.make_node(
            "Constant",
            [],
            [f"c{i}"],
            value=helper.make_tensor(f"t{i}", TensorProto.FLOAT, [4], [1.0] * 4),
        )
        for i in range(3)
    ]
    adds = [
        helper.make_node("Add", [source, f"c{i}"], [target])
        for i, (source, target) in enumerate([("x", "a0"), ("a0", "a1"), ("a1", "y")])
    ]
    graph = helper.make_graph([*constants, *adds], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    assert import_onnx(data).layers
    monkeypatch.setattr(parsing, "MAX_TENSORS", 2)
    with pytest.raises(ImportRejected, match="more than 2 tensors"):
        import_onnx(data)


def test_declared_rank_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    model = onnx.load_from_string(onnx_models.small_cnn())
    model.graph.value_info.append(helper.make_tensor_value_info("c1", TensorProto.FLOAT, [1] * 40))
    _no_expensive_work(monkeypatch)
    with pytest.raises(ImportRejected, match="declares 40 dims; at most 32"):
        import_onnx(model.SerializeToString())


def test_imported_attention_graphs_carry_no_implementation() -> None:
    """A matmul-built attention imports as matmuls and softmax: nothing says how to compute it
    (issue 12: the implementation is a request option)."""
    imported = import_onnx(onnx_models.tiny_attention())
    assert imported.layers
    assert "fused" not in repr(imported.layers)


@pytest.mark.parametrize("norm", [False, True])
def test_only_a_feed_forward_behind_a_norm_becomes_one_mlp(norm: bool) -> None:
    """MatMul/Relu x 3 of equal widths: a plain stack keeps its linear and relu layers (it is
    no transformer feed-forward, and fusing pairs of a longer chain would break it); behind a
    LayerNormalization the first linear/relu/linear is one mlp."""
    imported = import_onnx(onnx_models.relu_mlp_stack(norm=norm))
    ops = [layer["op"] for layer in imported.layers]
    if norm:
        assert ops == ["layernorm", "mlp", "relu", "linear", "relu"]
        assert imported.layers[1]["activation"] == "relu"
        assert imported.layers[1]["intermediate_size"] == 8
    else:
        assert ops == ["linear", "relu"] * 3
    assert imported.parameter_count == 3 * 8 * 8 + (16 if norm else 0)


def test_attention_reads_weights_through_their_transpose() -> None:
    """An unoptimized export (the dynamo exporter on a meta-device model, whose optimizer
    cannot fold external tensors) keeps ``MatMul(x, Transpose(W))`` with W stored [out, in]:
    the projections are still found, and the parameters still add up."""
    model = onnx.load_from_string(onnx_models.tiny_attention(tied=False))
    graph = model.graph
    for proj in ("q", "k", "v", "o"):
        (tensor,) = [t for t in graph.initializer if t.name == f"{proj}.weight"]
        array = onnx.numpy_helper.to_array(tensor).T.copy()
        tensor.CopyFrom(onnx.numpy_helper.from_array(array, f"{proj}.weight"))
        (matmul,) = [n for n in graph.node if n.name == f"/{proj}/MatMul"]
        matmul.input[1] = f"{proj}.weight_t"
        graph.node.insert(0, helper.make_node("Transpose", [f"{proj}.weight"],
                                              [f"{proj}.weight_t"], perm=[1, 0]))  # fmt: skip
    imported = import_onnx(model.SerializeToString())
    assert [layer["op"] for layer in imported.layers].count("attention") == 1
    assert imported.parameter_count == imported.source_parameter_count == 3_024 + 16 * 50


def test_a_files_own_node_in_the_fusions_domain_is_not_trusted() -> None:
    """The fusions mark their nodes by identity, not by domain: a file that writes an
    ``Attention`` node in ``capplan.fused`` itself gets the custom-domain refusal."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8])
    node = helper.make_node("Attention", ["x"], ["y"], domain=attention.FUSED_DOMAIN,
                            num_heads=2, num_kv_heads=2, head_dim=4)  # fmt: skip
    graph = helper.make_graph([node], "forged", [x], [y])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(attention.FUSED_DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    with pytest.raises(ImportRejected) as caught:
        import_onnx(model.SerializeToString())
    assert caught.value.kind == "unsupported-onnx-ops"
    assert "custom domain 'capplan.fused'" in str(caught.value.problems)


@pytest.mark.parametrize(
    ("activations", "why"),
    [(["Sigmoid"], "only Tanh or Relu"), (["Tanh", "Relu"], "the same in both directions")],
)
def test_an_rnn_with_other_activations_is_refused(activations: list[str], why: str) -> None:
    directions = len(activations)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8])  # layout 1
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, directions, 16])
    inits = [
        helper.make_tensor("W", TensorProto.FLOAT, [directions, 16, 8], [0.0] * directions * 128),
        helper.make_tensor("R", TensorProto.FLOAT, [directions, 16, 16], [0.0] * directions * 256),
    ]
    direction = "bidirectional" if directions == 2 else "forward"
    node = helper.make_node("RNN", ["x", "W", "R"], ["y"], hidden_size=16, layout=1,
                            activations=activations, direction=direction)  # fmt: skip
    graph = helper.make_graph([node], "rnn", [x], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(ImportRejected) as caught:
        import_onnx(model.SerializeToString())
    assert why in str(caught.value.problems)


def test_3d_convolutions_and_instance_norm_map_to_the_3d_ops() -> None:
    """Conv and ConvTranspose with three spatial dims and InstanceNormalization (the MLPerf 3D
    U-Net's blocks) import as conv3d / conv_transpose3d / instancenorm3d, with every
    initializer counted."""
    imported = import_onnx(onnx_models.small_unet3d())
    assert imported.parameter_count == imported.source_parameter_count == 510
    ops = [layer["op"] for layer in imported.layers]
    assert ops == ["conv3d", "instancenorm3d", "relu", "conv_transpose3d", "concat", "conv3d"]
    down, norm, _, up, _, head = imported.layers
    assert (down["kernel_size"], down["stride"], down["padding"], down["bias"]) == (
        [3, 3, 3],
        [2, 2, 2],
        [1, 1, 1],
        False,
    )
    assert norm["affine"] is True
    assert (up["out_channels"], up["kernel_size"], up["stride"], up["bias"]) == (
        4,
        [2, 2, 2],
        [2, 2, 2],
        True,
    )
    assert head["out_channels"] == 3
    analysis = analyze(
        imported.inputs, imported.layers, {**imported.default_bindings, "batch": 2}, training=False
    )
    assert analysis.output_shape == (2, 3, 16, 16, 16)
    assert analysis.params == 510


def test_asymmetric_3d_pads_are_refused() -> None:
    model = onnx.load_from_string(onnx_models.small_unet3d())
    conv = model.graph.node[0]
    for attr in conv.attribute:
        if attr.name == "pads":
            attr.ints[:] = [1, 1, 1, 0, 0, 0]
    with pytest.raises(ImportRejected, match=r"cannot be imported: Conv \(x1\)"):
        import_onnx(model.SerializeToString())


# -- cycles and memory ---------------------------------------------------------------------------


def test_a_cyclic_graph_is_rejected_naming_the_cycle() -> None:
    with pytest.raises(ImportRejected) as caught:
        import_onnx(onnx_models.with_cycle())
    assert caught.value.kind == "cyclic-onnx-graph"
    assert caught.value.pointer == "/graph/node"
    assert caught.value.detail.startswith(
        "the graph has a cycle: 'in' (Add) -> 's' -> 'mm' (MatMul) -> 'h' -> 'act' (Relu) -> "
        "'back' -> back to 'in' (Add); an ONNX graph must be acyclic"
    )


def test_a_long_cycle_is_named_in_part() -> None:
    with pytest.raises(ImportRejected) as caught:
        import_onnx(onnx_models.with_cycle(extra=20))
    detail = caught.value.detail
    assert "-> ... (23 nodes in all) -> back to 'in' (Add)" in detail
    assert detail.count(" (Relu) -> ") == 6  # eight nodes named: in, mm, act and five Relus


def test_a_node_reading_its_own_output_is_a_cycle() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])
    node = helper.make_node("Add", ["x", "y"], ["y"])  # unnamed: labelled by its position
    graph = helper.make_graph([node], "self", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(ImportRejected, match=r"cycle: #0 \(Add\) -> 'y' -> back to #0 \(Add\)"):
        import_onnx(model.SerializeToString())


def test_nodes_listed_out_of_order_are_no_cycle() -> None:
    """Kahn's algorithm, not the node order, decides: an acyclic graph listed backwards passes
    the cycle check (whatever the mapper then makes of it)."""
    model = onnx.load_model_from_string(onnx_models.relu_mlp_stack())
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    parsing._check_acyclic(model.graph)  # no exception
    with pytest.raises(ImportRejected):
        parsing._check_acyclic(onnx.load_model_from_string(onnx_models.with_cycle()).graph)


def test_load_onnx_reads_once_and_keeps_no_weights() -> None:
    """The bytes are asked for once (and not kept), and the model the importer works on is a
    copy without the float weights: protobuf frees a cleared field only with its message."""
    data = onnx_models.relu_mlp_stack(width=64, depth=3)
    calls = []

    def read() -> bytes:
        calls.append(1)
        return data

    model, weightless = importer.load_onnx(read)
    assert calls == [1]
    assert weightless.dropped_bytes > 3 * 64 * 64 * 4
    assert model.ByteSize() < len(data) - weightless.dropped_bytes + 1_000
    floats = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT]
    assert floats
    assert all(not t.raw_data and not t.float_data for t in floats if len(t.dims) == 2)
    assert importer.import_onnx_read(read).parameter_count == import_onnx(data).parameter_count
