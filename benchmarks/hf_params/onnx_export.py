"""Export real PyTorch models to ONNX and import them: parameter counts must be equal.

Uses this folder's venv (torch, transformers, onnx). For each model it runs
``torch.onnx.export`` (TorchScript exporter, opset 17, dynamic batch), imports the bytes with
``app.importers.onnx_model.import_onnx`` and compares the graph's parameter count and the
initializer-derived count with ``sum(p.numel() for p in model.parameters())``. Writes
``onnx_results.md`` beside this file; exits non-zero on any difference.

    benchmarks/hf_params/.venv/bin/python benchmarks/hf_params/onnx_export.py
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.importers.onnx_model import import_onnx  # noqa: E402

HERE = Path(__file__).resolve().parent


class SmallResNet(nn.Module):
    """Conv-BN-ReLU stem, two residual blocks, global pooling and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        )
        self.pool = nn.MaxPool2d(2)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(32, 32, 3, padding=1, bias=False),
                nn.BatchNorm2d(32),
                nn.ReLU(),
                nn.Conv2d(32, 32, 3, padding=1, bias=False),
                nn.BatchNorm2d(32),
            )
            for _ in range(2)
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.stem(x))
        for block in self.blocks:
            x = torch.relu(x + block(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class _Outputs(nn.Module):
    """Calls a transformers model with a keyword input and returns the output that depends on
    every parameter (BERT's pooler output, ViT's logits): the exporter drops unused layers."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.key = "pixel_values" if "ViT" in type(model).__name__ else "input_ids"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = self.model(**{self.key: x})
        return outputs.pooler_output if self.key == "input_ids" else outputs.logits


def small_resnet() -> tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, dict[int, str]]]:
    return SmallResNet().eval(), (torch.randn(2, 3, 32, 32),), {"x": {0: "batch"}}


def tiny_bert() -> tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, dict[int, str]]]:
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.BertModel(config, add_pooling_layer=True).eval()
    return _Outputs(model), (torch.randint(0, 1000, (2, 16)),), {"x": {0: "batch"}}


def tiny_vit() -> tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, dict[int, str]]]:
    config = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, num_labels=10,
    )  # fmt: skip
    model = transformers.ViTForImageClassification(config).eval()
    return _Outputs(model), (torch.randn(2, 3, 32, 32),), {"x": {0: "batch"}}


MODELS: dict[
    str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, dict[int, str]]]]
] = {
    "small-resnet (hand-written, BatchNorm)": small_resnet,
    "tiny BertModel (2 layers, pooler)": tiny_bert,
    "tiny ViTForImageClassification": tiny_vit,
}


def export(
    model: nn.Module, args: tuple[torch.Tensor, ...], axes: dict[str, dict[int, str]]
) -> bytes:
    buffer = io.BytesIO()
    torch.onnx.export(
        model,
        args,
        buffer,
        input_names=["x"],
        dynamic_axes=axes,
        opset_version=17,
        dynamo=False,
        do_constant_folding=False,
    )
    return buffer.getvalue()


def main() -> int:
    rows, ok = [], True
    for label, build in MODELS.items():
        model, args, axes = build()
        expected = sum(p.numel() for p in model.parameters())
        try:
            imported = import_onnx(export(model, args, axes), lenient=False)
            graph, source = imported.parameter_count, imported.source_parameter_count
            note = "; ".join(imported.assumptions)
        except Exception as exc:  # report and go on
            graph = source = None
            note = f"{type(exc).__name__}: {exc}"
        equal = graph == expected == source
        ok &= equal
        shown = [f"{n:,}" if n is not None else "-" for n in (expected, graph, source)]
        verdict = "yes" if equal else "**NO**"
        rows.append(f"| {label} | {' | '.join(shown)} | {verdict} | {note} |")
        print(rows[-1], flush=True)
    header = [
        "# Real ONNX exports vs the importer",
        "",
        f"torch {torch.__version__} (torch.onnx.export, TorchScript exporter, opset 17), "
        f"transformers {transformers.__version__}.",
        "",
        "| model | torch parameters | graph | initializers | equal | notes |",
        "|---|---:|---:|---:|---|---|",
    ]
    (HERE / "onnx_results.md").write_text("\n".join(header + rows) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
