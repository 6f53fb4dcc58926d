"""Check two rules of the service against what autograd keeps (CPU, fp32, tiny models).

1. DoRA (app.domain.memory.adapters.dora_saved): beyond plain LoRA each adapted Linear keeps
   base_result and lora_result (rows x out each) and the out-element vectors weight_norm,
   mag_norm_scale and mag_norm_scale - 1.
2. LoRA on DeepSeek's routed experts (app.domain.memory.moments, the ParamWrapper term): the
   parametrized weight W + B @ A of each adapted expert parameter is kept whole.

A saved-tensors hook records every tensor autograd packs; after the forward (and a gc) the
ones still alive are what the graph keeps. Parameters are left out. Run with the venv of
requirements.txt: ``python benchmarks/peft_params/saved_tensors.py``; writes
saved_results.md beside this file.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import peft
import torch
import transformers

HERE = Path(__file__).resolve().parent


def kept_storages(model: Any, ids: torch.Tensor) -> dict[int, tuple[int, tuple[int, ...]]]:
    """Storage -> (bytes, a shape) of every saved tensor alive after the forward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    refs: list[tuple[Any, int, int, tuple[int, ...]]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        refs.append((weakref.ref(t), storage.data_ptr(), storage.nbytes(), tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids).logits.sum()
    gc.collect()
    alive = {
        ptr: (nb, shape) for r, ptr, nb, shape in refs if r() is not None and ptr not in params
    }
    del loss
    return alive


def dora_rows() -> list[str]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4,
    )  # fmt: skip
    rows, out = 32, 64
    ids = torch.randint(0, 64, (1, rows))
    totals = {}
    for dora in (False, True):
        model = transformers.LlamaForCausalLM(config).float()
        lora = peft.LoraConfig(r=4, target_modules=["o_proj"], use_dora=dora)
        model = peft.get_peft_model(model, lora)
        model.train()
        totals[dora] = sum(nb for nb, _ in kept_storages(model, ids).values())
    measured = totals[True] - totals[False]
    # 2 adapted o_proj: rows x out x (4 + 4) + 3 x out x 4 each; layer 0's mag_norm_scale - 1
    # is not kept (base_result does not require grad there: nothing trains upstream)
    rule = 2 * (rows * out * 8 + 3 * out * 4)
    first_layer = out * 4
    return [
        "| DoRA on 2 o_proj (Llama 2 layers, 32 rows, out 64) | "
        f"{measured:,} | {rule:,} | {rule - measured:,} (= {first_layer} B: layer 0's "
        "mag_norm_scale - 1, not kept when its input needs no grad) |"
    ]


def expert_rows() -> list[str]:
    torch.manual_seed(0)
    experts, hidden, inner = 8, 64, 32
    config = transformers.DeepseekV2Config(
        vocab_size=64, hidden_size=hidden, intermediate_size=96, moe_intermediate_size=inner,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=experts, n_shared_experts=1, num_experts_per_tok=2,
        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        v_head_dim=16, qk_nope_head_dim=16, n_group=1, topk_group=1,
    )  # fmt: skip
    ids = torch.randint(0, 64, (1, 16))
    model = transformers.DeepseekV2ForCausalLM(config).float()
    lora = peft.LoraConfig(r=4, target_modules=["gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(model, lora)
    model.train()
    alive = kept_storages(model, ids)
    gate_up, down = experts * 2 * inner * hidden * 4, experts * hidden * inner * 4
    sizes = sorted((nb for nb, _ in alive.values()), reverse=True)
    return [
        "| DeepSeek-V2 tiny (2 MoE layers, 8 experts, hidden 64, expert inner 32): "
        f"W' of experts.gate_up_proj ({gate_up:,} B) kept | {sizes.count(gate_up)} | 2 | "
        "1 fewer: the first MoE layer's input needs no grad (nothing trains upstream) |",
        f"| same: W' of experts.down_proj ({down:,} B) kept | {sizes.count(down)} | 2 | - |",
    ]


def main() -> None:
    lines = [
        "# What autograd keeps: DoRA and LoRA on routed experts (CPU, fp32)",
        "",
        f"peft {peft.__version__}, transformers {transformers.__version__}, torch "
        f"{torch.__version__}; `saved_tensors.py`.",
        "",
        "| case | measured | service rule | difference |",
        "|---|---:|---:|---|",
        *dora_rows(),
        *expert_rows(),
    ]
    (HERE / "saved_results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
