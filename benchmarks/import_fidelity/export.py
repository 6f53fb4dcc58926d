"""Export every model measured in ``benchmarks/fidelity/measurements.json`` through the three
import routes (run in the bench venv, which has torch; nothing is downloaded).

    PYTHONPATH=. /work/benchvenv/.venv/bin/python benchmarks/import_fidelity/export.py

Per model (built exactly as ``benchmarks/fidelity/models.py`` builds it) and per export mode
(``eval``: ``model.eval()``; ``train``: ``model.train()``, see README.md for which one each
measured configuration uses):

* ``out/onnx/<model>.<mode>.onnx``: ONNX with weights inline (``torch.onnx.export(...,
  dynamo=True)``, opset 18, dynamic batch and sequence axes);
* ``out/graph/<model>.<mode>.onnx``: the same export saved with ``external_data=True``, the
  ``.data`` file deleted (graph only, a few MB); copied to ``graphs/`` when under 2 MB;
* ``graphs/<model>.traced.json``: ``app.client.torch_import.trace_module`` of the model
  built on the meta device (when that module exists; it traces in training mode);
* ``graphs/manifest.json``: parameter counts (``sum(p.numel() for p in model.parameters())``),
  sizes, export times, op-type counts and every failure.

The 2-layer Llama-2-7B goes through every route (in bf16, so its weights fit one protobuf);
the full-size Llama-2-7B is built on the meta device and only goes through the graph-only and
tracer routes (its initializers point at a ``.data`` file that is never written).
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import json
import logging
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import Tensor, nn

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "fidelity"))
sys.path.insert(0, str(REPO))

from models import build_model, count_params  # noqa: E402

OUT = HERE / "out"
GRAPHS = HERE / "graphs"
COMMIT_LIMIT = 2 * 2**20  # trimmed graph-only files up to this size are committed in graphs/
OPSET = 18
MODES = ("eval", "train")


@dataclass(frozen=True)
class Spec:
    """One exported model: how to build it and what it reads."""

    name: str  # artifact name
    model: str  # measurements.json model id
    layers: int | None = None
    dtype: torch.dtype = torch.float32
    meta: bool = False  # too big to allocate: meta device, graph-only and tracer routes only
    # the TorchScript exporter (dynamo=False): the dynamo exporter unrolls nn.RNN over the
    # example's steps, fixing the sequence length; TorchScript writes one ONNX RNN node
    torchscript: bool = False
    image: bool = True

    @property
    def family(self) -> str:
        if self.model in {"bert_base", "vit_b16"}:
            return self.model.split("_")[0]
        if self.model in {"gpt2_small", "llama2_7b"}:
            return "causal_lm"
        if self.model.endswith("_classifier"):  # lstm / gru / rnn
            return "lstm"
        return "cnn"


SPECS: list[Spec] = [
    Spec("alexnet", "alexnet"),
    Spec("vgg16", "vgg16"),
    Spec("googlenet", "googlenet"),
    Spec("resnet50", "resnet50"),
    Spec("mobilenet_v2", "mobilenet_v2"),
    Spec("lstm_classifier", "lstm_classifier", image=False),
    Spec("gru_classifier", "gru_classifier", image=False),
    Spec("rnn_classifier", "rnn_classifier", image=False, torchscript=True),
    Spec("vit_b16", "vit_b16"),
    Spec("bert_base", "bert_base", image=False),
    Spec("gpt2_small", "gpt2_small", image=False),
    Spec("llama2_7b_l2", "llama2_7b", layers=2, dtype=torch.bfloat16, image=False),
    Spec("llama2_7b", "llama2_7b", dtype=torch.bfloat16, meta=True, image=False),
]


class Forward(nn.Module):
    """What the measurement's forward returns, as one tensor-only module (exportable)."""

    def __init__(self, family: str, model: nn.Module) -> None:
        super().__init__()
        self.family = family
        self.model = model

    def forward(self, x: Tensor) -> Any:
        if self.family in ("cnn", "lstm"):
            return self.model(x)
        if self.family == "vit":
            return self.model(pixel_values=x).logits
        if self.family == "bert":
            out = self.model(input_ids=x)
            return out.last_hidden_state, out.pooler_output
        return self.model(input_ids=x, use_cache=False).logits


def training_export(module: nn.Module) -> str:
    """The export whose graph training configurations are estimated with.

    ``train`` when training mode changes what the model computes (dropout with p > 0, batch
    norm); otherwise ``eval``, which is the same computation (the dynamo exporter specialises
    the LSTM's sequence axis to the example's length in train mode).
    """
    for sub in module.modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm):
            return "train"
        if isinstance(sub, nn.Dropout) and sub.p > 0:
            return "train"
    return "eval"


def example_input(spec: Spec, device: str = "cpu") -> tuple[str, Tensor, dict[int, Any]]:
    """Input name, an example tensor and its dynamic axes (torch.export Dims)."""
    batch = torch.export.Dim("batch", min=1, max=1024)
    if spec.family == "cnn":
        return "x", torch.randn(2, 3, 224, 224, device=device), {0: batch}
    if spec.family == "vit":
        return "pixel_values", torch.randn(2, 3, 224, 224, device=device), {0: batch}
    seq = torch.export.Dim("seq", min=2, max=4096)
    name = "tokens" if spec.family == "lstm" else "input_ids"
    return name, torch.randint(0, 1000, (2, 16), device=device), {0: batch, 1: seq}


def trace_spec_inputs(spec: Spec) -> list[str]:
    """``parse_input`` strings for the tracer route."""
    if spec.family in ("cnn", "vit"):
        name = "x" if spec.family == "cnn" else "pixel_values"
        return [f"{name}:batch,3,224,224"]
    name = "tokens" if spec.family == "lstm" else "input_ids"
    return [f"{name}:batch,seq:int64"]


def build(spec: Spec, device: str = "cpu") -> nn.Module:
    return build_model(spec.model, layers=spec.layers, dtype=spec.dtype, device=device)


# --------------------------------------------------------------------------- ONNX routes


def _export(spec: Spec, module: nn.Module, mode: str) -> torch.onnx.ONNXProgram:
    name, x, axes = example_input(spec, "meta" if spec.meta else "cpu")
    if spec.dtype != torch.float32 and x.is_floating_point():
        x = x.to(spec.dtype)
    wrapper = Forward(spec.family, module)
    wrapper.train(mode == "train")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(
            wrapper,
            (x,),
            dynamo=True,
            opset_version=OPSET,
            input_names=[name],
            dynamic_shapes=(axes,),
            optimize=False,  # program.optimize() below: the default optimizer, after export
            verbose=False,
        )


def randomize(module: nn.Module) -> None:
    """Give every parameter its own random values, as trained weights have.

    A freshly initialised model has all-zero biases and equal norm scales, and
    ``materialize_random`` tiles every tensor from one pool, so different parameters hold
    equal values: the exporter's optimizer then drops the zero biases and merges the equal
    tensors, and the importer ties an untied head to an equal embedding table. None of that
    happens to a trained model. Running statistics (buffers) keep their values.
    """
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            flat = param.view(-1)
            for start in range(0, flat.numel(), 1 << 24):
                chunk = flat[start : start + (1 << 24)]
                values = torch.randn(chunk.numel(), generator=generator) * 0.02
                chunk.copy_(values.to(chunk.dtype))


def _meta_to_external(program: torch.onnx.ONNXProgram) -> int:
    """Point the meta-device initializers at a ``.data`` file that is never written.

    Small ones (rotary ``inv_freq``) get zeros, so the optimizer can fold what it folds for a
    real model; the big ones are dims only. Returns the number of external initializers.
    """
    import onnx_ir as ir
    from torch.onnx._internal.exporter._core import TorchTensor

    external, offset = 0, 0
    for value in program.model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None:
            continue
        torch_tensor = getattr(tensor, "raw", None)
        if not isinstance(torch_tensor, Tensor) or not torch_tensor.is_meta:
            continue
        shape = ir.Shape(tuple(torch_tensor.shape))
        dtype = tensor.dtype
        if torch_tensor.numel() <= 8192:
            zeros = torch.zeros(tuple(torch_tensor.shape), dtype=torch_tensor.dtype)
            value.const_value = TorchTensor(zeros, name=value.name)
            continue
        length = torch_tensor.numel() * torch_tensor.element_size()
        value.const_value = ir.ExternalTensor(
            "never-written.data", offset, length, dtype, shape=shape, name=value.name
        )
        offset += length
        external += 1
    return external


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts = collections.Counter(node.op_type for node in model.graph.node)
    for function in model.functions:  # none after the optimizer's inlining, but be sure
        counts.update(f"{function.name}/{node.op_type}" for node in function.node)
    return dict(sorted(counts.items()))


def export_onnx(spec: Spec, module: nn.Module, mode: str, entry: dict[str, Any]) -> None:
    """Both ONNX routes for one model and mode; records sizes and op counts in ``entry``."""
    started = time.perf_counter()
    if spec.torchscript:
        _export_torchscript(spec, module, mode, entry)
        return
    program = _export(spec, module, mode)
    if not spec.meta:  # the optimizer folds constants: it cannot read meta tensors
        program.optimize()
    entry["export_s"] = round(time.perf_counter() - started, 1)
    graph_path = OUT / "graph" / f"{spec.name}.{mode}.onnx"
    graph_path.parent.mkdir(parents=True, exist_ok=True)
    if spec.meta:
        entry["external_initializers"] = _meta_to_external(program)
        import onnx_ir as ir

        program.optimize()
        proto = ir.serde.serialize_model(program.model)
        onnx.save_model(proto, graph_path)
    else:
        weights_path = OUT / "onnx" / f"{spec.name}.{mode}.onnx"
        weights_path.parent.mkdir(parents=True, exist_ok=True)
        program.save(weights_path, external_data=False)
        entry["weights_bytes"] = weights_path.stat().st_size
        program.save(graph_path, external_data=True)
        data = graph_path.with_name(graph_path.name + ".data")
        if data.exists():
            data.unlink()
        proto = program.model_proto
    entry["save_s"] = round(time.perf_counter() - started - entry["export_s"], 1)
    _commit(graph_path, proto, entry)


def _export_torchscript(spec: Spec, module: nn.Module, mode: str, entry: dict[str, Any]) -> None:
    """``torch.onnx.export(..., dynamo=False)``, opset 17, dynamic batch and sequence axes."""
    started = time.perf_counter()
    name, x, _ = example_input(spec)
    module.train(mode == "train")
    weights_path = OUT / "onnx" / f"{spec.name}.{mode}.onnx"
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Forward(spec.family, module), (x,), weights_path, dynamo=False, opset_version=17,
            input_names=[name], dynamic_axes={name: {0: "batch", 1: "seq"}},
        )  # fmt: skip
    entry["export_s"] = round(time.perf_counter() - started, 1)
    entry["weights_bytes"] = weights_path.stat().st_size
    proto = onnx.load(weights_path)
    for tensor in proto.graph.initializer:  # graph only: the float data cleared
        if tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            if len(tensor.dims) and tensor.dims[-1] > 1:
                tensor.ClearField("raw_data")
    graph_path = OUT / "graph" / f"{spec.name}.{mode}.onnx"
    graph_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, graph_path)
    entry["save_s"] = round(time.perf_counter() - started - entry["export_s"], 1)
    _commit(graph_path, proto, entry)


def _commit(graph_path: Path, proto: onnx.ModelProto, entry: dict[str, Any]) -> None:
    """Record the graph-only file's size and ops; copy it, trimmed, to graphs/ if small."""
    entry["graph_bytes"] = graph_path.stat().st_size
    entry["ops"] = _op_counts(proto)
    committed = GRAPHS / graph_path.name
    GRAPHS.mkdir(exist_ok=True)
    committed.write_bytes(trimmed(graph_path))
    entry["committed_bytes"] = committed.stat().st_size
    if entry["committed_bytes"] <= COMMIT_LIMIT:
        entry["committed"] = f"graphs/{graph_path.name}"
    else:
        committed.unlink()


def trimmed(graph_path: Path) -> bytes:
    """The graph-only file with each node's provenance cut to ``pkg.torch.onnx.fx_node`` (what
    the importer reads), dropping the exporter's stack traces and scope names: a tenth of the
    size, the same import."""
    model = onnx.load(graph_path, load_external_data=False)
    for node in model.graph.node:
        keep = [p for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)
        node.doc_string = ""
    return bytes(model.SerializeToString())


# --------------------------------------------------------------------------- tracer route


def tracer() -> tuple[Callable[..., dict[str, Any]], Callable[[str], Any]] | None:
    try:
        from app.client.torch_import import parse_input, trace_module
    except ImportError:
        return None
    return trace_module, parse_input


def trace(spec: Spec, entry: dict[str, Any]) -> None:
    """``trace_module`` on the model built on the meta device; writes the body fragment.

    The tracer always traces in training mode (dropout and batch norm as in training), so there
    is one trace per model for training and inference configurations alike.
    """
    found = tracer()
    if found is None:
        entry["error"] = "tracer not available (app.client.torch_import not importable)"
        return
    trace_module, parse_input = found
    module = build(spec, "meta")
    wrapper = Forward(spec.family, module)
    inputs = [parse_input(text) for text in trace_spec_inputs(spec)]
    seq = 128 if spec.family in ("bert", "causal_lm", "lstm") else None
    started = time.perf_counter()
    fragment = trace_module(wrapper, inputs, sequence_length=seq)
    entry["trace_s"] = round(time.perf_counter() - started, 1)
    path = GRAPHS / f"{spec.name}.traced.json"
    GRAPHS.mkdir(exist_ok=True)
    path.write_text(json.dumps(fragment, indent=None, separators=(",", ":")) + "\n")
    entry["bytes"] = path.stat().st_size
    entry["layers"] = len(fragment.get("layers", []))
    entry["committed"] = f"graphs/{path.name}"


# --------------------------------------------------------------------------- driver


def _run(what: str, entry: dict[str, Any], fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # one model's failure must not end the run
        entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}"
        (OUT / "errors").mkdir(parents=True, exist_ok=True)
        (OUT / "errors" / f"{what}.txt").write_text(traceback.format_exc())
        print(f"  FAILED {what}: {entry['error']}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="artifact names (default: all)")
    parser.add_argument("--routes", nargs="*", default=["onnx", "trace"])
    parser.add_argument("--modes", nargs="*", default=list(MODES))
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    OUT.mkdir(exist_ok=True)
    GRAPHS.mkdir(exist_ok=True)
    manifest_path = GRAPHS / "manifest.json"
    manifest: dict[str, Any] = (
        json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}}
    )
    manifest["versions"] = {
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "transformers": __import__("transformers").__version__,
        "onnxscript": __import__("onnxscript").__version__,
        "opset": OPSET,
    }
    total = time.perf_counter()
    for spec in SPECS:
        if args.only and spec.name not in args.only:
            continue
        record = manifest["models"].setdefault(spec.name, {})
        record |= {
            "model": spec.model,
            "layers": spec.layers,
            "dtype": str(spec.dtype).removeprefix("torch."),
            "meta": spec.meta,
        }
        print(f"{spec.name}:", flush=True)
        module = build(spec, "meta" if spec.meta else "cpu")
        if not spec.meta:
            randomize(module)
        record["params"] = count_params(module)
        record["training_export"] = training_export(module)
        print(f"  params {record['params']:,}", flush=True)
        for mode in args.modes:
            if "onnx" in args.routes:
                entry: dict[str, Any] = {}
                record.setdefault("onnx", {})[mode] = entry
                _run(
                    f"{spec.name}.{mode}.onnx",
                    entry,
                    functools.partial(export_onnx, spec, module, mode, entry),
                )
                shown = {k: v for k, v in entry.items() if k != "ops"}
                print(f"  onnx {mode}: {json.dumps(shown)}", flush=True)
                manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
                gc.collect()
        if "trace" in args.routes:
            entry = {}
            record["trace"] = entry
            _run(f"{spec.name}.trace", entry, functools.partial(trace, spec, entry))
            print(f"  trace: {json.dumps(entry)}", flush=True)
            manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
        module = None  # release the weights before the next model is built
        gc.collect()
    manifest["last_run_s"] = round(time.perf_counter() - total, 1)
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"done in {manifest['last_run_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
