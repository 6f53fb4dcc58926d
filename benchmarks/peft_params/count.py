"""Check LoRA trainable-parameter counts against the ``peft`` library itself.

For Llama-named decoders (Llama, Mistral, Qwen2/3, Gemma), GPT-2, BERT, T5 (encoder and
encoder-decoder), BLOOM, GPT-NeoX (Pythia), OPT, Phi-2, DeepSeek (MLA) and gpt-oss configs
in ``tests/fixtures/hf_configs/``, this builds the importer's reference class from the config
alone on the meta device (nothing downloaded or allocated), applies
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
from app.domain.peft import (  # noqa: E402
    LoraBias,
    LoraConfig,
    LoraKind,
    linear_modules,
    lora_trainable_params,
)
from app.importers.hf_config import REFERENCE_CLASSES, import_hf_config  # noqa: E402

CONFIGS = ROOT / "tests" / "fixtures" / "hf_configs"
HERE = Path(__file__).resolve().parent
LLAMA_NAMED = (
    "llama-2-7b",
    "llama-3-8b",
    "mistral-7b-v0.1",
    "qwen2-0.5b",
    "qwen3-0.6b",
    "gemma-2b",
)

Case = tuple[str, dict[str, Any], LoraConfig]

# (label, peft.LoraConfig keyword arguments, the service's LoraConfig)
LLAMA_CASES: tuple[Case, ...] = (
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
    (
        "r=8 q,v DoRA",
        {"r": 8, "target_modules": ["q_proj", "v_proj"], "use_dora": True},
        LoraConfig(r=8, target_modules=("q_proj", "v_proj"), use_dora=True),
    ),
    (
        "r=16 all-linear DoRA",
        {"r": 16, "target_modules": "all-linear", "use_dora": True},
        LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR, use_dora=True),
    ),
)

GPT2_CASES: tuple[Case, ...] = (
    (
        "r=8 c_attn",
        {"r": 8, "target_modules": ["c_attn"]},
        LoraConfig(r=8, target_modules=("c_attn",)),
    ),
    (
        "r=16 c_attn,c_proj",
        {"r": 16, "target_modules": ["c_attn", "c_proj"]},
        LoraConfig(r=16, target_modules=("c_attn", "c_proj")),
    ),
    (
        "r=32 c_attn,c_proj,c_fc",
        {"r": 32, "target_modules": ["c_attn", "c_proj", "c_fc"]},
        LoraConfig(r=32, target_modules=("c_attn", "c_proj", "c_fc")),
    ),
    (
        "r=16 all-linear",
        {"r": 16, "target_modules": "all-linear"},
        LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR),
    ),
    (
        "r=8 attention kind",
        {"r": 8, "target_modules": r".*\.attn\.(c_attn|c_proj)"},
        LoraConfig(r=8, target_kind=LoraKind.ATTENTION),
    ),
    (
        "r=8 mlp kind",
        {"r": 8, "target_modules": r".*\.mlp\.(c_fc|c_proj)"},
        LoraConfig(r=8, target_kind=LoraKind.MLP),
    ),
    (
        "r=8 c_attn bias=lora_only",
        {"r": 8, "target_modules": ["c_attn"], "bias": "lora_only"},
        LoraConfig(r=8, target_modules=("c_attn",), bias=LoraBias.LORA_ONLY),
    ),
    (
        "r=8 c_attn DoRA",
        {"r": 8, "target_modules": ["c_attn"], "use_dora": True},
        LoraConfig(r=8, target_modules=("c_attn",), use_dora=True),
    ),
)

BERT_CASES: tuple[Case, ...] = (
    (
        "r=8 query,value",
        {"r": 8, "target_modules": ["query", "value"]},
        LoraConfig(r=8, target_modules=("query", "value")),
    ),
    (
        "r=16 query,key,value,dense",
        {"r": 16, "target_modules": ["query", "key", "value", "dense"]},
        LoraConfig(r=16, target_modules=("query", "key", "value", "dense")),
    ),
    (
        "r=16 all-linear",
        {"r": 16, "target_modules": "all-linear"},
        LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR),
    ),
    (
        "r=8 attention kind",
        {"r": 8, "target_modules": r".*attention\.(self\.(query|key|value)|output\.dense)"},
        LoraConfig(r=8, target_kind=LoraKind.ATTENTION),
    ),
    (
        "r=8 mlp kind",
        {"r": 8, "target_modules": r".*layer\.\d+\.(intermediate|output)\.dense"},
        LoraConfig(r=8, target_kind=LoraKind.MLP),
    ),
    (
        "r=8 query,value bias=all",
        {"r": 8, "target_modules": ["query", "value"], "bias": "all"},
        LoraConfig(r=8, target_modules=("query", "value"), bias=LoraBias.ALL),
    ),
    (
        "r=8 query,value DoRA",
        {"r": 8, "target_modules": ["query", "value"], "use_dora": True},
        LoraConfig(r=8, target_modules=("query", "value"), use_dora=True),
    ),
)

T5_CASES: tuple[Case, ...] = (
    ("r=8 q,v", {"r": 8, "target_modules": ["q", "v"]}, LoraConfig(r=8, target_modules=("q", "v"))),
    (
        "r=16 q,k,v,o",
        {"r": 16, "target_modules": ["q", "k", "v", "o"]},
        LoraConfig(r=16, target_modules=("q", "k", "v", "o")),
    ),
    (
        "r=16 all-linear",
        {"r": 16, "target_modules": "all-linear"},
        LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR),
    ),
    (
        "r=8 mlp kind",
        {"r": 8, "target_modules": r".*DenseReluDense\.(wi|wi_0|wi_1|wo)"},
        LoraConfig(r=8, target_kind=LoraKind.MLP),
    ),
    (
        "r=32 attention kind",
        {"r": 32, "target_modules": r".*SelfAttention\.(q|k|v|o)"},
        LoraConfig(r=32, target_kind=LoraKind.ATTENTION),
    ),
    (
        "r=8 q,v DoRA",
        {"r": 8, "target_modules": ["q", "v"], "use_dora": True},
        LoraConfig(r=8, target_modules=("q", "v"), use_dora=True),
    ),
)

# T5ForConditionalGeneration: the decoder's cross-attention (EncDecAttention) is adapted too
T5_FULL_CASES: tuple[Case, ...] = (
    *(case for case in T5_CASES if case[0] != "r=32 attention kind"),
    (
        "r=32 attention kind",
        {"r": 32, "target_modules": r".*(SelfAttention|EncDecAttention)\.(q|k|v|o)"},
        LoraConfig(r=32, target_kind=LoraKind.ATTENTION),
    ),
)

# BLOOM and GPT-NeoX (Pythia) name their fused attention input query_key_value
# (models/bloom/modeling_bloom.py, models/gpt_neox/modeling_gpt_neox.py)
FUSED_QKV_CASES: tuple[Case, ...] = (
    (
        "r=8 query_key_value",
        {"r": 8, "target_modules": ["query_key_value"]},
        LoraConfig(r=8, target_modules=("query_key_value",)),
    ),
    (
        "r=16 query_key_value",
        {"r": 16, "target_modules": ["query_key_value"]},
        LoraConfig(r=16, target_modules=("query_key_value",)),
    ),
    (
        "r=16 qkv,dense,dense_h_to_4h,dense_4h_to_h",
        {
            "r": 16,
            "target_modules": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
        },
        LoraConfig(
            r=16, target_modules=("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")
        ),
    ),
    (
        "r=64 all-linear",
        {"r": 64, "target_modules": "all-linear"},
        LoraConfig(r=64, target_kind=LoraKind.ALL_LINEAR),
    ),
    (
        "r=8 attention kind",
        {"r": 8, "target_modules": r".*\.(self_attention|attention)\.(query_key_value|dense)"},
        LoraConfig(r=8, target_kind=LoraKind.ATTENTION),
    ),
    (
        "r=8 mlp kind",
        {"r": 8, "target_modules": r".*\.mlp\.(dense_h_to_4h|dense_4h_to_h)"},
        LoraConfig(r=8, target_kind=LoraKind.MLP),
    ),
    (
        "r=8 query_key_value bias=lora_only",
        {"r": 8, "target_modules": ["query_key_value"], "bias": "lora_only"},
        LoraConfig(r=8, target_modules=("query_key_value",), bias=LoraBias.LORA_ONLY),
    ),
)


# OPT (out_proj, fc1, fc2: models/opt/modeling_opt.py) and Phi-2 (dense, fc1, fc2:
# models/phi/modeling_phi.py)
def _fc_cases(out: str) -> tuple[Case, ...]:
    return (
        (
            "r=8 q_proj,v_proj",
            {"r": 8, "target_modules": ["q_proj", "v_proj"]},
            LoraConfig(r=8, target_modules=("q_proj", "v_proj")),
        ),
        (
            "r=16 q_proj,v_proj",
            {"r": 16, "target_modules": ["q_proj", "v_proj"]},
            LoraConfig(r=16, target_modules=("q_proj", "v_proj")),
        ),
        (
            f"r=16 {out},fc1,fc2",
            {"r": 16, "target_modules": [out, "fc1", "fc2"]},
            LoraConfig(r=16, target_modules=(out, "fc1", "fc2")),
        ),
        (
            "r=16 all-linear",
            {"r": 16, "target_modules": "all-linear"},
            LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR),
        ),
        (
            "r=8 attention kind",
            {"r": 8, "target_modules": rf".*self_attn\.(q_proj|k_proj|v_proj|{out})"},
            LoraConfig(r=8, target_kind=LoraKind.ATTENTION),
        ),
        (
            "r=8 mlp kind",
            {"r": 8, "target_modules": r".*\.(fc1|fc2)"},
            LoraConfig(r=8, target_kind=LoraKind.MLP),
        ),
    )


# Multi-head latent attention (models/deepseek_v2, deepseek_v3/modeling_*.py): q_proj, or
# q_a_proj and q_b_proj; kv_a_proj_with_mqa, kv_b_proj, o_proj. MoE experts are 3-d
# parameters in transformers 5, not Linear modules (DEEPSEEK_MOE_CASES below).
_MLA_REGEX = r".*self_attn\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"


def _mla_cases(q: tuple[str, ...]) -> tuple[Case, ...]:
    names = (*q, "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
    return (
        (
            f"r=8 {','.join(names)}",
            {"r": 8, "target_modules": list(names)},
            LoraConfig(r=8, target_modules=names),
        ),
        (
            "r=16 kv_b_proj",
            {"r": 16, "target_modules": ["kv_b_proj"]},
            LoraConfig(r=16, target_modules=("kv_b_proj",)),
        ),
        (
            "r=16 attention kind",
            {"r": 16, "target_modules": _MLA_REGEX},
            LoraConfig(r=16, target_kind=LoraKind.ATTENTION),
        ),
    )


# gpt-oss: biased q/k/v/o and per-head sinks (a parameter, not a Linear)
GPT_OSS_CASES: tuple[Case, ...] = (
    (
        "r=8 q,k,v,o",
        {"r": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        LoraConfig(r=8, target_modules=("q_proj", "k_proj", "v_proj", "o_proj")),
    ),
    (
        "r=16 q_proj,v_proj",
        {"r": 16, "target_modules": ["q_proj", "v_proj"]},
        LoraConfig(r=16, target_modules=("q_proj", "v_proj")),
    ),
    (
        "r=8 q,v bias=lora_only",
        {"r": 8, "target_modules": ["q_proj", "v_proj"], "bias": "lora_only"},
        LoraConfig(r=8, target_modules=("q_proj", "v_proj"), bias=LoraBias.LORA_ONLY),
    ),
)


# MoE shared experts (Linear gate_proj / up_proj / down_proj; routed experts are 3-d
# parameters in transformers 5). Qwen2-MoE's shared_expert_gate and Llama-4's router are
# left out by the service, so all-linear is not compared. DeepSeek has its own cases below:
# there peft converts gate_proj / up_proj / down_proj to the routed experts' parameters.
_SHARED_MLP = ("gate_proj", "up_proj", "down_proj")
MOE_CASES: tuple[Case, ...] = (
    (
        "r=8 gate,up,down",
        {"r": 8, "target_modules": list(_SHARED_MLP)},
        LoraConfig(r=8, target_modules=_SHARED_MLP),
    ),
    (
        "r=16 gate,up,down",
        {"r": 16, "target_modules": list(_SHARED_MLP)},
        LoraConfig(r=16, target_modules=_SHARED_MLP),
    ),
)


# transformers' own qualified names (model.layers.<i>...): anchored regexes select the same
# modules only when the service numbers the layers as named_modules() does (Gemma-2/3's
# alternating layers, DeepSeek's dense-then-MoE runs) and names Phi-3's fused projections
ANCHORED_CASES: tuple[Case, ...] = (
    (
        "r=8 regex model.layers.1 q_proj",
        {"r": 8, "target_modules": r"model\.layers\.1\.self_attn\.q_proj"},
        LoraConfig(r=8, target_regex=r"model\.layers\.1\.self_attn\.q_proj"),
    ),
    (
        "r=8 regex model.layers.[0-4] o_proj,down_proj",
        {"r": 8, "target_modules": r"model\.layers\.[0-4]\.(self_attn\.o_proj|mlp\.down_proj)"},
        LoraConfig(r=8, target_regex=r"model\.layers\.[0-4]\.(self_attn\.o_proj|mlp\.down_proj)"),
    ),
)
PHI3_CASES: tuple[Case, ...] = (
    (
        "r=8 qkv_proj",
        {"r": 8, "target_modules": ["qkv_proj"]},
        LoraConfig(r=8, target_modules=("qkv_proj",)),
    ),
    (
        "r=16 qkv_proj,o_proj,gate_up_proj,down_proj",
        {"r": 16, "target_modules": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]},
        LoraConfig(r=16, target_modules=("qkv_proj", "o_proj", "gate_up_proj", "down_proj")),
    ),
    (
        "r=16 all-linear",
        {"r": 16, "target_modules": "all-linear"},
        LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR),
    ),
    (
        "r=8 attention kind",
        {"r": 8, "target_modules": r".*self_attn\.(qkv_proj|o_proj)"},
        LoraConfig(r=8, target_kind=LoraKind.ATTENTION),
    ),
    (
        "r=8 mlp kind",
        {"r": 8, "target_modules": r".*mlp\.(gate_up_proj|down_proj)"},
        LoraConfig(r=8, target_kind=LoraKind.MLP),
    ),
    (
        "r=8 regex model.layers.1 qkv_proj",
        {"r": 8, "target_modules": r"model\.layers\.1\.self_attn\.qkv_proj"},
        LoraConfig(r=8, target_regex=r"model\.layers\.1\.self_attn\.qkv_proj"),
    ),
    (
        "r=8 qkv_proj DoRA",
        {"r": 8, "target_modules": ["qkv_proj"], "use_dora": True},
        LoraConfig(r=8, target_modules=("qkv_proj",), use_dora=True),
    ),
)
GEMMA2_CASES: tuple[Case, ...] = (
    *(case for case in LLAMA_CASES if "lm_head" not in case[0]),
    *ANCHORED_CASES,
)

# DeepSeek-V2/V3 under transformers 5: peft converts gate_proj / up_proj / down_proj (and the
# router's gate) to the routed experts' fused parameters (app.domain.peft.lora._expert_targets)
DEEPSEEK_MOE_CASES: tuple[Case, ...] = (
    (
        "r=8 gate,up,down",
        {"r": 8, "target_modules": list(_SHARED_MLP)},
        LoraConfig(r=8, target_modules=_SHARED_MLP),
    ),
    (
        "r=16 q/kv + down_proj",
        {"r": 16, "target_modules": ["kv_b_proj", "o_proj", "down_proj"]},
        LoraConfig(r=16, target_modules=("kv_b_proj", "o_proj", "down_proj")),
    ),
    (
        "r=8 all-linear",
        {"r": 8, "target_modules": "all-linear"},
        LoraConfig(r=8, target_kind=LoraKind.ALL_LINEAR),
    ),
    (
        "r=8 mlp kind",
        {"r": 8, "target_modules": list(_SHARED_MLP)},
        LoraConfig(r=8, target_kind=LoraKind.MLP),
    ),
    (
        "r=8 regex layer 1 kv_b_proj + experts.down_proj",
        {
            "r": 8,
            "target_modules": r"model\.layers\.1\.(self_attn\.kv_b_proj|mlp\.experts\.down_proj)",
        },
        LoraConfig(
            r=8, target_regex=r"model\.layers\.1\.(self_attn\.kv_b_proj|mlp\.experts\.down_proj)"
        ),
    ),
)

MODELS: tuple[tuple[str, tuple[Case, ...]], ...] = (
    *((slug, LLAMA_CASES) for slug in LLAMA_NAMED),
    ("llama-2-7b", ANCHORED_CASES),
    ("phi-3-mini-4k-instruct", PHI3_CASES),
    ("gemma-2-9b-it", GEMMA2_CASES),
    ("gemma-3-1b-it", GEMMA2_CASES),
    ("gpt2", GPT2_CASES),
    ("bert-base-uncased", BERT_CASES),
    ("t5-small-encoder", T5_CASES),
    ("flan-t5-base-encoder", T5_CASES),
    ("t5-small", T5_FULL_CASES),
    ("flan-t5-base", T5_FULL_CASES),
    ("bloomz-560m", FUSED_QKV_CASES),
    ("pythia-160m", FUSED_QKV_CASES),
    ("opt-125m", _fc_cases("out_proj")),
    ("opt-350m", _fc_cases("out_proj")),
    ("phi-2", _fc_cases("dense")),
    ("deepseek-v2-lite-chat", _mla_cases(("q_proj",))),
    ("deepseek-v3", _mla_cases(("q_a_proj", "q_b_proj"))),
    ("deepseek-v2-lite-chat", DEEPSEEK_MOE_CASES),
    ("deepseek-v3", DEEPSEEK_MOE_CASES),
    ("gpt-oss-20b", GPT_OSS_CASES),
    ("qwen1.5-moe-a2.7b", MOE_CASES),
    ("llama-4-scout-17b-16e-text", MOE_CASES),
)


def reference_model(config: dict[str, Any]) -> torch.nn.Module:
    """The class the importer claims to match (app.importers.hf_config.REFERENCE_CLASSES),
    built from the config on the meta device."""
    fields = {k: v for k, v in config.items() if k not in ("model_type", "_name_or_path")}
    hf_config = transformers.AutoConfig.for_model(str(config["model_type"]), **fields)
    name = REFERENCE_CLASSES[str(config["model_type"])][0]
    if name == "T5EncoderModel" and "T5EncoderModel" not in config.get("architectures", []):
        name = "T5ForConditionalGeneration"
    with torch.device("meta"):
        if name == "BertModel":
            return transformers.BertModel(hf_config, add_pooling_layer=True)
        model = getattr(transformers, name)(hf_config)
        if name == "T5ForConditionalGeneration" and config.get("tie_word_embeddings") is False:
            # as from_pretrained loads Flan-T5: its own lm_head (benchmarks/hf_params/count.py)
            model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
        return model


def peft_count(config: dict[str, Any], kwargs: dict[str, Any]) -> int | str:
    """Trainable parameters of the reference model under LoRA, built on the meta device (the
    error's class name when peft refuses the configuration)."""
    model = reference_model(config)
    causal = str(config["model_type"]) not in ("bert", "t5")
    lora = peft.LoraConfig(task_type="CAUSAL_LM" if causal else None, **kwargs)
    try:
        trainable, _ = peft.get_peft_model(model, lora).get_nb_trainable_parameters()
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return f"refused: {type(exc).__name__}: {str(exc)[:80]}"
    return int(trainable)


NAMED_SLUGS = (
    "llama-2-7b",
    "phi-3-mini-4k-instruct",
    "gemma-2-9b-it",
    "gemma-3-1b-it",
    "deepseek-v2-lite-chat",
    "deepseek-v3",
)


def name_rows() -> tuple[list[str], bool]:
    """The service's Linear module names (``LoraModule.full_name``) against the
    ``torch.nn.Linear`` modules of ``model.named_modules()``."""
    rows, ok = [], True
    for slug in NAMED_SLUGS:
        config = json.loads((CONFIGS / f"{slug}.json").read_text())
        graph = import_hf_config(config)
        bindings = {**graph.default_bindings, "batch": 1, "seq": 8}
        layers = analyze(graph.inputs, graph.layers, bindings, training=True).layers
        ours = {m.full_name for m in linear_modules(layers) if not m.embedding and not m.experts}
        theirs = {
            name
            for name, module in reference_model(config).named_modules()
            if isinstance(module, torch.nn.Linear)
        }
        equal = ours == theirs
        ok &= equal
        verdict = "yes" if equal else f"**NO** {sorted(ours ^ theirs)[:3]}"
        rows.append(f"| {slug} | {len(theirs):,} | {len(ours):,} | {verdict} |")
        print(rows[-1], flush=True)
    return rows, ok


def main() -> int:
    rows = []
    ok = True
    only = set(sys.argv[1:])
    for slug, cases in MODELS:
        if only and slug not in only:
            continue
        config = json.loads((CONFIGS / f"{slug}.json").read_text())
        graph = import_hf_config(config)
        bindings = {**graph.default_bindings, "batch": 1, "seq": 8}
        layers = analyze(graph.inputs, graph.layers, bindings, training=True).layers
        for label, kwargs, ours_config in cases:
            theirs = peft_count(config, kwargs)
            ours = lora_trainable_params(layers, ours_config)
            equal = ours == theirs
            ok &= equal
            shown = f"{theirs:,}" if isinstance(theirs, int) else theirs
            rows.append(
                f"| {slug} | {label} | {shown} | {ours:,} | {'yes' if equal else '**NO**'} |"
            )
            print(rows[-1], flush=True)
    header = [
        "# LoRA trainable parameters: the service vs peft",
        "",
        f"peft {peft.__version__}, transformers {transformers.__version__}, torch "
        f"{torch.__version__}; the importer's reference class (CausalLM; BertModel with pooler; "
        "T5EncoderModel or T5ForConditionalGeneration, Flan-T5's lm_head untied as loaded) "
        "built from `tests/fixtures/hf_configs/*.json` on the meta device, "
        "`peft.get_peft_model(model, LoraConfig(task_type='CAUSAL_LM' for decoders, ...))"
        ".get_nb_trainable_parameters()`. Target kinds are compared with the regex that "
        "names the same modules in transformers.",
        "",
        "| config | LoRA | peft | service | equal |",
        "|---|---|---:|---:|---|",
    ]
    names, names_ok = name_rows()
    ok &= names_ok
    header_names = [
        "",
        "## Linear module names: the service (`full_name`) vs `model.named_modules()`",
        "",
        "| config | transformers Linear modules | service | equal |",
        "|---|---:|---:|---|",
    ]
    if not only:
        (HERE / "results.md").write_text("\n".join(header + rows + header_names + names) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
