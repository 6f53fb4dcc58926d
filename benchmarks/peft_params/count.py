"""Check LoRA trainable-parameter counts against the ``peft`` library itself.

For each decoder config in ``tests/fixtures/hf_configs/`` whose attention and MLP use Llama's
module names (q_proj ... o_proj, gate_proj / up_proj / down_proj), this builds the model from
the config alone on the meta device (nothing downloaded or allocated), applies
``peft.get_peft_model`` with each LoRA configuration below and reads
``PeftModel.get_nb_trainable_parameters()``; beside it, the service's count
(``app.domain.peft.lora_trainable_params`` over the imported graph). It writes
``results.md`` beside this file and exits non-zero on any difference.

Run from the repository root with this folder's own venv:

    python -m venv benchmarks/peft_params/.venv
    benchmarks/peft_params/.venv/bin/pip install -r benchmarks/peft_params/requirements.txt
    benchmarks/peft_params/.venv/bin/python benchmarks/peft_params/count.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import peft
import torch
import transformers

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.domain.graph.analysis import analyze  # noqa: E402
from app.domain.peft import LoraBias, LoraConfig, LoraKind, lora_trainable_params  # noqa: E402
from app.importers.hf_config import import_hf_config  # noqa: E402

CONFIGS = ROOT / "tests" / "fixtures" / "hf_configs"
HERE = Path(__file__).resolve().parent
MODELS = ("llama-2-7b", "llama-3-8b", "mistral-7b-v0.1", "qwen2-0.5b", "qwen3-0.6b", "gemma-2b")

# (label, peft.LoraConfig keyword arguments, the service's LoraConfig)
CASES: tuple[tuple[str, dict[str, Any], LoraConfig], ...] = (
    (
        "r=8 q_proj,v_proj",
        {"r": 8, "target_modules": ["q_proj", "v_proj"]},
        LoraConfig(r=8, target_modules=("q_proj", "v_proj")),
    ),
    (
        "r=16 q,k,v,o",
        {"r": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        LoraConfig(r=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj")),
    ),
    (
        "r=16 all-linear",
        {"r": 16, "target_modules": "all-linear"},
        LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR),
    ),
    (
        "r=64 mlp",
        {"r": 64, "target_modules": ["gate_proj", "up_proj", "down_proj"]},
        LoraConfig(r=64, target_kind=LoraKind.MLP),
    ),
    (
        "r=8 regex layers 0-1 q_proj",
        {"r": 8, "target_modules": r".*layers\.(0|1)\.self_attn\.q_proj"},
        LoraConfig(r=8, target_regex=r".*layers\.(0|1)\.self_attn\.q_proj"),
    ),
    (
        "r=8 q,v bias=lora_only",
        {"r": 8, "target_modules": ["q_proj", "v_proj"], "bias": "lora_only"},
        LoraConfig(r=8, target_modules=("q_proj", "v_proj"), bias=LoraBias.LORA_ONLY),
    ),
    (
        "r=8 q,v bias=all",
        {"r": 8, "target_modules": ["q_proj", "v_proj"], "bias": "all"},
        LoraConfig(r=8, target_modules=("q_proj", "v_proj"), bias=LoraBias.ALL),
    ),
    (
        "r=8 q,v + lm_head saved",
        {"r": 8, "target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]},
        LoraConfig(r=8, target_modules=("q_proj", "v_proj"), modules_to_save=("lm_head",)),
    ),
)


def peft_count(config: dict[str, Any], kwargs: dict[str, Any]) -> int:
    """Trainable parameters of the config's CausalLM under LoRA, built on the meta device."""
    fields = {k: v for k, v in config.items() if k not in ("model_type", "_name_or_path")}
    hf_config = transformers.AutoConfig.for_model(str(config["model_type"]), **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    lora = peft.LoraConfig(task_type="CAUSAL_LM", **kwargs)
    trainable, _ = peft.get_peft_model(model, lora).get_nb_trainable_parameters()
    return int(trainable)


def main() -> int:
    rows = []
    ok = True
    for slug in MODELS:
        config = json.loads((CONFIGS / f"{slug}.json").read_text())
        graph = import_hf_config(config)
        bindings = {**graph.default_bindings, "batch": 1, "seq": 8}
        layers = analyze(graph.inputs, graph.layers, bindings, training=True).layers
        for label, kwargs, ours_config in CASES:
            theirs = peft_count(config, kwargs)
            ours = lora_trainable_params(layers, ours_config)
            ok &= ours == theirs
            rows.append(
                f"| {slug} | {label} | {theirs:,} | {ours:,} | "
                f"{'yes' if ours == theirs else '**NO**'} |"
            )
            print(rows[-1], flush=True)
    header = [
        "# LoRA trainable parameters: the service vs peft",
        "",
        f"peft {peft.__version__}, transformers {transformers.__version__}, torch "
        f"{torch.__version__}; CausalLM models built from `tests/fixtures/hf_configs/*.json` on "
        "the meta device, `peft.get_peft_model(model, LoraConfig(task_type='CAUSAL_LM', ...))"
        ".get_nb_trainable_parameters()`.",
        "",
        "| config | LoRA | peft | service | equal |",
        "|---|---|---:|---:|---|",
    ]
    (HERE / "results.md").write_text("\n".join(header + rows) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
