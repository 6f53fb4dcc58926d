"""Write the torch-exported ONNX fixtures of tests/importers/test_torch_exports.py.

Needs torch and transformers (benchmarks/import_fidelity/requirements.txt); run from the
repository root:

    python scripts/export_onnx_fixtures.py

Each model is a tiny Hugging Face model built from a config (nothing is downloaded), exported
with ``torch.onnx.export`` and kept graph-only: the data of every float initializer but
scalars is cleared, and the per-node provenance metadata is trimmed to its
``pkg.torch.onnx.fx_node`` entry (what the importer reads to see a tied head in a graph-only
file, and a GELU computed op by op). Weights are random and norm scales ones (the Llama model keeps
its initialisation): the dynamo exporter's optimizer drops all-zero biases and merges the
equal norm scales (which the importer counts once per layer).
"""

from __future__ import annotations

import io
import sys
import warnings
from pathlib import Path

import onnx
import torch
from transformers import (
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "onnx"
SEQ = torch.export.Dim("seq", min=2, max=64)
BATCH = torch.export.Dim("batch", min=1, max=64)


class LastHidden(torch.nn.Module):
    """Calls a transformers model on token ids and returns its first output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        kwargs = {} if isinstance(self.model, BertModel) else {"use_cache": False}
        return self.model(input_ids=input_ids, **kwargs)[0]


def randomize(model: torch.nn.Module) -> None:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.lower() or ".ln_" in name:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)


def graph_only(data: bytes) -> bytes:
    model = onnx.load_from_string(data)
    for tensor in model.graph.initializer:  # scalars (eps, exponents) keep their values
        if tensor.data_type == onnx.TensorProto.FLOAT and len(tensor.dims) and tensor.dims[-1] > 1:
            for field in ("raw_data", "float_data", "int32_data"):
                tensor.ClearField(field)
    for node in model.graph.node:
        keep = [p for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)
        node.doc_string = ""
    return model.SerializeToString()


class ConvBatchNorm(torch.nn.Module):
    """Conv (no bias) -> BatchNorm2d -> ReLU -> Conv (bias) -> BatchNorm2d (affine=False)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, bias=False), torch.nn.BatchNorm2d(8, eps=1e-3),
            torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3), torch.nn.BatchNorm2d(8, affine=False),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def write(
    name: str, model: torch.nn.Module, example: torch.Tensor, *, dynamo: bool, input_name: str
) -> None:
    """Export ``model`` on ``example`` (dims 0 and, for token ids, 1 dynamic) and write it
    graph-only to tests/fixtures/onnx/NAME.onnx."""
    tokens = not example.is_floating_point()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(
                model, (example,), input_names=[input_name], dynamo=True, verbose=False,
                dynamic_shapes=({0: BATCH, 1: SEQ} if tokens else {0: BATCH},),
            )  # fmt: skip
            data = program.model_proto.SerializeToString()
        else:
            torch.onnx.export(
                model, (example,), buffer, input_names=[input_name], opset_version=17,
                dynamic_axes={input_name: {0: "batch", 1: "seq"} if tokens else {0: "batch"}},
                dynamo=False,
            )  # fmt: skip
            data = buffer.getvalue()
    path = OUT / f"{name}.onnx"
    path.write_bytes(graph_only(data))
    params = sum(p.numel() for p in model.parameters())
    print(f"{path.name}: {path.stat().st_size:,} bytes, {params:,} parameters")


class RecurrentClassifier(torch.nn.Module):
    """Embedding(64, 8) -> GRU or RNN(8, 16, batch_first) -> last step -> Linear(16, 2)."""

    def __init__(self, cell: type[torch.nn.Module]) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(64, 8)
        self.cell = cell(8, 16, batch_first=True)
        self.fc = torch.nn.Linear(16, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.cell(self.embedding(tokens))
        return self.fc(out[:, -1, :])


def export_cnn(name: str, *, train: bool) -> None:
    model = ConvBatchNorm()
    randomize(model)
    write(name, model.train(train), torch.randn(2, 3, 16, 16), dynamo=True, input_name="x")


def export_recurrent(name: str, cell: type[torch.nn.Module]) -> None:
    """GRU with the dynamo exporter (an ONNX GRU node); RNN with the TorchScript exporter (the
    dynamo exporter unrolls nn.RNN over the example's steps, fixing the sequence length)."""
    model = RecurrentClassifier(cell).eval()
    randomize(model)
    tokens = torch.randint(0, 64, (2, 16))
    write(name, model, tokens, dynamo=cell is torch.nn.GRU, input_name="tokens")


def export(name: str, model: torch.nn.Module, *, dynamo: bool, train: bool = False) -> None:
    ids = torch.randint(0, 64, (2, 16))
    write(name, LastHidden(model).train(train), ids, dynamo=dynamo, input_name="input_ids")


def main() -> int:
    torch.manual_seed(0)
    small = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "vocab_size": 64,
        "attn_implementation": "sdpa",
    }
    bert = BertModel(BertConfig(**small, max_position_embeddings=64))
    randomize(bert)
    export("bert_sdpa_dynamo", bert, dynamo=True)
    export("bert_sdpa_dynamo_train", bert, dynamo=True, train=True)  # dropout 0.1 everywhere
    export_cnn("conv_batchnorm_dynamo_train", train=True)
    export_cnn("conv_batchnorm_dynamo_eval", train=False)
    export_recurrent("gru_classifier_dynamo", torch.nn.GRU)
    export_recurrent("rnn_classifier_torchscript", torch.nn.RNN)
    bert_eager = BertModel(
        BertConfig(**{**small, "attn_implementation": "eager"}, max_position_embeddings=64)
    )
    randomize(bert_eager)
    export("bert_eager_torchscript", bert_eager, dynamo=False)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            n_embd=32,
            n_layer=2,
            n_head=4,
            vocab_size=64,
            n_positions=64,
            attn_implementation="sdpa",
        )
    )
    randomize(gpt2)
    export("gpt2_sdpa_dynamo", gpt2, dynamo=True)
    llama = LlamaForCausalLM(
        LlamaConfig(**small, num_key_value_heads=2, max_position_embeddings=64)
    )
    export("llama_gqa_sdpa_dynamo", llama, dynamo=True)  # default init: norm scales all ones
    return 0


if __name__ == "__main__":
    sys.exit(main())
