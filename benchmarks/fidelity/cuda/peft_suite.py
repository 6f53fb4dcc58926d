"""The ``--suite peft`` configurations of ``measure.py``: PEFT LoRA / DoRA, QLoRA (bitsandbytes
4-bit), bitsandbytes 8-bit and paged optimizers, activation offloading, the optimizer step in
backward, chunked cross-entropy and gradients kept between steps: the training options of
issue 32 that the service's API expresses. Each configuration names the service's request
fields it stands for (``Options.request``), recorded as ``record["request"]``; ``compare.py``
sends exactly those (with the model's architecture inline) through the service.

peft, accelerate and bitsandbytes are not on the GPU machine's image: ``fetch_wheels.sh``
downloads their wheels into ``wheels/`` (ignored by git, carried to the device), and
``peft_wheels.py`` unpacks them into a temporary folder appended to ``sys.path`` before
transformers is imported (the image's own packages win where both have one). Nothing else is
downloaded.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# bitsandbytes optimizers by the service's Optimizer names (bitsandbytes/optim/adamw.py).
BNB_OPTIMIZERS = {
    "adamw_8bit": "AdamW8bit",
    "paged_adamw_8bit": "PagedAdamW8bit",
    "paged_adamw_32bit": "PagedAdamW32bit",
}
# LoRA target kinds as PEFT target_modules for the Llama naming (the service's target_kind).
LLAMA_KINDS = {
    "attention": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "mlp": ["gate_proj", "up_proj", "down_proj"],
}
# A 2-layer Llama of small widths for --smoke (CPU); compare.py builds the same zoo model.
LLAMA_TINY = {
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 128,
    "vocab": 1000,
    "layers": 2,
}


@dataclass(frozen=True)
class Qlora:
    """transformers' ``BitsAndBytesConfig(load_in_4bit=True, ...)`` and PEFT's
    ``prepare_model_for_kbit_training(use_gradient_checkpointing=...)``."""

    quant_type: str = "nf4"
    double_quant: bool = True
    compute_dtype: str = "bf16"
    use_gradient_checkpointing: bool = True

    @property
    def tag(self) -> str:
        """E.g. ``qlora-nf4-dq-bf16``."""
        parts = ["qlora", self.quant_type] + (["dq"] if self.double_quant else [])
        parts.append(self.compute_dtype)
        parts += [] if self.use_gradient_checkpointing else ["nogc"]
        return "-".join(parts)

    def request(self) -> dict[str, Any]:
        """The service's ``lora.qlora`` object."""
        return {
            "bnb_4bit_quant_type": self.quant_type,
            "bnb_4bit_use_double_quant": self.double_quant,
            "bnb_4bit_compute_dtype": self.compute_dtype,
            "prepare_model_for_kbit_training": True,
            "use_gradient_checkpointing": self.use_gradient_checkpointing,
        }


@dataclass(frozen=True)
class Lora:
    """A PEFT ``LoraConfig`` (exactly one of ``target_modules`` and ``target_kind``)."""

    r: int = 8
    alpha: int = 16
    target_modules: tuple[str, ...] | None = None
    target_kind: str | None = None  # attention | mlp | all-linear (the service's names)
    dropout: float = 0.0
    bias: str = "none"
    modules_to_save: tuple[str, ...] = ()
    use_dora: bool = False
    qlora: Qlora | None = None

    @property
    def tag(self) -> str:
        """E.g. ``lora-r16-all-linear-do0.05``."""
        targets = self.target_kind or ",".join(self.target_modules or ())
        parts = ["dora" if self.use_dora else "lora", f"r{self.r}", targets]
        parts += [f"do{self.dropout:g}"] if self.dropout else []
        parts += [f"bias_{self.bias}"] if self.bias != "none" else []
        parts += [f"save_{','.join(self.modules_to_save)}"] if self.modules_to_save else []
        parts += [self.qlora.tag] if self.qlora is not None else []
        return "-".join(parts)

    def request(self) -> dict[str, Any]:
        """The service's ``lora`` object (app/schemas/estimates.py LoraSpec)."""
        body: dict[str, Any] = {
            "r": self.r,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "bias": self.bias,
            "modules_to_save": list(self.modules_to_save),
            "use_dora": self.use_dora,
        }
        if self.target_kind is not None:
            body["target_kind"] = self.target_kind
        else:
            body["target_modules"] = list(self.target_modules or ())
        if self.qlora is not None:
            body["qlora"] = self.qlora.request()
        return body

    def peft_kwargs(self) -> dict[str, Any]:
        """``peft.LoraConfig`` keyword arguments (no task type: PEFT's plain LoRA model)."""
        if self.target_kind == "all-linear":
            targets: Any = "all-linear"
        elif self.target_kind is not None:
            targets = LLAMA_KINDS[self.target_kind]
        else:
            targets = list(self.target_modules or ())
        return {
            "r": self.r,
            "lora_alpha": self.alpha,
            "target_modules": targets,
            "lora_dropout": self.dropout,
            "bias": self.bias,
            "modules_to_save": list(self.modules_to_save) or None,
            "use_dora": self.use_dora,
        }


@dataclass(frozen=True)
class Options:
    """What a ``--suite peft`` configuration adds to the harness's ``Config``."""

    lora: Lora | None = None
    activation_offload: bool = False
    # save_on_cpu: torch.autograd.graph.save_on_cpu(pin_memory=True) around forward and loss;
    # torchtune: torchtune 0.6.1's OffloadActivations around the forward, its output head
    # excluded (NoOpManager), the loss outside, as torchtune's recipes run it
    offload_impl: str = "save_on_cpu"
    optimizer_in_backward: bool = False  # one optimizer per parameter, stepped in its hook
    loss_chunks: int | None = None  # torchtune CEWithChunkedOutputLoss
    keep_gradients: bool = False  # zero_grad(set_to_none=False)

    def tags(self) -> list[str]:
        """The key's fragments."""
        tags = [self.lora.tag] if self.lora is not None else []
        tags += [f"offload_{self.offload_impl}"] if self.activation_offload else []
        tags += ["opt_in_bwd"] if self.optimizer_in_backward else []
        tags += [f"loss_chunks{self.loss_chunks}"] if self.loss_chunks else []
        tags += ["keep_grads"] if self.keep_gradients else []
        return tags

    def request(self) -> dict[str, Any]:
        """The service's training-option fields (app/schemas/estimates.py WorkloadInput)."""
        body: dict[str, Any] = {}
        if self.lora is not None:
            body["lora"] = self.lora.request()
        if self.activation_offload:
            body["activation_offload"] = True
        if self.optimizer_in_backward:
            body["optimizer_in_backward"] = True
        if self.loss_chunks:
            body["loss_chunks"] = self.loss_chunks
        if self.keep_gradients:
            body["keep_gradients"] = True
        return body


# ------------------------------------------------------------------------------ configurations

R8_QV = Lora(r=8, target_modules=("q_proj", "v_proj"))
R16_ALL = Lora(r=16, alpha=32, target_kind="all-linear")
QLORA = Qlora()  # the QLoRA paper's recipe: nf4, double quantization, bf16 compute


def peft_specs(smoke: bool) -> Iterator[tuple[str, str, int, dict[str, Any], Options]]:
    """(model, mode, batch, Config fields + amp/checkpointing, Options) of every configuration.

    Llama-3-8B widths (GQA) and Llama-2-7B widths (MHA) at 2 layers, GPT-2 small and BERT-base,
    as in the default suite; training only.
    """
    if smoke:
        yield from _smoke_specs()
        return
    llama3: dict[str, Any] = {"layers": 2, "seq_len": 512, "optimizer": "adamw_foreach"}
    bf16 = {**llama3, "dtype": "bf16"}  # a bf16 base (from_pretrained(dtype=bf16)), no autocast
    amp = {**llama3, "amp": True}  # an fp32 base under autocast(bf16)
    m = "llama3_8b"
    for lora in (
        R8_QV,
        Lora(r=16, alpha=32, target_kind="attention"),
        R16_ALL,
        Lora(r=64, alpha=128, target_kind="mlp"),
        Lora(r=16, alpha=32, target_kind="all-linear", dropout=0.05),
        Lora(r=8, target_modules=("q_proj", "v_proj"), use_dora=True),
        Lora(r=16, alpha=32, target_kind="all-linear", modules_to_save=("lm_head",)),
    ):
        yield m, "training", 4, bf16, Options(lora=lora)
    yield m, "training", 4, {**bf16, "checkpointing": True}, Options(lora=R16_ALL)
    yield m, "training", 4, amp, Options(lora=R16_ALL)
    yield m, "training", 4, {**amp, "checkpointing": True}, Options(lora=R16_ALL)
    yield m, "training", 1, {**bf16, "seq_len": 2048}, Options(lora=R16_ALL)
    yield m, "training", 1, {**bf16, "seq_len": 2048}, Options()  # its full fine-tune
    yield m, "training", 4, bf16, Options(lora=R16_ALL, activation_offload=True)
    tt = {"activation_offload": True, "offload_impl": "torchtune"}
    yield m, "training", 4, bf16, Options(lora=R16_ALL, **tt)
    yield m, "training", 4, bf16, Options(**tt)
    yield m, "training", 4, bf16, Options(lora=R16_ALL, loss_chunks=8)
    yield m, "training", 4, {**bf16, "optimizer": "adamw_8bit"}, Options(lora=R16_ALL)
    # QLoRA: a bf16 checkpoint loaded in 4 bits, prepare_model_for_kbit_training (fp32 rest,
    # checkpointing), trained under autocast(bf16) as Trainer(bf16=True) does
    q_amp = {**llama3, "amp": True}
    qlora_all = Lora(r=16, alpha=32, target_kind="all-linear", qlora=QLORA)
    for optimizer in ("adamw_foreach", "paged_adamw_8bit", "adamw_8bit"):
        yield m, "training", 4, {**q_amp, "optimizer": optimizer}, Options(lora=qlora_all)
    for qlora in (
        Qlora(double_quant=False),
        Qlora(quant_type="fp4"),
        Qlora(use_gradient_checkpointing=False),
    ):
        lora = Lora(r=16, alpha=32, target_kind="all-linear", qlora=qlora)
        yield m, "training", 4, q_amp, Options(lora=lora)
    yield m, "training", 4, q_amp, Options(lora=Lora(r=8, target_modules=("q_proj", "v_proj"),
                                                     qlora=QLORA))  # fmt: skip
    yield m, "training", 4, {**llama3}, Options(lora=qlora_all)  # fp32, no autocast
    # the LoRA references of two QLoRA configurations (the same checkpointing)
    yield m, "training", 4, {**llama3, "checkpointing": True}, Options(lora=R16_ALL)
    yield m, "training", 4, {**amp, "checkpointing": True}, Options(lora=R8_QV)
    # full fine-tuning with the training options (a bf16 base: pure bf16 AdamW)
    for optimizer in ("adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit"):
        yield m, "training", 4, {**bf16, "optimizer": optimizer}, Options()
    yield m, "training", 4, {**amp, "optimizer": "adamw_8bit"}, Options()
    yield m, "training", 4, bf16, Options(optimizer_in_backward=True)
    yield m, "training", 4, bf16, Options(activation_offload=True)
    yield m, "training", 4, bf16, Options(loss_chunks=8)
    yield m, "training", 4, bf16, Options(keep_gradients=True)
    # Llama-2-7B widths (MHA, 32k vocabulary)
    llama2 = {**bf16}
    yield "llama2_7b", "training", 4, llama2, Options(lora=R16_ALL)
    yield "llama2_7b", "training", 4, q_amp, Options(lora=qlora_all)
    # GPT-2 small (Conv1D projections), fp32 and AMP
    gpt2: dict[str, Any] = {"seq_len": 512, "optimizer": "adamw_foreach"}
    for options in (
        Options(lora=Lora(r=8, target_modules=("c_attn",))),
        Options(lora=R16_ALL),
        Options(optimizer_in_backward=True),
        Options(activation_offload=True),
        Options(activation_offload=True, offload_impl="torchtune"),
        Options(loss_chunks=8),
    ):
        yield "gpt2_small", "training", 4, gpt2, options
    yield "gpt2_small", "training", 4, {**gpt2, "amp": True}, Options(lora=R16_ALL)
    yield (
        "gpt2_small",
        "training",
        4,
        {**gpt2, "amp": True},
        Options(lora=Lora(r=8, target_modules=("c_attn",))),
    )
    yield (
        "gpt2_small",
        "training",
        4,
        {**gpt2, "amp": True, "checkpointing": True},
        Options(lora=Lora(r=8, target_modules=("c_attn",))),
    )
    yield "gpt2_small", "training", 4, {**gpt2, "optimizer": "adamw_8bit"}, Options()
    yield (
        "gpt2_small",
        "training",
        4,
        {**gpt2, "amp": True},
        Options(lora=R16_ALL, activation_offload=True),
    )
    # BERT-base (sequence 128, the pooler output as logits)
    bert: dict[str, Any] = {"seq_len": 128, "optimizer": "adamw_foreach"}
    bert_qv = Lora(r=8, target_modules=("query", "value"))
    yield "bert_base", "training", 16, bert, Options(lora=bert_qv)
    yield "bert_base", "training", 16, bert, Options(lora=R16_ALL)
    yield "bert_base", "training", 16, {**bert, "amp": True}, Options(lora=bert_qv)
    yield (
        "bert_base",
        "training",
        16,
        bert,
        Options(lora=Lora(r=8, target_modules=("query", "value"), bias="all")),
    )
    yield "bert_base", "training", 16, bert, Options(activation_offload=True)


def _smoke_specs() -> Iterator[tuple[str, str, int, dict[str, Any], Options]]:
    """Tiny configurations through every code path of this suite, on a CPU."""
    tiny: dict[str, Any] = {"layers": 2, "seq_len": 8, "optimizer": "adamw_foreach"}
    gpt2: dict[str, Any] = {"layers": 1, "seq_len": 8, "optimizer": "adamw_foreach"}
    yield "llama_tiny", "training", 2, tiny, Options(lora=R8_QV)
    yield "llama_tiny", "training", 2, tiny, Options(lora=Lora(r=4, target_kind="mlp",
                                                               dropout=0.1))  # fmt: skip
    yield "llama_tiny", "training", 2, {**tiny, "checkpointing": True}, Options(lora=R16_ALL)
    yield "llama_tiny", "training", 2, {**tiny, "amp": True}, Options(
        lora=Lora(r=8, target_modules=("q_proj", "v_proj"), use_dora=True,
                  modules_to_save=("lm_head",))
    )  # fmt: skip
    yield (
        "llama_tiny",
        "training",
        2,
        {**tiny, "amp": True},
        Options(lora=Lora(r=8, target_kind="all-linear", qlora=QLORA)),
    )
    yield "llama_tiny", "training", 2, tiny, Options(activation_offload=True, lora=R16_ALL)
    yield "llama_tiny", "training", 2, tiny, Options(optimizer_in_backward=True)
    yield "llama_tiny", "training", 2, tiny, Options(loss_chunks=4)
    yield "llama_tiny", "training", 2, tiny, Options(keep_gradients=True)
    yield "llama_tiny", "training", 2, {**tiny, "optimizer": "paged_adamw_8bit"}, Options()
    yield "gpt2_small", "training", 1, gpt2, Options(lora=R16_ALL)
    yield (
        "gpt2_small",
        "training",
        1,
        {**gpt2, "optimizer": "adamw_8bit"},
        Options(lora=Lora(r=8, target_modules=("c_attn",))),
    )
    yield "gpt2_small", "training", 1, gpt2, Options(loss_chunks=2)
    yield (
        "bert_base",
        "training",
        1,
        {**gpt2, "seq_len": 8},
        Options(lora=Lora(r=8, target_modules=("query", "value"), bias="all")),
    )


# ------------------------------------------------------------------------------------- wheels


def library_versions() -> dict[str, str | None]:
    """peft, accelerate, bitsandbytes: the version and where it was imported from."""
    found: dict[str, str | None] = {}
    for name in ("peft", "accelerate", "bitsandbytes", "psutil"):
        try:
            module = __import__(name)
            found[name] = f"{getattr(module, '__version__', '?')} ({Path(module.__file__).parent})"
        except Exception as exc:  # noqa: BLE001
            found[name] = f"error: {type(exc).__name__}: {exc}"[:300]
    return found


# ------------------------------------------------------------------------------------- models


def tiny_llama(dtype: torch.dtype) -> nn.Module:
    """``LlamaForCausalLM`` of LLAMA_TINY's widths (the --smoke decoder)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    t = LLAMA_TINY
    config = LlamaConfig(
        hidden_size=t["hidden"],
        num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"],
        num_key_value_heads=t["kv_heads"],
        intermediate_size=t["intermediate"],
        vocab_size=t["vocab"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype)


_SAVED: dict[tuple[str, int | None], Path] = {}


def _saved_checkpoint(name: str, layers: int | None, build_base: Callable[..., nn.Module]) -> Path:
    """The base model saved once as a bf16 safetensors checkpoint (for the 4-bit load)."""
    key = (name, layers)
    if key not in _SAVED:
        model = build_base(torch.bfloat16)
        folder = Path(tempfile.mkdtemp(prefix=f"capplan_{name}_"))
        atexit.register(shutil.rmtree, folder, True)  # a few GB of /tmp
        model.save_pretrained(folder)
        del model
        _SAVED[key] = folder
    return _SAVED[key]


def load_4bit(
    name: str, layers: int | None, attn: str, qlora: Qlora, build_base: Callable[..., nn.Module]
) -> nn.Module:
    """``from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True, ...))`` of
    the random base (as a practitioner loads a checkpoint), then
    ``prepare_model_for_kbit_training``."""
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    folder = _saved_checkpoint(name, layers, build_base)
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=qlora.quant_type,
        bnb_4bit_use_double_quant=qlora.double_quant,
        bnb_4bit_compute_dtype=compute[qlora.compute_dtype],
    )
    device_map: dict[str, Any] = {"": 0 if torch.cuda.is_available() else "cpu"}
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        quantization_config=quant,
        dtype=torch.bfloat16,
        device_map=device_map,
        attn_implementation=attn,
    )
    return prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=qlora.use_gradient_checkpointing
    )


def apply_lora(model: nn.Module, lora: Lora) -> nn.Module:
    """``peft.get_peft_model`` with the configuration (adapters fp32, PEFT's default)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(**lora.peft_kwargs()))


def peft_counts(model: nn.Module) -> dict[str, int]:
    """PEFT's ``get_nb_trainable_parameters`` (a 4-bit weight counted by its elements) and the
    base model's share (without adapters and modules_to_save copies)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    counts: dict[str, int] = {"trainable_params": trainable}
    nb = getattr(model, "get_nb_trainable_parameters", None)
    if nb is not None:
        trainable_peft, all_params = nb()
        counts |= {"peft_trainable_params": trainable_peft, "peft_all_params": all_params}
    base = 0
    for name, param in model.named_parameters():
        if "lora_" in name or "modules_to_save." in name:
            continue
        numel = param.numel()
        if param.__class__.__name__ == "Params4bit":
            quant_storage = getattr(param, "quant_storage", None)
            numel *= 2 * (quant_storage.itemsize if quant_storage is not None else 1)
        base += numel
    counts["base_params"] = base
    return counts


# ---------------------------------------------------------------------------------- optimizers


def make_bnb_optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW8bit / PagedAdamW8bit / PagedAdamW32bit (lr 1e-4, its defaults)."""
    import bitsandbytes as bnb

    optimizer: torch.optim.Optimizer = getattr(bnb.optim, BNB_OPTIMIZERS[name])(params, lr=1e-4)
    return optimizer


@dataclass
class InBackward:
    """The optimizer step fused into backward (torchtune ``optimizer_in_bwd``): one optimizer
    per parameter, stepped and its gradient freed in the parameter's post-accumulate-grad
    hook. ``step`` and ``zero_grad`` of the training loop do nothing."""

    optimizers: dict[nn.Parameter, torch.optim.Optimizer]
    handles: list[Any] = field(default_factory=list)

    @classmethod
    def build(
        cls, params: list[nn.Parameter], make: Callable[[list[nn.Parameter]], torch.optim.Optimizer]
    ) -> InBackward:
        """One optimizer per parameter and the hooks."""
        self = cls({p: make([p]) for p in params})

        def hook(param: Tensor) -> None:
            optimizer = self.optimizers[param]  # type: ignore[index]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        self.handles = [p.register_post_accumulate_grad_hook(hook) for p in params]
        return self

    @property
    def state(self) -> dict[Any, Any]:
        """Every optimizer's state (for optimizer_state_bytes)."""
        return {k: v for o in self.optimizers.values() for k, v in o.state.items()}

    @property
    def defaults(self) -> dict[str, Any]:
        """The first optimizer's defaults (for optimizer_impl)."""
        return next(iter(self.optimizers.values())).defaults

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's groups."""
        return [g for o in self.optimizers.values() for g in o.param_groups]

    def close(self) -> None:
        """Remove the hooks. The hook closes over this object, which holds the parameters and
        their optimizer state, and autograd holds the hook: a cycle through C++ that the
        garbage collector cannot see. Left in place, the whole model stayed allocated after
        the configuration (1,429 MiB after GPT-2's, 9,939 MiB after Llama-3-8B-2L's on the
        H200 run of 2026-11-28, subtracted by compare.py)."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.optimizers.clear()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: the hooks freed every gradient."""

    def step(self) -> None:
        """Nothing: the hooks stepped every parameter."""


def paged_bytes(optimizer: Any) -> int:
    """Bytes of the optimizer's state tensors bitsandbytes allocated as paged (unified) memory."""
    seen: dict[int, int] = {}
    for state in optimizer.state.values():
        for t in state.values():
            if isinstance(t, Tensor) and getattr(t, "is_paged", False):
                seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


# -------------------------------------------------------------------------------------- losses


def _decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(the decoder stack, the output head) of a causal LM, PEFT-wrapped or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    stack = getattr(base, "model", None) or base.transformer  # Llama | GPT-2
    return stack, base.lm_head


def chunked_loss(model: nn.Module, input_ids: Tensor, labels: Tensor, chunks: int) -> Tensor:
    """torchtune's ``CEWithChunkedOutputLoss``: the output head per chunk of positions, each
    chunk's logits upcast to fp32 for ``cross_entropy(reduction="sum")``; ``labels`` are the
    shifted ids with -100 at the end (torchtune's recipe shifts them so)."""
    stack, head = _decoder_parts(model)
    hidden = stack(input_ids=input_ids, use_cache=False).last_hidden_state
    logits = [head(part) for part in hidden.chunk(chunks, dim=1)]
    label_chunks = labels.chunk(chunks, dim=1)
    total = sum(
        nn.functional.cross_entropy(
            lg.float().reshape(-1, lg.size(-1)), lb.reshape(-1), ignore_index=-100, reduction="sum"
        )
        for lg, lb in zip(logits, label_chunks, strict=True)
    )
    count = (labels != -100).sum()
    return total / count  # type: ignore[no-any-return,operator]


def shifted_labels(input_ids: Tensor) -> Tensor:
    """``input_ids`` shifted left by one, -100 in the last position (a new int64 tensor)."""
    ignore = torch.full_like(input_ids[:, :1], -100)
    return torch.cat([input_ids[:, 1:], ignore], dim=1)


TORCHTUNE_OFFLOADING = "torchtune/training/_activation_offloading.py"
# The imports of torchtune's _activation_offloading.py that need torchao or the rest of
# torchtune, and what stands in for them (NF4Tensor and TiedLinear only meet isinstance checks
# there; torchao.__version__ only NF4 tensors' check).
TORCHTUNE_STUBS = {
    "import torchao\n": "torchao = _stub_torchao\n",
    "from torchao.dtypes.nf4tensor import NF4Tensor\n": "NF4Tensor = _StubNF4Tensor\n",
    "from torchtune.modules import TiedLinear\n": "TiedLinear = _StubTiedLinear\n",
    "from torchtune.utils import get_logger\n": "get_logger = _stub_get_logger\n",
}


def torchtune_offloading(wheels: Path) -> Any:
    """torchtune 0.6.1's ``training/_activation_offloading.py``, read from its wheel in
    ``wheels`` and run as a module of its own: torchtune itself needs torchao, which the image
    lacks, so its four imports of torchao and torchtune are replaced by stand-ins
    (``TORCHTUNE_STUBS``); the offloading code runs unchanged."""
    import logging
    import types
    import zipfile

    wheel = next(iter(sorted(wheels.glob("torchtune-*.whl"))), None)
    if wheel is None:
        raise FileNotFoundError(f"no torchtune wheel in {wheels}: run fetch_wheels.sh")
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read(TORCHTUNE_OFFLOADING).decode()
    for line, replacement in TORCHTUNE_STUBS.items():
        if line not in source:
            raise ValueError(f"{wheel.name}: {line.strip()!r} not found; update TORCHTUNE_STUBS")
        source = source.replace(line, replacement)
    module = types.ModuleType("capplan_torchtune_activation_offloading")
    module.__dict__.update(
        _stub_torchao=types.SimpleNamespace(__version__="0.0.0"),
        _StubNF4Tensor=type("NF4Tensor", (), {}),
        _StubTiedLinear=type("TiedLinear", (), {}),
        _stub_get_logger=lambda level="INFO": logging.getLogger("torchtune"),
    )
    exec(compile(source, f"{wheel.name}/{TORCHTUNE_OFFLOADING}", "exec"), module.__dict__)  # noqa: S102
    return module


def torchtune_context(model: nn.Module, wheels: Path) -> Any:
    """``OffloadActivations()`` (pinned memory, a copy stream, its defaults) with the output
    head excluded by a ``NoOpManager`` as ``get_act_offloading_ctx_manager`` does for a
    torchtune model's ``output`` (here the HF ``lm_head``)."""
    offloading = torchtune_offloading(wheels)
    context = offloading.OffloadActivations()
    noop = offloading.NoOpManager()
    _, head = _decoder_parts(model)
    head.register_forward_pre_hook(lambda *args: noop.__enter__())
    head.register_forward_hook(lambda *args: noop.__exit__(), always_call=True)
    return context


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """transformers' ``ForCausalLMLoss`` (shift, fp32 upcast, cross-entropy) of the logits."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    loss: Tensor = ForCausalLMLoss(logits, labels, vocab_size=logits.size(-1))
    return loss


def offload_context() -> Any:
    """``torch.autograd.graph.save_on_cpu(pin_memory=True)`` (pinned only with a GPU)."""
    return torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())


def host_memory_peak() -> dict[str, int] | None:
    """The caching host allocator's allocated / reserved peaks (pinned memory), if exposed."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None or not torch.cuda.is_available():
        return None
    try:
        values = stats()
    except Exception:  # noqa: BLE001
        return None
    return {k: int(v) for k, v in values.items() if "peak" in k or "current" in k}


def reset_host_peak() -> None:
    """Reset the host allocator's peaks where torch can."""
    reset = getattr(torch.cuda, "reset_peak_host_memory_stats", None)
    if reset is not None and torch.cuda.is_available():
        try:
            reset()
        except Exception:  # noqa: BLE001
            pass


def extra_seconds(options: Options | None, params: int, optimizer: str | None) -> float:
    """What the suite adds to a configuration's estimated wall time [s]: saving a bf16
    checkpoint once and loading + quantizing it (QLoRA), the pinned copies (offload), a
    process of its own (a paged optimizer: imports, CUDA start, the checkpoint saved again)."""
    if options is None:
        return 0.0
    extra = 15.0 + params * 2 / 0.5e9 if paged(optimizer) else 0.0
    if options.lora is not None and options.lora.qlora is not None:
        extra += 4.0 + params * 2 / 1.0e9  # read, quantize, move (the save is counted once)
    if options.activation_offload:
        extra += 3.0
    if options.optimizer_in_backward:
        extra += 1.0
    return extra


def paged(optimizer: str | None) -> bool:
    """A bitsandbytes paged optimizer (its state in unified memory, never freed)."""
    return (optimizer or "").startswith("paged_")


def service_request(
    *,
    mode: str,
    batch: int,
    seq_len: int | None,
    dtype: str,
    amp: bool,
    optimizer: str | None,
    checkpointing: bool,
    options: Options | None,
) -> dict[str, Any]:
    """The service's request fields (``POST /v1/estimates/memory``, less the model and
    hardware, which compare.py adds) for one configuration of this suite."""
    body: dict[str, Any] = {
        "mode": mode,
        "batch_size": batch,
        "precision": "amp_bf16" if amp else dtype,
    }
    if seq_len:
        body["sequence_length"] = seq_len
    name = optimizer or "sgd"
    if name in BNB_OPTIMIZERS:
        body["optimizer"] = name
    else:
        body["optimizer"] = name
        for suffix in ("_foreach", "_fused", "_for_loop"):
            if name.endswith(suffix):
                body["optimizer"], body["optimizer_impl"] = name.removesuffix(suffix), suffix[1:]
    qlora = options.lora.qlora if options is not None and options.lora is not None else None
    if checkpointing:
        body["checkpointing"] = "full"
    elif qlora is None:  # QLoRA: the service's default follows use_gradient_checkpointing
        body["checkpointing"] = "none"
    if options is not None:
        body |= options.request()
    return body


def checkpoint_function(model: nn.Module) -> str | None:
    """How HF checkpoints the layers (``_gradient_checkpointing_func``: the function and its
    keywords, e.g. ``use_reentrant``), None when no layer is checkpointed."""
    for module in model.modules():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if func is not None and getattr(module, "gradient_checkpointing", False):
            keywords = getattr(func, "keywords", {})
            name = getattr(getattr(func, "func", func), "__qualname__", repr(func))
            text = f"{name}({', '.join(f'{k}={v!r}' for k, v in keywords.items())})"
            if "use_reentrant" not in keywords:  # torch/utils/checkpoint.py: None -> True
                text += " [use_reentrant unset: torch's checkpoint then takes True]"
            return text
    return None
