"""Check the Hugging Face config importer's parameter counts against transformers itself.

For every config in ``tests/fixtures/hf_configs/`` this builds the reference class from the
config alone (random init on the meta device: nothing is downloaded or allocated), counts
``sum(p.numel() for p in model.parameters())`` (shared tensors such as a tied LM head count
once), imports the same config with ``app.importers.hf_config`` and compares. It writes
``results.md`` and ``counts.json`` beside this file and exits non-zero on any difference.

Run from the repository root with this folder's own venv (see README.md):

    benchmarks/hf_params/.venv/bin/python benchmarks/hf_params/count.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.importers.hf_config import REFERENCE_CLASSES, import_hf_config  # noqa: E402

CONFIGS = ROOT / "tests" / "fixtures" / "hf_configs"
HERE = Path(__file__).resolve().parent


def reference_class(config: dict[str, object]) -> str:
    """The transformers class the importer claims to match for this config."""
    model_type = str(config["model_type"])
    architectures = config.get("architectures") or []
    if model_type == "vit" and "ViTForImageClassification" in architectures:  # type: ignore[operator]
        return "ViTForImageClassification"
    if model_type == "t5" and "T5EncoderModel" not in architectures:  # type: ignore[operator]
        return "T5ForConditionalGeneration"
    return REFERENCE_CLASSES[model_type][0]


# model_types that transformers does not register but whose config.json names a registered
# config class through auto_map: Kimi-K2's names configuration_deepseek.DeepseekV3Config.
CONFIG_TYPE = {"kimi_k2": "deepseek_v3"}


def transformers_count(config: dict[str, object]) -> tuple[str, int]:
    """Build the reference class from the config on the meta device and count parameters."""
    name = reference_class(config)
    skip = ("model_type", "_name_or_path", "auto_map")
    fields = {k: v for k, v in config.items() if k not in skip}
    model_type = str(config["model_type"])
    hf_config = transformers.AutoConfig.for_model(CONFIG_TYPE.get(model_type, model_type), **fields)
    cls = getattr(transformers, name)
    with torch.device("meta"):
        if name in ("BertModel", "RobertaModel", "ViTModel"):
            model = cls(hf_config, add_pooling_layer=True)
        else:
            model = cls(hf_config)
        if name == "T5ForConditionalGeneration" and config.get("tie_word_embeddings") is False:
            # transformers 5.23's T5Config forces tie_word_embeddings True (it only keeps the
            # flag to turn off the decoder-output scaling, configuration_t5.py __post_init__),
            # so the model built from a config ties lm_head to shared; from_pretrained unties
            # them when the checkpoint's lm_head.weight differs (T5 v1.1 / Flan-T5:
            # modeling_utils.PreTrainedModel.tie_weights). Count the model as loaded.
            model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
    return name, sum(p.numel() for p in model.parameters())


def main() -> int:
    rows = []
    counts = {}
    ok = True
    for path in sorted(CONFIGS.glob("*.json")):
        config = json.loads(path.read_text())
        name, theirs = transformers_count(config)
        ours = import_hf_config(config).parameter_count
        ok &= ours == theirs
        counts[path.stem] = {"class": name, "params": theirs}
        rows.append(
            f"| {path.stem} | {config['model_type']} | {name} | {theirs:,} | {ours:,} | "
            f"{'yes' if ours == theirs else '**NO**'} |"
        )
        print(rows[-1], flush=True)
    header = [
        "# Hugging Face config imports vs transformers",
        "",
        f"transformers {transformers.__version__}, torch {torch.__version__}; models built from "
        "`tests/fixtures/hf_configs/*.json` on the meta device, counted as "
        "`sum(p.numel() for p in model.parameters())`. T5ForConditionalGeneration with "
        "`tie_word_embeddings: false` (Flan-T5, T5 v1.1): transformers 5.23 builds it tied "
        "from a config but from_pretrained unties the checkpoint's own lm_head, so its "
        "lm_head is counted apart, as loaded.",
        "",
        "| config | model_type | reference class | transformers | importer | equal |",
        "|---|---|---|---:|---:|---|",
    ]
    (HERE / "results.md").write_text("\n".join(header + rows) + "\n")
    (HERE / "counts.json").write_text(json.dumps(counts, indent=2, sort_keys=True) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
