"""Check the service's 4-bit base against bitsandbytes and transformers themselves.

1. Bytes per quantized weight: ``bitsandbytes.functional.quantize_4bit`` (CPU backend) on
   random weights of several shapes, nf4 / fp4, with and without double quantization; the
   stored bytes are the packed tensor's plus every tensor of its ``QuantState`` (absmax, the
   4-bit code book, and with double quantization the offset and the nested state's absmax and
   code book), against ``app.domain.peft.qlora.linear4bit_tensors``.
2. Which modules are quantized: the importer's reference class built from each config on the
   meta device, ``Bnb4BitHfQuantizer.get_modules_to_not_convert(model, None,
   model._keep_in_fp32_modules)`` then ``transformers.integrations.bitsandbytes.
   replace_with_bnb_linear``; the number of ``Linear4bit`` modules and their weight elements
   against ``app.domain.peft.qlora.quantized_base``.

It writes ``qlora_results.md`` beside this file and exits non-zero on any difference. Run from
the repository root with this folder's venv and ``bitsandbytes`` installed in it:

    benchmarks/peft_params/.venv/bin/pip install bitsandbytes==0.50.2
    benchmarks/peft_params/.venv/bin/python benchmarks/peft_params/qlora_bytes.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import bitsandbytes as bnb
import torch
import transformers
from bitsandbytes.functional import quantize_4bit
from transformers.integrations.bitsandbytes import replace_with_bnb_linear
from transformers.quantizers.base import HfQuantizer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.domain.graph.analysis import analyze  # noqa: E402
from app.domain.peft.qlora import QloraConfig, linear4bit_tensors, quantized_base  # noqa: E402
from app.importers.hf_config import REFERENCE_CLASSES, import_hf_config  # noqa: E402

CONFIGS = ROOT / "tests" / "fixtures" / "hf_configs"
HERE = Path(__file__).resolve().parent
SHAPES = ((4096, 4096), (11008, 4096), (1024, 4096), (2304, 768), (3, 5), (100, 33))
MODELS = (
    "llama-2-7b",
    "mistral-7b-v0.1",
    "qwen2-0.5b",
    "gemma-2b",
    "gpt2",
    "bert-base-uncased",
    "t5-small-encoder",
    "flan-t5-base-encoder",
)


def stored_bytes(weight: torch.Tensor, *, quant_type: str, double: bool) -> int:
    packed, state = quantize_4bit(
        weight, blocksize=64, compress_statistics=double, quant_type=quant_type
    )
    tensors = [packed, state.absmax, state.code]
    if double:
        tensors += [state.offset, state.state2.absmax, state.state2.code]
    return sum(t.numel() * t.element_size() for t in tensors)


def reference_model(config: dict[str, Any]) -> torch.nn.Module:
    fields = {k: v for k, v in config.items() if k not in ("model_type", "_name_or_path")}
    hf_config = transformers.AutoConfig.for_model(str(config["model_type"]), **fields)
    name = REFERENCE_CLASSES[str(config["model_type"])][0]
    with torch.device("meta"):
        if name == "BertModel":
            return transformers.BertModel(hf_config, add_pooling_layer=True)
        return getattr(transformers, name)(hf_config)


def main() -> int:
    ok = True
    rows = [
        "## Bytes per quantized weight",
        "",
        "| shape | quant | double quant | bitsandbytes | service | equal |",
        "|---|---|---|---:|---:|---|",
    ]
    torch.manual_seed(0)
    for out, features in SHAPES:
        weight = torch.randn(out, features, dtype=torch.bfloat16)
        for quant in ("nf4", "fp4"):
            for double in (False, True):
                theirs = stored_bytes(weight, quant_type=quant, double=double)
                ours = sum(linear4bit_tensors(features, out, double_quant=double))
                ok &= theirs == ours
                rows.append(
                    f"| {out} x {features} | {quant} | {double} | {theirs:,} | {ours:,} | "
                    f"{'yes' if theirs == ours else '**NO**'} |"
                )
                print(rows[-1], flush=True)
    rows += [
        "",
        "## Modules quantized",
        "",
        "| config | not converted (transformers) | Linear4bit | elements | service modules | "
        "service elements | equal |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    bnb_config = transformers.BitsAndBytesConfig(load_in_4bit=True)
    for slug in MODELS:
        config = json.loads((CONFIGS / f"{slug}.json").read_text())
        model = reference_model(config)
        skip = HfQuantizer.get_modules_to_not_convert(model, None, model._keep_in_fp32_modules)
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=bnb_config)
        quantized = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        count = len(quantized)
        numel = sum(m.in_features * m.out_features for m in quantized)
        graph = import_hf_config(config)
        layers = analyze(
            graph.inputs,
            graph.layers,
            {**graph.default_bindings, "batch": 1, "seq": 8},
            training=True,
        ).layers
        params = sum(layer.result.params for layer in layers)
        base = quantized_base(layers, QloraConfig(), params=params, torch_dtype_bytes=2)
        equal = (count, numel) == (len(base.modules), base.quantized_params)
        ok &= equal
        rows.append(
            f"| {slug} | {', '.join(sorted(skip))} | {count} | {numel:,} | {len(base.modules)} | "
            f"{base.quantized_params:,} | {'yes' if equal else '**NO**'} |"
        )
        print(rows[-1], flush=True)
    header = [
        "# QLoRA 4-bit base: the service vs bitsandbytes and transformers",
        "",
        f"bitsandbytes {bnb.__version__}, transformers {transformers.__version__}, "
        f"torch {torch.__version__}; "
        "`python benchmarks/peft_params/qlora_bytes.py`.",
        "",
    ]
    (HERE / "qlora_results.md").write_text("\n".join(header + rows) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
