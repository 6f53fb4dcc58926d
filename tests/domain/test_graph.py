from typing import Any

import pytest

from app.domain.errors import GraphError
from app.domain.graph.format import OP_SPECS, validate_graph

CNN: list[dict[str, Any]] = [
    {"name": "conv1", "op": "conv2d", "out_channels": 64, "kernel_size": 3, "padding": 1},
    {"name": "bn1", "op": "batchnorm2d"},
    {"name": "relu1", "op": "relu", "inplace": True},
    {"name": "conv2", "op": "conv2d", "out_channels": 64, "kernel_size": [3, 3], "padding": "same"},
    {"name": "res", "op": "add", "inputs": ["relu1", "conv2"]},
    {"name": "pool", "op": "adaptive_avgpool2d", "output_size": 1},
    {"name": "flat", "op": "flatten", "start_dim": 1},
    {"name": "fc", "op": "linear", "out_features": 10},
]


def test_valid_chain_with_residual() -> None:
    stats = validate_graph(CNN, ["image"])
    assert stats.layer_count == 8
    assert stats.op_counts["conv2d"] == 2


def test_repeat_expands_layer_count() -> None:
    layers = [
        {"name": "embed", "op": "embedding", "num_embeddings": 100, "embedding_dim": 16},
        {
            "name": "blocks",
            "op": "repeat",
            "times": 12,
            "layers": [
                {"name": "attn", "op": "attention", "num_heads": 4, "causal": True},
                {"name": "mlp", "op": "mlp", "intermediate_size": 64, "activation": "swiglu"},
            ],
        },
        {"name": "norm", "op": "rmsnorm"},
    ]
    # repeat node + 12 x 2 body layers + embed + norm
    assert validate_graph(layers, ["tokens"]).layer_count == 1 + 24 + 2


@pytest.mark.parametrize(
    ("layers", "layer", "field"),
    [
        ([{"name": "a", "op": "conv4d", "out_channels": 1}], "a", "op"),
        ([{"name": "a", "op": "conv3d", "out_channels": 1}], "a", "kernel_size"),
        (
            [{"name": "a", "op": "conv3d", "out_channels": 8, "kernel_size": [3, 3, 3, 3]}],
            "a",
            "kernel_size",
        ),
        (
            [{"name": "a", "op": "conv3d", "out_channels": 8, "kernel_size": 3, "stride": [2, 2]}],
            "a",
            "stride",
        ),
        (
            [
                {
                    "name": "a",
                    "op": "conv_transpose3d",
                    "out_channels": 8,
                    "kernel_size": 2,
                    "padding": "same",
                }
            ],
            "a",
            "padding",
        ),
        ([{"name": "a", "op": "instancenorm3d", "affine": 1}], "a", "affine"),
        ([{"name": "a", "op": "conv2d", "kernel_size": 3}], "a", "out_channels"),
        ([{"name": "a", "op": "conv2d", "out_channels": 0, "kernel_size": 3}], "a", "out_channels"),
        ([{"name": "a", "op": "conv2d", "out_channels": 8, "kernel_size": -3}], "a", "kernel_size"),
        ([{"name": "a", "op": "linear", "out_features": 8, "colour": "red"}], "a", "colour"),
        ([{"name": "a", "op": "relu"}, {"name": "a", "op": "relu"}], "a", "name"),
        ([{"name": "a", "op": "add", "inputs": ["image", "later"]}], "a", "inputs"),
        ([{"name": "a", "op": "add"}], "a", "inputs"),
        ([{"name": "a", "op": "dropout", "p": 1.5}], "a", "p"),
        ([{"name": "a", "op": "relu", "inplace": "yes"}], "a", "inplace"),
        ([{"name": "a", "op": "repeat", "times": 2}], "a", "layers"),
        ([{"name": "a", "op": "linear", "out_features": 2**41}], "a", "out_features"),
    ],
)
def test_invalid_graphs_name_the_layer_and_field(
    layers: list[dict[str, Any]], layer: str, field: str
) -> None:
    with pytest.raises(GraphError) as info:
        validate_graph(layers, ["image"])
    assert info.value.layer == layer
    assert info.value.field == field
    assert f"layer '{layer}'" in str(info.value)


def test_forward_reference_is_rejected_so_graphs_stay_acyclic() -> None:
    layers = [
        {"name": "a", "op": "add", "inputs": ["image", "b"]},
        {"name": "b", "op": "relu", "inputs": ["a"]},
    ]
    with pytest.raises(GraphError, match="not a model input or an earlier layer"):
        validate_graph(layers, ["image"])


def test_empty_graph_is_rejected() -> None:
    with pytest.raises(GraphError, match="non-empty"):
        validate_graph([], ["image"])


def test_excessive_nesting_is_rejected() -> None:
    layers: list[dict[str, Any]] = [{"name": "leaf", "op": "relu"}]
    for depth in range(12):
        layers = [{"name": f"b{depth}", "op": "block", "layers": layers}]
    with pytest.raises(GraphError, match="nest deeper"):
        validate_graph(layers, ["x"])


def test_huge_expansion_is_rejected_without_hanging() -> None:
    inner: list[dict[str, Any]] = [{"name": "r", "op": "relu"}]
    for depth in range(4):
        inner = [{"name": f"rep{depth}", "op": "repeat", "times": 1000, "layers": inner}]
    with pytest.raises(GraphError, match="more than"):
        validate_graph(inner, ["x"])


def test_every_op_in_the_design_vocabulary_is_known() -> None:
    design_ops = {
        "conv2d", "depthwise_conv2d", "pointwise_conv2d", "maxpool2d", "avgpool2d",
        "adaptive_avgpool2d", "batchnorm2d", "layernorm", "rmsnorm", "relu", "gelu", "silu",
        "tanh", "sigmoid", "dropout", "linear", "flatten", "reshape", "add", "concat",
        "embedding", "attention", "mlp", "lstm", "gru", "softmax", "cross_entropy",
        "block", "repeat",
    }  # fmt: skip
    assert design_ops <= set(OP_SPECS)


@pytest.mark.parametrize("fused", [True, False])
def test_fused_attention_is_refused_with_the_request_option_named(fused: bool) -> None:
    """A graph says where attention is, not how it is computed (issue 12)."""
    layers = [
        {
            "name": "blocks",
            "op": "repeat",
            "times": 2,
            "layers": [{"name": "attn", "op": "attention", "num_heads": 4, "fused": fused}],
        }
    ]
    with pytest.raises(GraphError) as caught:
        validate_graph(layers, ["x"])
    assert caught.value.field == "fused"
    assert caught.value.layer == "attn"
    assert "attention=eager|sdpa_math|flash|mem_efficient" in str(caught.value)


def test_attention_spec_has_no_implementation_attribute() -> None:
    assert "fused" not in {*OP_SPECS["attention"].required, *OP_SPECS["attention"].optional}
