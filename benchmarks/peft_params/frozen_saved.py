"""What autograd keeps for backward when the base model is frozen (LoRA), against full
fine-tuning: fp32, a bf16 base, and an fp32 base under autocast(bf16) (CPU, small widths).

The graph of one forward + loss is walked from the loss's ``grad_fn``; every node's saved
tensors (``_saved_*`` attributes) are read, parameters left out, and each storage counted
once (by its data pointer). Printed per configuration: the bytes kept in total, by node type,
and the difference against the full fine-tune of the same model. Run with the venv of
requirements.txt: ``python benchmarks/peft_params/frozen_saved.py [--md FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import peft
import torch
import torch.nn.functional as F
import transformers
from torch import nn

LLAMA = {
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 896,
    "vocab_size": 1024,
    "num_hidden_layers": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
GPT2 = {"n_embd": 128, "n_head": 4, "n_layer": 2, "vocab_size": 1024, "n_positions": 256}
BERT = {
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "vocab_size": 1024,
}


def build(name: str, dtype: torch.dtype) -> nn.Module:
    """A small model of the family, attention via SDPA, in ``dtype``."""
    torch.manual_seed(0)
    if name == "llama":
        config: Any = transformers.LlamaConfig(**LLAMA, attn_implementation="sdpa")
        model: nn.Module = transformers.LlamaForCausalLM(config)
    elif name == "gpt2":
        config = transformers.GPT2Config(**GPT2, attn_implementation="sdpa")
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.BertConfig(**BERT, attn_implementation="sdpa")
        model = transformers.BertModel(config)
    return model.to(dtype).train()


def loss_of(name: str, model: nn.Module, batch: int, seq: int) -> torch.Tensor:
    """The harness's loss (benchmarks/fidelity/measure.py training_loss)."""
    ids = torch.randint(0, 1000, (batch, seq))
    if name == "bert":
        pooled = model(input_ids=ids).pooler_output
        return F.cross_entropy(pooled, torch.zeros(batch, dtype=torch.long))
    return model(input_ids=ids, labels=ids, use_cache=False).loss


def saved(loss: torch.Tensor, model: nn.Module) -> tuple[int, Counter[str]]:
    """Bytes of the distinct non-parameter storages the graph keeps, and per node type."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[int, str]] = {}
    stack, visited = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            with contextlib.suppress(RuntimeError):
                values = getattr(node, attr)
                for t in values if isinstance(values, tuple) else (values,):
                    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                        continue
                    storage = t.untyped_storage()
                    ptr = storage.data_ptr()
                    if ptr in params or ptr in seen or storage.nbytes() == 0:
                        continue
                    seen[ptr] = (storage.nbytes(), f"{node.name()}.{attr[7:]}")
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    by_node: Counter[str] = Counter()
    for nbytes, label in seen.values():
        by_node[label] += nbytes
    return sum(nb for nb, _ in seen.values()), by_node


def cases() -> Iterator[tuple[str, str, int, int, str, dict[str, Any] | None]]:
    """(model, precision, batch, seq, tag, LoraConfig kwargs or None for full)."""
    qv = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    all_linear = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}
    for precision in ("fp32", "bf16", "amp"):
        yield "llama", precision, 2, 64, "full", None
        yield "llama", precision, 2, 64, "r8 q/v", qv
        yield "llama", precision, 2, 64, "r16 all-linear", all_linear
        yield (
            "llama",
            precision,
            2,
            64,
            "r64 mlp",
            {
                "r": 64,
                "target_modules": ["gate_proj", "up_proj", "down_proj"],
            },
        )
        yield (
            "llama",
            precision,
            2,
            64,
            "r16 all-linear do0.05",
            {**all_linear, "lora_dropout": 0.05},
        )
        yield (
            "llama",
            precision,
            2,
            64,
            "save lm_head",
            {
                **all_linear,
                "modules_to_save": ["lm_head"],
            },
        )
    for precision in ("fp32", "amp"):
        yield "gpt2", precision, 2, 64, "full", None
        yield "gpt2", precision, 2, 64, "r8 c_attn", {"r": 8, "target_modules": ["c_attn"]}
        yield "gpt2", precision, 2, 64, "r16 all-linear", all_linear
        yield "bert", precision, 4, 32, "full", None
        yield "bert", precision, 4, 32, "r8 q/v", {"r": 8, "target_modules": ["query", "value"]}
        yield (
            "bert",
            precision,
            4,
            32,
            "r8 q/v bias all",
            {
                "r": 8,
                "target_modules": ["query", "value"],
                "bias": "all",
            },
        )
        yield "bert", precision, 4, 32, "r16 all-linear", all_linear


def chain_cases() -> Iterator[tuple[str, str, dict[str, Any] | None]]:
    """Four Linear(256, 256, bias=False) on a [4096, 256] input (tests/domain/test_frozen_base.py
    pins the service's figures for the same chains)."""
    yield "fp32", "full", None
    yield "fp32", "lora r8 fc1", {"r": 8, "target_modules": ["1"]}
    yield "fp32", "lora r8 fc2", {"r": 8, "target_modules": ["2"]}
    yield "bf16", "lora r8 fc2", {"r": 8, "target_modules": ["2"]}
    yield "amp", "lora r8 fc1", {"r": 8, "target_modules": ["1"]}
    yield (
        "fp32",
        "lora r8 fc1, save fc3",
        {"r": 8, "target_modules": ["1"], "modules_to_save": ["3"]},
    )


def chain_rows() -> list[str]:
    """The chain cases' kept bytes (the output's graph: no loss)."""
    rows = []
    for precision, tag, kwargs in chain_cases():
        torch.manual_seed(0)
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        model: nn.Module = nn.Sequential(*[nn.Linear(256, 256, bias=False) for _ in range(4)])
        model = model.to(dtype)
        if kwargs is not None:
            model = peft.get_peft_model(model, peft.LoraConfig(**kwargs))
        x = torch.randn(4096, 256, dtype=dtype)
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "amp" else None
        with amp or contextlib.nullcontext():
            out = model(x)
        total, by_node = saved(out, model)
        parts = ", ".join(f"{label} {nbytes:,}" for label, nbytes in sorted(by_node.items()))
        rows.append(f"| chain | {precision} | 4096 | {tag} | {total:,} | {parts} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--md")
    parser.add_argument("--detail", action="store_true")
    args = parser.parse_args()
    lines = [
        f"# Saved for backward, frozen base vs full (torch {torch.__version__}, transformers "
        f"{transformers.__version__}, peft {peft.__version__}, CPU, SDPA)",
        "",
        "| model | precision | tokens | configuration | saved B | vs full B |",
        "|---|---|---:|---|---:|---:|",
    ]
    full: dict[tuple[str, str], int] = {}
    for name, precision, batch, seq, tag, kwargs in cases():
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        model = build(name, dtype)
        if kwargs is not None:
            model = peft.get_peft_model(model, peft.LoraConfig(**kwargs))
        torch.manual_seed(1)
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "amp" else None
        with amp or contextlib.nullcontext():
            loss = loss_of(name, model, batch, seq)
        total, by_node = saved(loss, model)
        if kwargs is None:
            full[(name, precision)] = total
        diff = total - full[(name, precision)]
        lines.append(f"| {name} | {precision} | {batch * seq} | {tag} | {total:,} | {diff:+,} |")
        print(lines[-1], flush=True)
        if args.detail:
            for label, nbytes in sorted(by_node.items()):
                print(f"    {label}: {nbytes:,}")
    lines += [
        "",
        "Chains (no loss: the output's graph), the kept tensors by the node that keeps them:",
        "",
        "| model | precision | rows | configuration | saved B | kept by |",
        "|---|---|---:|---|---:|---|",
        *chain_rows(),
    ]
    if args.md:
        with open(args.md, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
