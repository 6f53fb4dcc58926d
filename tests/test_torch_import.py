"""`capplan import torch`: the torch-free conversion of recorded traces, and the CLI.

The fixtures in ``tests/fixtures/torch/`` are traces recorded with torch
(``tests/fixtures/torch/record.py``); this suite runs without torch.
"""

import io
import itertools
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.client import torch_import
from app.client.cli import main
from app.client.torch_graph import convert_trace
from app.client.torch_trace import TraceError, TraceInput, merge_probes, parse_input
from app.domain.graph.analysis import GraphAnalysis, InputDecl
from app.domain.graph.format import validate_graph
from app.domain.graph.ops import TensorKind
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.workload import Mode, Runtime
from app.domain.zoo import ZOO, bert, gpt2, lstm_classifier, transformers, vit
from app.main import create_app
from tests.support import settings_for

FIXTURES = Path(__file__).parent / "fixtures" / "torch"


def load(name: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return record


def decls(inputs: list[dict[str, Any]]) -> tuple[InputDecl, ...]:
    return tuple(
        InputDecl(
            name=spec["name"],
            shape=tuple(spec["shape"]),
            kind=TensorKind.INDEX if spec["dtype"] == "int64" else TensorKind.FLOAT,
        )
        for spec in inputs
    )


def peak(
    inputs: tuple[InputDecl, ...],
    layers: Any,
    bindings: Mapping[str, int],
    mode: Mode,
) -> tuple[int, int]:
    request = MemoryRequest(mode=mode, runtime=Runtime.CPU)
    analysis = analyze_for(inputs, layers, bindings, request)
    estimate = estimate_memory(analysis, request)
    first = estimate.first_iteration_peak_bytes
    return analysis.params, first if mode is Mode.TRAINING and first else estimate.peak_bytes


# fixture -> the zoo graph of the same architecture (reduced depths as recorded)
ZOO_GRAPHS: dict[str, Any] = {
    "alexnet": ZOO["alexnet"],
    "resnet50": ZOO["resnet-50"],
    "mobilenet_v2": ZOO["mobilenet-v2"],
    "googlenet": ZOO["googlenet"],
    "lstm_classifier": lstm_classifier(),
    "gru_classifier": lstm_classifier(cell="gru"),
    "rnn_classifier": lstm_classifier(cell="rnn"),
    "gpt2_2l": gpt2(layers=2),
    "bert_1l": bert(layers=1),
    "vit_1l": vit(layers=1),
    "llama_gqa_2l": SimpleNamespace(
        **dict(zip(("inputs", "layers"), transformers.llama(
            layers=2, hidden=256, heads=8, kv_heads=2, intermediate=512, vocab=1000, head_dim=128
        ), strict=True))
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ZOO_GRAPHS))
def test_traces_convert_to_the_zoo_graph_exactly(name: str) -> None:
    record = load(name)
    graph = convert_trace(record, sequence_length=128)
    validate_graph(graph["layers"], [spec["name"] for spec in graph["inputs"]])
    zoo = ZOO_GRAPHS[name]
    bindings = {"batch": 2, "seq": 128, "image": 224}
    for mode in (Mode.TRAINING, Mode.INFERENCE):
        params, traced = peak(decls(graph["inputs"]), graph["layers"], bindings, mode)
        zoo_params, expected = peak(zoo.inputs, zoo.layers, bindings, mode)
        assert params == record["param_count"] == zoo_params
        assert traced == pytest.approx(expected, rel=0.01), mode


def test_symbolic_dims_and_bindings() -> None:
    graph = convert_trace(load("gpt2_2l"), sequence_length=512)
    assert graph["inputs"] == [{"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"}]
    assert graph["default_bindings"] == {"seq": 512}
    assert convert_trace(load("vit_1l"))["inputs"][0]["shape"] == ["batch", 3, 224, 224]
    unbound = convert_trace(load("gpt2_2l"))
    assert unbound["default_bindings"] == {}
    assert any("--seq" in note for note in unbound["assumptions"])


def by_op(graph: dict[str, Any], op: str) -> list[dict[str, Any]]:
    return [layer for layer in graph["layers"] if layer["op"] == op]


def test_gpt2_attention_mlp_and_tied_head() -> None:
    graph = convert_trace(load("gpt2_2l"))
    attention = by_op(graph, "attention")
    assert len(attention) == 2
    assert {k: v for k, v in attention[0].items() if k not in ("name", "inputs")} == {
        "op": "attention", "num_heads": 12, "causal": True, "qkv_bias": True,
        "out_bias": True, "dropout": 0.1,
    }  # fmt: skip
    assert [m["activation"] for m in by_op(graph, "mlp")] == ["gelu_new", "gelu_new"]
    head = graph["layers"][-1]
    assert head["op"] == "linear"
    assert head["tied_to"] == "transformer.wte"
    assert by_op(graph, "embedding_add")[0]["num_embeddings"] == 1024


def test_llama_gqa_rotary_swiglu() -> None:
    graph = convert_trace(load("llama_gqa_2l"))
    attention = by_op(graph, "attention")[0]
    assert attention["num_heads"] == 8
    assert attention["num_kv_heads"] == 2
    assert attention["head_dim"] == 128
    assert attention["rotary"] is attention["causal"] is True
    assert attention["qkv_bias"] is attention["out_bias"] is False
    assert by_op(graph, "mlp")[0]["activation"] == "swiglu"
    assert len(by_op(graph, "rmsnorm")) == 5
    assert "tied_to" not in graph["layers"][-1]


def test_bert_vit_embeddings_and_cnn_ops() -> None:
    bert_graph = convert_trace(load("bert_1l"))
    adds = {
        layer["num_embeddings"]: layer.get("positional", True)
        for layer in by_op(bert_graph, "embedding_add")
    }
    assert adds == {512: True, 2: False}
    vit_graph = convert_trace(load("vit_1l"))
    assert len(by_op(vit_graph, "cls_token")) == 1
    assert by_op(vit_graph, "embedding_add")[0]["num_embeddings"] == 197
    assert not by_op(vit_graph, "dropout")  # p = 0: identities, left out as in the zoo
    mobilenet = convert_trace(load("mobilenet_v2"))
    assert len(by_op(mobilenet, "depthwise_conv2d")) == 17
    assert len(by_op(mobilenet, "batchnorm2d")) == 52
    resnet = convert_trace(load("resnet50"))
    assert all(layer.get("inplace") for layer in by_op(resnet, "add"))
    googlenet = convert_trace(load("googlenet"))
    assert len(by_op(googlenet, "concat")) == 9
    lstm = convert_trace(load("lstm_classifier"))
    assert [layer["op"] for layer in lstm["layers"]] == ["embedding", "lstm", "select", "linear"]


def test_hand_written_attention_and_multihead_attention() -> None:
    record = load("tiny_encoder")
    graph = convert_trace(record)
    eager, mha = by_op(graph, "attention")
    assert (eager["num_heads"], eager["out_bias"], eager["dropout"]) == (4, False, 0.1)
    assert (mha["num_heads"], mha["qkv_bias"], mha["out_bias"]) == (8, True, True)
    assert by_op(graph, "mlp")[0]["activation"] == "gelu_tanh"
    assert by_op(graph, "rmsnorm")[0]["eps"] == 1e-6
    assert graph["layers"][-1]["tied_to"] == "embed"
    params, _ = peak(
        decls(graph["inputs"]), graph["layers"], {"batch": 1, "seq": 8}, Mode.INFERENCE
    )
    assert params == record["param_count"] == 73_024


def test_unsupported_ops_are_named() -> None:
    record = load("alexnet")
    for event in record["events"]:
        if event.get("fn") == "flatten":
            event["fn"] = "fancy_op"
    with pytest.raises(TraceError, match="fancy_op"):
        convert_trace(record)


def test_a_size_dependent_graph_is_refused() -> None:
    record = load("alexnet")
    other = {**record, "events": record["events"][:-1], "probe": {"batch": 3, "seq": 7}}
    first = {**record, "probe": {"batch": 2, "seq": 5}}
    with pytest.raises(TraceError, match="depends on the input size"):
        merge_probes([first, other], [])


# --------------------------------------------------------------------------- 3-d models


def wiring(layers: Sequence[Mapping[str, Any]], inputs: list[str]) -> list[list[int]]:
    """Each layer's inputs as positions (-1 - i for graph input i): names left out."""
    where = {name: -1 - i for i, name in enumerate(inputs)}
    found = []
    for index, layer in enumerate(layers):
        sources = layer.get("inputs", [layers[index - 1]["name"] if index else inputs[0]])
        found.append([where[ref] for ref in sources])
        where[layer["name"]] = index
    return found


def test_mlperf_unet3d_traces_to_the_zoo_graph() -> None:
    """MLPerf's 3D U-Net built in PyTorch (``record.py`` ``Unet3D``) traces to the zoo's
    ``3d-unet-kits19`` layer for layer: the same ops, attributes and skip wiring, 31,190,243
    parameters, and the same memory estimate in every mode, runtime and batch."""
    record = load("unet3d")
    graph = convert_trace(record)
    layers = graph["layers"]
    validate_graph(layers, ["volume"])
    zoo = ZOO["3d-unet-kits19"]
    assert graph["inputs"] == [
        {"name": "volume", "shape": ["batch", 1, 128, 128, 128], "dtype": "float"}
    ]
    assert record["param_count"] == zoo.reference_params == 31_190_243

    def attributes(layer: Mapping[str, Any]) -> dict[str, Any]:
        found = {k: v for k, v in layer.items() if k not in ("name", "inputs")}
        if found["op"] == "concat" and found.get("dim") == 1:  # the op's default
            del found["dim"]
        return found

    assert [attributes(layer) for layer in layers] == [attributes(layer) for layer in zoo.layers]
    assert wiring(layers, ["volume"]) == wiring(zoo.layers, ["volume"])
    assert by_op(graph, "concat")[0]["inputs"] == [
        "upsample.0.upsample_conv.0", "downsample.3.conv2.2"
    ]  # fmt: skip
    # one nn.ReLU() shared by every block: each call named after the block that runs it
    assert [layer["name"] for layer in by_op(graph, "relu")][:3] == [
        "input_block.conv1.2", "input_block.conv2.2", "downsample.0.conv1.2"
    ]  # fmt: skip
    inputs = decls(graph["inputs"])
    for mode, runtime, batch in itertools.product(Mode, (Runtime.CPU, Runtime.CUDA), (1, 2)):
        request = MemoryRequest(mode=mode, runtime=runtime)
        analysis = analyze_for(inputs, layers, {"batch": batch}, request)
        expected_analysis = analyze_for(
            zoo.inputs, zoo.layers, {"batch": batch, "image": 128}, request
        )
        assert analysis.params == expected_analysis.params == 31_190_243
        traced = estimate_memory(analysis, request)
        expected = estimate_memory(expected_analysis, request)
        case = (mode, runtime, batch)
        assert traced.peak_bytes == expected.peak_bytes, case
        assert traced.first_iteration_peak_bytes == expected.first_iteration_peak_bytes, case
        assert traced.phase_peaks == expected.phase_peaks, case
        assert [(line.key, line.bytes) for line in traced.lines] == [
            (line.key, line.bytes) for line in expected.lines
        ], case
        assert traced.cuda == expected.cuda, case

        def figures(analysis: GraphAnalysis) -> list[tuple[Any, ...]]:
            return [
                (m.op, m.output_shape, m.output_storage, m.allocates_output, m.result)
                for m in analysis.layers
            ]

        assert figures(analysis) == figures(expected_analysis), case


def test_conv_transpose3d_output_padding_and_instance_norm_without_affine() -> None:
    record = load("volume3d")
    graph = convert_trace(record)
    assert [{k: v for k, v in layer.items() if k != "inputs"} for layer in graph["layers"]] == [
        {"name": "down", "op": "conv3d", "out_channels": 4, "kernel_size": [3, 3, 1],
         "stride": [2, 2, 1], "padding": [1, 1, 0], "bias": False},
        {"name": "norm", "op": "instancenorm3d", "eps": 1e-3},  # affine False: PyTorch's default
        {"name": "act", "op": "relu", "inplace": True},
        {"name": "up", "op": "conv_transpose3d", "out_channels": 2, "kernel_size": 3,
         "stride": [2, 2, 1], "padding": 1, "output_padding": [1, 1, 0]},
        # called with output_size=[17, 16, 17]: the output padding that size took
        {"name": "up2", "op": "conv_transpose3d", "out_channels": 2, "kernel_size": 2,
         "stride": 2, "output_padding": [1, 0, 1]},
    ]  # fmt: skip
    validate_graph(graph["layers"], ["x"])
    request = MemoryRequest(mode=Mode.TRAINING, runtime=Runtime.CPU)
    analysis = analyze_for(decls(graph["inputs"]), graph["layers"], {"batch": 3}, request)
    assert analysis.params == record["param_count"] == 72 + 0 + (216 + 2) + (32 + 2)
    layers = {m.name: m for m in analysis.layers}
    assert layers["norm"].result.params == 0
    assert layers["up"].output_shape == (3, 2, 8, 8, 8)
    assert layers["up2"].output_shape == (3, 2, 17, 16, 17)  # as PyTorch traced it
    assert estimate_memory(analysis, request).peak_bytes > 0
    assert record["tensors"][record["events"][-1]["out"]["t"]]["shape"] == ["batch", 2, 17, 16, 17]


def test_unsupported_3d_modules_are_refused_by_name() -> None:
    with pytest.raises(TraceError) as refused:
        convert_trace(load("refused3d"))
    message = str(refused.value)
    assert message.startswith("the traced graph uses ops the service cannot model: ")
    assert "MaxPool3d: no 3-d pooling op (1x, e.g. pool)" in message
    assert "BatchNorm3d: no 3-d batch norm op (1x, e.g. norm)" in message
    assert "InstanceNorm3d with track_running_stats (1x, e.g. tracked)" in message
    with pytest.raises(TraceError, match=r"ConvTranspose2d: no 2-d transposed convolution op"):
        convert_trace(load("decoder2d"))


def test_conv3d_padding_mode_is_refused() -> None:
    record = load("volume3d")
    for event in record["events"]:
        if event.get("type") == "Conv3d":
            event["attrs"]["padding_mode"] = "reflect"
    with pytest.raises(TraceError, match="Conv3d with padding_mode 'reflect'"):
        convert_trace(record)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ids:batch,seq:int64", TraceInput(name="ids", shape=("batch", "seq"), dtype="int64")),
        ("pixels:batch,3,224,224", TraceInput(name="pixels", shape=("batch", 3, 224, 224))),
    ],
)  # fmt: skip
def test_parse_input(text: str, expected: TraceInput) -> None:
    assert parse_input(text) == expected


@pytest.mark.parametrize(
    "text", ["input_ids", "x:batch,0", "x:batch,image", "x:batch:int32", "1x:batch", "x::"]
)
def test_parse_input_rejects(text: str) -> None:
    with pytest.raises(TraceError, match="--input"):
        parse_input(text)


# --------------------------------------------------------------------------- the CLI


def cli(*argv: str, http: TestClient | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), http=http, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


TRACE = ["import", "torch", "tests.test_torch_import:Factory", "--slug", "tiny"]


class Factory:
    """Stands in for a user's model class (the trace itself is monkeypatched)."""


def test_missing_torch_is_a_clear_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` sees without torch
    code, _, err = cli(*TRACE, "--input", "input_ids:batch,seq:int64")
    assert code == 2
    assert "pip install 'capacity-planner[torch]'" in err


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_colon", "expected MODULE:FACTORY"),
        ("no_such_module_xyz:build", "cannot import module"),
        ("tests.test_torch_import:missing", "has no attribute"),
        ("tests.test_torch_import:FIXTURES", "not callable"),
    ],
)
def test_bad_factory(factory: str, message: str) -> None:
    code, _, err = cli("import", "torch", factory, "--slug", "x", "--input", "x:batch,3")
    assert code == 2
    assert message in err


def test_bad_input_flag() -> None:
    code, _, err = cli(*TRACE, "--input", "input_ids:batch,sequence")
    assert code == 2
    assert "must be a positive integer, batch or seq" in err
    assert cli(*TRACE)[0] == 2  # --input is required


@pytest.fixture
def fake_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trace without torch: the tiny encoder's recorded trace stands in for the real one."""

    def trace(factory: Any, inputs: Any, *, sequence_length: int | None = None) -> dict[str, Any]:
        assert factory is Factory
        assert inputs == [parse_input("input_ids:batch,seq:int64")]
        return convert_trace(load("tiny_encoder"), sequence_length=sequence_length)

    monkeypatch.setattr(torch_import, "import_torch", lambda: None)
    monkeypatch.setattr(torch_import, "trace_factory", trace)


@pytest.mark.usefixtures("fake_trace")
def test_dry_run_prints_the_body() -> None:
    code, out, _ = cli(*TRACE, "--input", "input_ids:batch,seq:int64", "--seq", "32", "--dry-run")
    assert code == 0
    body = json.loads(out)
    assert body["slug"] == "tiny"
    assert body["family"] == "transformer"
    assert body["default_bindings"] == {"seq": 32}


@pytest.fixture
def http(db_url: str) -> Iterator[TestClient]:
    app = create_app(settings_for(db_url))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    app.state.engine.dispose()


@pytest.mark.usefixtures("fake_trace")
def test_import_posts_the_traced_graph(http: TestClient) -> None:
    code, out, err = cli(*TRACE, "--input", "input_ids:batch,seq:int64", "--seq", "32", http=http)
    assert code == 0, err
    assert "imported 'tiny'" in out
    assert "73,024 parameters in the graph" in out
    summary = http.get("/v1/models/tiny/summary", params={"batch_size": 2})
    assert summary.status_code == 200, summary.text
    assert summary.json()["total_params"] == 73_024
    code, _, err = cli(*TRACE, "--input", "input_ids:batch,seq:int64", http=http)
    assert code == 3  # the slug is taken: the API's answer, exit code 3
    assert "error 409" in err


TRANSPOSED_ONLY = {
    "inputs": [{"name": "x", "shape": ["batch", 4, 8, 8, 8], "dtype": "float"}],
    "layers": [{"name": "up", "op": "conv_transpose3d", "out_channels": 2, "kernel_size": 2}],
    "default_bindings": {},
}


@pytest.mark.parametrize("fixture", ["unet3d", "transposed_only"])
def test_a_traced_3d_model_is_a_cnn(monkeypatch: pytest.MonkeyPatch, fixture: str) -> None:
    """The family guessed from the traced ops: 3-d convolutions (or transposed ones) are CNNs."""

    def trace(factory: Any, inputs: Any, *, sequence_length: int | None = None) -> dict[str, Any]:
        if fixture == "transposed_only":
            return TRANSPOSED_ONLY
        return convert_trace(load(fixture), sequence_length=sequence_length)

    monkeypatch.setattr(torch_import, "import_torch", lambda: None)
    monkeypatch.setattr(torch_import, "trace_factory", trace)
    code, out, err = cli(
        "import", "torch", "tests.test_torch_import:Factory", "--slug", "vol",
        "--input", "volume:batch,1,128,128,128", "--dry-run",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["family"] == "cnn"


def test_the_traced_unet3d_is_stored_and_estimated(
    monkeypatch: pytest.MonkeyPatch, http: TestClient
) -> None:
    def trace(factory: Any, inputs: Any, *, sequence_length: int | None = None) -> dict[str, Any]:
        return convert_trace(load("unet3d"), sequence_length=sequence_length)

    monkeypatch.setattr(torch_import, "import_torch", lambda: None)
    monkeypatch.setattr(torch_import, "trace_factory", trace)
    code, out, err = cli(
        "import", "torch", "tests.test_torch_import:Factory", "--slug", "unet",
        "--input", "volume:batch,1,128,128,128", http=http,
    )  # fmt: skip
    assert code == 0, err
    assert "31,190,243 parameters in the graph" in out
    peaks = []
    for slug in ("unet", "3d-unet-kits19"):
        summary = http.get(f"/v1/models/{slug}/summary", params={"batch_size": 1})
        assert summary.status_code == 200, summary.text
        assert summary.json()["total_params"] == 31_190_243
        estimate = http.post(
            "/v1/estimates/memory", json={"model": slug, "mode": "training", "batch_size": 2}
        )
        assert estimate.status_code == 200, estimate.text
        peaks.append(estimate.json()["peak_bytes"])
    assert peaks[0] == peaks[1]  # the zoo model's default image size is 128
