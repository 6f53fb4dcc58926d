"""LoRA (parameter-efficient fine-tuning) as Hugging Face PEFT applies it to a layer graph.

A LoRA adapter puts two matrices beside a frozen Linear(in, out): ``lora_A`` (r x in) and
``lora_B`` (out x r), neither with a bias; the layer computes
``base(x) + lora_B(lora_A(dropout(x))) * alpha / r``. Only the adapters train, plus biases per
``bias`` and every parameter of the ``modules_to_save`` (PEFT trains a copy of each such
module, the original stays frozen). Trainable parameters are counted the way PEFT's
``PeftModel.get_nb_trainable_parameters`` counts them (the sum of ``numel`` over parameters
with ``requires_grad``).

The rules, as the library's code has them (huggingface/peft):

* ``src/peft/tuners/tuners_utils.py`` ``check_target_module_exists``: a string
  ``target_modules`` is a regular expression matched with ``re.fullmatch`` against the
  module's qualified name; a list matches a name equal to an entry or ending in ``"." +
  entry``;
* ``_maybe_include_all_linear_layers`` (same file): ``"all-linear"`` is every Linear except the
  model's output embedding (``get_output_embeddings()``, the LM head);
* ``src/peft/tuners/lora/layer.py`` ``LoraLayer.update_layer``: ``lora_A = nn.Linear(in, r,
  bias=False)``, ``lora_B = nn.Linear(r, out, bias=False)``; ``nn.Dropout(p)`` before
  ``lora_A`` when ``lora_dropout > 0`` (else ``nn.Identity``); embeddings get
  ``lora_embedding_A`` (r x num_embeddings) and ``lora_embedding_B`` (dim x r);
* ``src/peft/tuners/lora/model.py`` ``_mark_only_adapters_as_trainable``: every parameter
  outside the adapters frozen; ``bias="all"`` unfreezes every parameter named ``bias``,
  ``"lora_only"`` the biases of the adapted layers;
* ``src/peft/utils/other.py`` ``ModulesToSaveWrapper``: a trainable copy of each module whose
  name ends with an entry of ``modules_to_save``;
* ``src/peft/tuners/lora/dora.py`` ``DoraLinearLayer`` (``use_dora=True``): a trainable
  ``lora_magnitude_vector`` of out_features elements per adapted Linear, initialised to the
  row norms of the base weight;
* adapters are kept in fp32 when the base is fp16 / bf16 (``autocast_adapter_dtype=True``,
  the default of ``get_peft_model``).

The graph's attention op holds its q/k/v/o projections and the MLP op its projections
internally; they are named as the model family's transformers modeling file names them
(:data:`NAMINGS`, chosen from the importer's layer names by :func:`module_naming`):

* Llama (and Mistral, Qwen2/3, Gemma, Granite, Phi-3 ...): ``<layer>.q_proj`` ...
  ``<layer>.o_proj``, ``<layer>.gate_proj`` / ``up_proj`` / ``down_proj`` (an ungated MLP
  ``up_proj`` and ``down_proj``) - ``models/llama/modeling_llama.py``;
* GPT-2 / GPTBigCode (first layer ``wte``): one fused ``c_attn`` (in d, out q + k + v: a
  Conv1D in GPT-2, which PEFT adapts as a Linear with ``fan_in_fan_out``), ``attn.c_proj``,
  ``mlp.c_fc`` and ``mlp.c_proj`` - ``models/gpt2/modeling_gpt2.py``;
* BERT / RoBERTa (``word_embeddings`` and ``encoder.<i>`` blocks): ``attention.self.query``,
  ``.key``, ``.value``, ``attention.output.dense``, ``intermediate.dense``, ``output.dense``
  and ``pooler.dense`` - ``models/bert/modeling_bert.py``;
* T5 (``shared`` and ``block.<i>``): ``SelfAttention.q`` / ``k`` / ``v`` / ``o``,
  ``DenseReluDense.wi`` / ``wo`` (gated: ``wi_0``, ``wi_1``, ``wo``) -
  ``models/t5/modeling_t5.py``; the encoder-decoder's cross-attention is Linear layers named
  ``EncDecAttention.q`` ... ``.o`` (attention projections);
* BLOOM (``word_embeddings``, ``word_embeddings_layernorm``) and GPT-NeoX / Pythia
  (``embed_in``): one fused ``query_key_value`` (out q + k + v) and ``dense`` in the
  attention, ``dense_h_to_4h`` / ``dense_4h_to_h`` in the MLP -
  ``models/bloom/modeling_bloom.py``, ``models/gpt_neox/modeling_gpt_neox.py``;
* OPT (``embed_tokens`` and ``embed_positions``): ``q_proj`` ... ``out_proj``, ``fc1`` /
  ``fc2`` - ``models/opt/modeling_opt.py``; Phi-2 (``final_layernorm``): ``q_proj`` ...
  ``dense``, ``fc1`` / ``fc2`` - ``models/phi/modeling_phi.py``.

* Phi-3 (the graph's ``resid_attn_dropout``): ``self_attn.qkv_proj`` (q, k, v fused) and
  ``o_proj``, ``mlp.gate_up_proj`` (gate and up fused, out 2 x intermediate) and ``down_proj``
  - ``models/phi3/modeling_phi3.py``.

A module's qualified name is ``<graph layer>.<name>`` (``h.0.attn.c_attn``,
``encoder.0.attn.self.query``, ``block.0.attn.q``), the decoder layers numbered as
transformers numbers them (:func:`decoder_layer_names`): a list ``target_modules`` matches on
the last components as PEFT's rule does. ``target_regex`` sees ``LoraModule.full_name``: for
the Llama-named families and Phi-3 the name ``model.named_modules()`` gives
(``model.layers.1.self_attn.q_proj``; the head ``lm_head``), checked name for name by
benchmarks/peft_params/count.py. Target kinds follow the op a module belongs to (attention or
MLP), whatever the family calls it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from app.domain.graph.analysis import LayerAnalysis
from app.domain.workload import (  # re-exported: the rules live beside the workload
    INFERENCE_NEEDS_MERGED as INFERENCE_NEEDS_MERGED,
)
from app.domain.workload import LoraError as LoraError
from app.domain.workload import check_lora_mode as check_lora_mode

if TYPE_CHECKING:  # qlora imports this module
    from app.domain.peft.qlora import QloraConfig

__all__ = [
    "NAMINGS",
    "ModuleNaming",
    "module_naming",
    "module_rank",
    "output_head",
    "check_lora_mode",
    "LoraBias",
    "LoraConfig",
    "LoraError",
    "LoraKind",
    "LoraModule",
    "LoraPlan",
    "linear_modules",
    "lora_plan",
    "lora_trainable_params",
]


class LoraBias(StrEnum):
    """Which biases train besides the adapters (PEFT ``LoraConfig.bias``)."""

    NONE = "none"
    ALL = "all"
    LORA_ONLY = "lora_only"


class LoraKind(StrEnum):
    """Target modules chosen by kind instead of by name."""

    ATTENTION = "attention"  # the attention op's projections (q_proj ... o_proj, c_attn ...)
    MLP = "mlp"  # the MLP op's (gate_proj, up_proj, down_proj; c_fc, c_proj; wi, wo ...)
    ALL_LINEAR = "all-linear"  # PEFT's shorthand: every Linear but the output head


@dataclass(frozen=True, slots=True)
class ModuleNaming:
    """How a model family names the Linear modules inside the graph's attention and MLP ops
    (transformers' modeling files); ``fused_qkv``: q, k and v are one Linear (GPT-2's
    ``c_attn``), out_features their sum."""

    family: str
    attention: tuple[str, str, str, str]  # q, k, v, o (fused: qkv, "", "", o)
    gated_mlp: tuple[str, str, str]  # gate, up, down
    plain_mlp: tuple[str, str]  # up, down
    fused_qkv: bool = False
    standalone: tuple[tuple[str, str], ...] = ()  # (graph layer, module leaf) of Linear layers
    keep_in_fp32: tuple[str, ...] = ()  # the model class's _keep_in_fp32_modules
    fused_gate_up: bool = False  # gate and up are one Linear (Phi-3's gate_up_proj), out summed
    body: str = ""  # the base model's attribute in the CausalLM (``model.``), for regexes


NAMINGS: dict[str, ModuleNaming] = {
    "llama": ModuleNaming(
        "llama",
        ("q_proj", "k_proj", "v_proj", "o_proj"),
        ("gate_proj", "up_proj", "down_proj"),
        ("up_proj", "down_proj"),
        body="model.",
    ),
    # models/phi3/modeling_phi3.py: Phi3Attention.qkv_proj (one Linear, out (heads + 2 x
    # kv_heads) x head_dim) and .o_proj, Phi3MLP.gate_up_proj (out 2 x intermediate) and
    # .down_proj
    "phi3": ModuleNaming(
        "phi3",
        ("qkv_proj", "", "", "o_proj"),
        ("gate_up_proj", "", "down_proj"),
        ("gate_up_proj", "down_proj"),  # Phi-3 is always gated; never used
        fused_qkv=True,
        fused_gate_up=True,
        body="model.",
    ),
    "gpt2": ModuleNaming(
        "gpt2",
        ("c_attn", "", "", "c_proj"),
        ("c_fc", "c_fc2", "c_proj"),  # GPT-2 has no gated MLP; a placeholder never matched
        ("c_fc", "c_proj"),
        fused_qkv=True,
    ),
    "bert": ModuleNaming(
        "bert",
        ("self.query", "self.key", "self.value", "output.dense"),
        ("intermediate.gate", "intermediate.dense", "output.dense"),  # BERT is ungated
        ("intermediate.dense", "output.dense"),
        standalone=(("pooler", "dense"),),
    ),
    # models/bloom/modeling_bloom.py: BloomAttention.query_key_value (one Linear, out 3 x
    # hidden) and .dense, BloomMLP.dense_h_to_4h / .dense_4h_to_h
    "bloom": ModuleNaming(
        "bloom",
        ("query_key_value", "", "", "dense"),
        ("dense_h_to_4h_gate", "dense_h_to_4h", "dense_4h_to_h"),  # ungated; never matched
        ("dense_h_to_4h", "dense_4h_to_h"),
        fused_qkv=True,
    ),
    # models/gpt_neox/modeling_gpt_neox.py: GPTNeoXAttention.query_key_value and .dense,
    # GPTNeoXMLP.dense_h_to_4h / .dense_4h_to_h (the same names as BLOOM's)
    "gpt_neox": ModuleNaming(
        "gpt_neox",
        ("query_key_value", "", "", "dense"),
        ("dense_h_to_4h_gate", "dense_h_to_4h", "dense_4h_to_h"),  # ungated; never matched
        ("dense_h_to_4h", "dense_4h_to_h"),
        fused_qkv=True,
    ),
    # models/opt/modeling_opt.py: OPTAttention.q_proj / k_proj / v_proj / out_proj,
    # OPTDecoderLayer.fc1 / fc2
    "opt": ModuleNaming(
        "opt",
        ("q_proj", "k_proj", "v_proj", "out_proj"),
        ("fc1_gate", "fc1", "fc2"),  # ungated; never matched
        ("fc1", "fc2"),
    ),
    # models/phi/modeling_phi.py (Phi-2): PhiAttention.q_proj / k_proj / v_proj / dense,
    # PhiMLP.fc1 / fc2
    "phi": ModuleNaming(
        "phi",
        ("q_proj", "k_proj", "v_proj", "dense"),
        ("fc1_gate", "fc1", "fc2"),  # ungated; never matched
        ("fc1", "fc2"),
    ),
    "t5": ModuleNaming(
        "t5",
        ("q", "k", "v", "o"),
        ("wi_0", "wi_1", "wo"),
        ("wi", "wo"),
        keep_in_fp32=("wo",),  # T5PreTrainedModel._keep_in_fp32_modules
    ),
}


def module_naming(layers: Sequence[LayerAnalysis]) -> ModuleNaming:
    """The family naming of a graph, read from the importer's layer names
    (:mod:`app.importers.hf_config`): the first layer ``wte`` is GPT-2's (and GPTBigCode's)
    token embedding, ``word_embeddings`` with ``encoder.<i>`` blocks BERT's / RoBERTa's,
    ``shared`` with ``block.<i>`` T5's, ``word_embeddings`` then
    ``word_embeddings_layernorm`` BLOOM's, ``embed_in`` GPT-NeoX's (Pythia), ``embed_tokens``
    with ``embed_positions`` OPT's, ``embed_tokens`` with ``final_layernorm`` Phi-2's; any other
    graph uses Llama's names."""
    names = [layer.name for layer in layers]
    first = names[0] if names else ""
    if first == "wte":
        return NAMINGS["gpt2"]
    if first == "word_embeddings" and "word_embeddings_layernorm" in names:
        return NAMINGS["bloom"]
    if first == "embed_in":
        return NAMINGS["gpt_neox"]
    if first == "embed_tokens" and "embed_positions" in names:
        return NAMINGS["opt"]
    if first == "embed_tokens" and "final_layernorm" in names:
        return NAMINGS["phi"]
    if any(n.endswith(".resid_attn_dropout") for n in names):
        return NAMINGS["phi3"]
    if first == "word_embeddings" and any(n.startswith("encoder.") for n in names):
        return NAMINGS["bert"]
    if first == "shared" and any(n.startswith("block.") for n in names):
        return NAMINGS["t5"]
    return NAMINGS["llama"]


_NORMS = frozenset({"layernorm", "batchnorm2d", "instancenorm3d"})  # weight, then bias
_NOT_BIASES = frozenset({"rmsnorm", "tensor", "embedding", "embedding_add", "cls_token"})


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraConfig:
    """A PEFT ``LoraConfig``: exactly one of ``target_modules`` (names), ``target_regex``
    and ``target_kind`` chooses the adapted layers."""

    r: int = 8
    alpha: int = 8
    target_modules: tuple[str, ...] = ()
    target_regex: str | None = None
    target_kind: LoraKind | None = None
    dropout: float = 0.0
    bias: LoraBias = LoraBias.NONE
    modules_to_save: tuple[str, ...] = ()
    use_dora: bool = False  # DoRA: a trainable magnitude vector per adapted Linear
    qlora: QloraConfig | None = None  # a 4-bit bitsandbytes base (QLoRA)
    merged: bool | None = None  # inference: after merge_and_unload (True) or beside (False)

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise LoraError(f"r must be an integer >= 1, got {self.r!r}", "r")
        if not 0.0 <= self.dropout < 1.0:
            raise LoraError(f"dropout must be in [0, 1), got {self.dropout!r}", "dropout")
        given = sum(
            (bool(self.target_modules), self.target_regex is not None, self.target_kind is not None)
        )
        if given != 1:
            raise LoraError(
                "give exactly one of target_modules, target_regex and target_kind",
                "target_modules",
            )
        if self.target_regex is not None:
            try:
                re.compile(self.target_regex)
            except re.error as exc:
                raise LoraError(
                    f"target_regex is not a regular expression: {exc}", "target_regex"
                ) from exc


@dataclass(frozen=True, slots=True)
class LoraModule:
    """A module LoRA can adapt: its qualified name, the graph layer that holds it, its
    in / out features, whether it has a bias, and the rows (tokens) it runs on per forward."""

    name: str
    layer: int  # index into the analysis' layers
    in_features: int
    out_features: int
    bias: bool
    rows: int
    embedding: bool = False
    kind: str = "linear"  # the op it belongs to: attention, mlp, linear, embedding
    qualified: str = ""  # the name in the transformers model (``model.`` + name); "" = name
    experts: int = 0  # > 0: a 3-d parameter of this many experts (PEFT's ParamWrapper)
    rank_factor: int = 1  # PEFT's rank_pattern for a fused target: r x this

    @property
    def full_name(self) -> str:
        """The name ``model.named_modules()`` gives it in transformers, which PEFT matches a
        regex ``target_modules`` against."""
        return self.qualified or self.name


@dataclass(frozen=True, slots=True)
class LoraPlan:
    """What a LoRA configuration adapts and trains on one model."""

    modules: tuple[LoraModule, ...]  # the adapted modules
    adapter_params: int  # elements of every lora_A and lora_B
    bias_params: int  # biases unfrozen by ``bias``
    saved_params: int  # parameters of the trainable copies of modules_to_save
    saved_layers: tuple[int, ...]  # the layers copied for modules_to_save
    saved_shapes: tuple[tuple[tuple[int, ...], ...], ...]  # their parameters' shapes
    adapter_shapes: tuple[tuple[int, ...], ...]  # every trainable tensor's shape
    magnitude_params: int = 0  # DoRA: out_features per adapted Linear (lora_magnitude_vector)
    bias_layers: tuple[int, ...] = ()  # layers with a bias unfrozen by ``bias``

    @property
    def trainable_params(self) -> int:
        """Trainable parameter elements, as PEFT's get_nb_trainable_parameters counts them."""
        return self.adapter_params + self.magnitude_params + self.bias_params + self.saved_params

    def module_params(self, module: LoraModule, r: int) -> tuple[int, ...]:
        """The trainable tensors' elements of one adapted module: lora_A, lora_B and (DoRA)
        its magnitude vector."""
        width = module_rank(module, r)
        pair = (width * module.in_features, width * module.out_features)
        return (*pair, module.out_features) if self.magnitude_params else pair


def module_rank(module: LoraModule, r: int) -> int:
    """The rows of ``lora_A`` (columns of ``lora_B``): ``r``, or for a ParamWrapper of E
    experts ``r x rank_factor x E`` (peft/tuners/lora/layer.py ``ParamWrapper.update_layer``:
    ``lora_A`` of ``r * num_experts`` x in; the fused gate_up_proj at rank 2r)."""
    return r * module.rank_factor * max(module.experts, 1)


def _rows(layer: LayerAnalysis) -> int:
    return math.prod(layer.output_shape[:-1]) if layer.output_shape else 1


def _is_bias(layer: LayerAnalysis, index: int, shape: tuple[int, ...]) -> bool:
    """Whether parameter ``index`` (of ``shape``) of ``layer`` is named ``bias`` in PyTorch:
    a norm's second parameter, the vectors of a layer with weight matrices (Linear, attention,
    MLP, convolution, recurrent), a free tensor named ``...bias``; never an RMSNorm's weight or
    a free tensor such as Qwen3's q_norm / k_norm weights."""
    if len(shape) != 1:
        return False
    if layer.op in _NORMS:
        return index > 0
    if layer.op in _NOT_BIASES:
        return layer.op == "tensor" and layer.name.rsplit(".", 1)[-1].endswith("bias")
    return True


_STACKED = re.compile(r"(layers)(?:_(\d+))?\.(\d+)\.(?:l(\d+)_)?(.+)")


def decoder_layer_names(layers: Sequence[LayerAnalysis]) -> list[str]:
    """Each graph layer's name with transformers' decoder-layer index.

    The HF importer lays out decoders whose layers differ (Gemma-2/3's sliding and global
    attention, DeepSeek's dense then MoE layers, gpt-oss) as runs
    (``app.importers.hf_families._stack``): ``layers_<first>.<repeat>.l<j>_<module>`` is layer
    ``first + repeat x period + j`` of ``model.layers`` (``period``: the run's ``l<j>_``
    count, 1 without them), so ``layers.0.l1_self_attn`` is ``layers.1.self_attn``, as
    ``model.named_modules()`` names it; any other name is kept."""
    period: dict[str, int] = {}
    parsed = [_STACKED.fullmatch(layer.name) for layer in layers]
    for match in parsed:
        if match is not None:
            run = match.group(2) or ""
            period[run] = max(period.get(run, 1), int(match.group(4) or 0) + 1)
    names = []
    for layer, match in zip(layers, parsed, strict=True):
        if match is None:
            names.append(layer.name)
            continue
        run = match.group(2) or ""
        index = int(run or 0) + int(match.group(3)) * period[run] + int(match.group(4) or 0)
        names.append(f"layers.{index}.{match.group(5)}")
    return names


def linear_modules(layers: Sequence[LayerAnalysis]) -> list[LoraModule]:
    """Every Linear (and embedding) module of the graph, by qualified name, in order, named
    as the family's modeling file names them (:func:`module_naming`, the decoder layers
    numbered as in transformers by :func:`decoder_layer_names`); ``full_name`` adds the base
    model's attribute (``model.``) where the family has one, the head excepted."""
    modules = _linear_modules(layers)
    body = module_naming(layers).body
    if not body:
        return modules
    head = output_head(layers, modules)
    return [
        m if m.name == head or m.name == "lm_head" else replace(m, qualified=body + m.name)
        for m in modules
    ]


def _linear_modules(layers: Sequence[LayerAnalysis]) -> list[LoraModule]:
    naming = module_naming(layers)
    standalone = dict(naming.standalone)
    hf_names = decoder_layer_names(layers)
    modules: list[LoraModule] = []
    for index, graph_layer in enumerate(layers):
        layer = graph_layer._replace(name=hf_names[index])
        shapes = layer.result.param_shapes
        rows = _rows(layer)
        if layer.op == "linear":
            out = layer.output_shape[-1]
            features = layer.flops // (2 * rows * out) if rows and out else 0
            has_bias = any(len(s) == 1 for s in shapes)
            leaf = standalone.get(layer.name)
            name = f"{layer.name}.{leaf}" if leaf else layer.name
            # T5's cross-attention is written out as ops: its q / k / v / o Linear layers
            # (``EncDecAttention.q`` ...) are attention projections (app/importers/hf_t5.py)
            cross = naming.family == "t5" and ".EncDecAttention." in f".{layer.name}"
            kind = "attention" if cross else "linear"
            modules.append(LoraModule(name, index, features, out, has_bias, rows, kind=kind))
        elif layer.op in ("embedding", "embedding_add") and shapes:
            num, dim = shapes[0]
            modules.append(
                LoraModule(layer.name, index, num, dim, False, rows, True, kind="embedding")
            )
        elif layer.op == "attention":
            modules += _attention_modules(layer, index, rows, naming)
        elif layer.op == "moe":
            modules += _moe_modules(layer, index, rows)
        elif layer.op == "mlp":
            matrices = [s for s in shapes if len(s) == 2]
            biased = any(len(s) == 1 for s in shapes)
            names: Sequence[str] = naming.gated_mlp if len(matrices) == 3 else naming.plain_mlp
            if naming.fused_gate_up and len(matrices) == 3:
                (gate_out, features), (up_out, _), down = matrices
                matrices = [(gate_out + up_out, features), down]
                names = (naming.gated_mlp[0], naming.gated_mlp[2])
            for name, (out, features) in zip(names, matrices, strict=True):
                modules.append(
                    LoraModule(
                        f"{layer.name}.{name}", index, features, out, biased, rows, False, "mlp"
                    )
                )
    return modules


def _moe_modules(layer: LayerAnalysis, index: int, rows: int) -> list[LoraModule]:
    """The Linear modules of a MoE op's shared expert, as transformers 5.18 names them:
    ``gate_proj`` / ``up_proj`` / ``down_proj`` of ``shared_expert`` (Qwen2-MoE, Llama-4) or
    ``shared_experts`` (DeepSeek). Routed experts are 3-d parameters there (``*Experts``), not
    Linear modules, and so are most routers (``*TopKRouter``). Llama-4's ``router``
    (``Llama4Router(nn.Linear)``, out = experts) and Qwen2-MoE's ``shared_expert_gate`` (out 1)
    are Linear in PEFT's eyes but are not offered here: :func:`lora_plan` refuses a rank above a
    module's width, which would refuse ``all-linear`` at any useful rank; PEFT's all-linear
    adapts them too (r x (hidden + out) each more).

    DeepSeek-V2/V3 (the ``shared_experts`` owner) also gets what PEFT adapts as parameters
    there (:func:`_expert_targets`): ``experts.gate_up_proj`` (E x 2 intermediate x hidden),
    ``experts.down_proj`` (E x hidden x intermediate) and the router's ``gate`` (its weight,
    E x hidden), with ``experts`` set and no rows (a ParamWrapper never runs lora_A on x).
    The op's matrices are the router, every expert's projections, then the shared expert's
    and its gate (:func:`app.domain.graph.llm_variants.moe_extra_param_shapes`)."""
    matrices = [s for s in layer.result.param_shapes if len(s) == 2]
    experts, hidden = matrices[0]
    gate = matrices[-1] == (1, hidden)
    rest = len(matrices) - 1 - gate
    projections = rest // (experts + 1) if rest % (experts + 1) == 0 else 0
    if projections not in (2, 3) or rest == experts * projections:
        return []  # no shared expert
    shared = matrices[len(matrices) - gate - projections : len(matrices) - gate]
    llama4 = layer.name.endswith("feed_forward")  # Llama4TextDecoderLayer.feed_forward
    owner = "shared_expert" if gate or llama4 else "shared_experts"
    names = ("gate_proj", "up_proj", "down_proj")[3 - projections :]
    modules = [
        LoraModule(f"{layer.name}.{owner}.{name}", index, features, out, False, rows, False, "mlp")
        for name, (out, features) in zip(names, shared, strict=True)
    ]
    if owner == "shared_experts" and projections == 3:
        inner = matrices[1][0]  # the first routed expert's gate_proj: inner x hidden
        routed = [
            ("experts.gate_up_proj", hidden, 2 * inner, experts, 2),
            ("experts.down_proj", inner, hidden, experts, 1),
            ("gate", hidden, experts, 1, 1),
        ]
        modules += [
            LoraModule(f"{layer.name}.{name}", index, features, out, False, 0, False, "experts",
                       experts=count, rank_factor=factor)
            for name, features, out, count, factor in routed
        ]  # fmt: skip
    return modules


def _attention_modules(
    layer: LayerAnalysis, index: int, rows: int, naming: ModuleNaming
) -> list[LoraModule]:
    """The Linear modules of an attention op: q, k, v, o (q, k, v fused into one under
    ``naming.fused_qkv``, its out_features theirs summed), or multi-head latent attention's
    (:func:`_mla_parts`). Its other vectors are biases in the op's order (q, k, v when
    ``qkv_bias``, then o) and, after them, parameters that are not a Linear's (gpt-oss'
    ``sinks``, one logit a head)."""
    shapes = layer.result.param_shapes
    matrices = [s for s in shapes if len(s) == 2]
    vectors = [s for s in shapes if len(s) == 1]
    mla = _mla_parts(matrices, vectors)
    if mla is not None:
        parts = mla
    else:
        (q_out, _), (kv_out, _), _, (o_out, _) = matrices
        qkv_bias = vectors[:3] == [(q_out,), (kv_out,), (kv_out,)]
        rest = vectors[3:] if qkv_bias else vectors
        out_bias = bool(rest) and rest[0] == (o_out,)
        with_bias = (qkv_bias, qkv_bias, qkv_bias, out_bias)
        parts = list(zip(naming.attention, matrices, with_bias, strict=True))
        if naming.fused_qkv:
            qkv_out = sum(out for _, (out, _), _ in parts[:3])
            features = parts[0][1][1]
            parts = [(naming.attention[0], (qkv_out, features), with_bias[0]), parts[3]]
    return [
        LoraModule(f"{layer.name}.{name}", index, features, out, has_bias, rows, False, "attention")
        for name, (out, features), has_bias in parts
    ]


def _mla_parts(
    matrices: Sequence[tuple[int, ...]], vectors: Sequence[tuple[int, ...]]
) -> list[tuple[str, tuple[int, ...], bool]] | None:
    """Multi-head latent attention's Linear modules as ``DeepseekV2Attention`` /
    ``DeepseekV3Attention`` (transformers 5.23) name them, from the op's parameter shapes
    (:func:`app.domain.graph.llm_variants.mla_param_shapes`: ``q_proj``, or ``q_b_proj`` and
    ``q_a_proj``; ``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``); None for q/k/v/o
    attention, whose k and v matrices have one shape. The ``q_a_layernorm`` and
    ``kv_a_layernorm`` weights are not Linear; ``q_a_proj``, ``kv_a_proj_with_mqa`` and
    ``o_proj`` carry a bias with ``attention_bias``."""
    if len(matrices) == 4 and matrices[1] == matrices[2]:
        return None
    if len(matrices) not in (4, 5):
        return None
    latent, o_out = matrices[-3][0], matrices[-1][0]
    kv_a_bias = (latent,) in vectors
    o_bias = (o_out,) in vectors
    tail = [
        ("kv_a_proj_with_mqa", matrices[-3], kv_a_bias),
        ("kv_b_proj", matrices[-2], False),
        ("o_proj", matrices[-1], o_bias),
    ]
    if len(matrices) == 4:
        return [("q_proj", matrices[0], False), *tail]
    q_rank = matrices[1][0]
    q_a_bias = vectors.count((q_rank,)) >= 2  # q_a_layernorm's weight, then q_a_proj's bias
    return [("q_b_proj", matrices[0], False), ("q_a_proj", matrices[1], q_a_bias), *tail]


def output_head(layers: Sequence[LayerAnalysis], modules: Sequence[LoraModule]) -> str | None:
    """The LM head (get_output_embeddings): the last Linear, when it is a layer of its own
    and its out_features is an embedding's vocabulary."""
    vocab = {m.in_features for m in modules if m.embedding}
    linears = [m for m in modules if not m.embedding]
    if not linears:
        return None
    last = linears[-1]
    if last.name == layers[last.layer].name and last.out_features in vocab:
        return last.name
    return None


def _kind_matches(config: LoraConfig, module: LoraModule, head: str | None) -> bool:
    kind = config.target_kind
    if module.embedding:
        return False
    if kind is LoraKind.ATTENTION:
        return module.kind == "attention"
    if kind is LoraKind.MLP:
        return module.kind == "mlp"
    return module.name != head  # all-linear


def _targeted(config: LoraConfig, module: LoraModule, head: str | None) -> bool:
    if config.target_regex is not None:
        return re.fullmatch(config.target_regex, module.full_name) is not None
    if config.target_kind is not None:
        return _kind_matches(config, module, head)
    name = module.name
    return any(name == t or name.endswith("." + t) for t in config.target_modules)


# peft/utils/transformers_weight_conversion.py (peft 0.21.0) _MOE_TARGET_MODULE_MAPPING
# ["qwen2_moe"], which _MODEL_TO_CONVERSION_PATTERN applies to deepseek_v2 / deepseek_v3: the
# v4 names a target_modules entry is converted from (to a target_parameters entry)
_EXPERT_TARGETS = {
    "gate": "gate",
    "gate_proj": "experts.gate_up_proj",
    "up_proj": "experts.gate_up_proj",
    "down_proj": "experts.down_proj",
}


def _expert_targets(
    config: LoraConfig, modules: Sequence[LoraModule], head: str | None, field: str
) -> tuple[LoraModule, ...]:
    """The modules PEFT adapts on a graph with DeepSeek's routed experts.

    peft 0.21.0 ``_convert_peft_config_moe`` (``utils/transformers_weight_conversion.py``, run
    by ``get_peft_model`` for deepseek_v2 / deepseek_v3 under transformers 5): a
    ``target_modules`` entry equal to or ending in ``.gate_proj`` / ``.up_proj`` becomes the
    target parameter ``gate_up_proj`` (the fused experts, at rank 2r and alpha 2 alpha:
    ``rank_pattern``), ``down_proj`` the parameter ``down_proj``, ``gate`` the router's
    ``gate.weight``, and the entry leaves ``target_modules`` - so the shared experts' and the
    dense layers' Linear gate/up/down are no longer adapted; gate_proj without up_proj (or
    the reverse) is an error. A regex or ``"all-linear"`` is first resolved to the leaf names
    it selects (``_resolve_string_target_modules``: every module whose name the regex
    fullmatches, plus ``experts.gate_proj`` / ``up_proj`` / ``down_proj`` probed as the v4
    names; all-linear: every Linear but the head, plus gate, gate_proj, up_proj, down_proj),
    then handled as that list - a regex naming one layer's q_proj thus adapts every layer's.
    The kind ``mlp`` is the list gate_proj, up_proj, down_proj; ``attention`` is unchanged.
    A ParamWrapper refuses lora_dropout and use_dora (``peft/tuners/lora/layer.py``)."""
    plain = [m for m in modules if not m.experts]
    if config.target_kind is LoraKind.ATTENTION:
        return tuple(m for m in plain if m.kind == "attention")
    leaf = {m.name: m.name.rsplit(".", 1)[-1] for m in modules}
    if config.target_regex is not None:
        pattern = config.target_regex
        # module keys (the router's ``gate`` too) and the experts' parameter keys
        targets = {leaf[m.name] for m in modules if re.fullmatch(pattern, m.full_name)}
        for m in modules:
            if m.experts and m.name.endswith("experts.gate_up_proj"):
                stem = m.full_name.removesuffix("gate_up_proj")
                targets |= {
                    old
                    for old in ("gate_proj", "up_proj", "down_proj")
                    if re.fullmatch(pattern, stem + old)
                }
    elif config.target_kind is LoraKind.ALL_LINEAR:
        targets = {leaf[m.name] for m in plain if not m.embedding and m.name != head}
        targets |= set(_EXPERT_TARGETS)
    elif config.target_kind is LoraKind.MLP:
        targets = {"gate_proj", "up_proj", "down_proj"}
    else:
        targets = set(config.target_modules)
    converted: set[str] = set()
    remaining: set[str] = set()
    for target in targets:
        old = next((o for o in _EXPERT_TARGETS if target == o or target.endswith("." + o)), None)
        if old is None:
            remaining.add(target)
        else:
            converted.add(old)
    if len(converted & {"gate_proj", "up_proj"}) == 1:
        given = sorted(converted & {"gate_proj", "up_proj"})[0]
        missing = "up_proj" if given == "gate_proj" else "gate_proj"
        raise LoraError(
            f"{given} without {missing}: PEFT adapts DeepSeek's routed experts through their "
            f"fused gate_up_proj parameter and needs both",
            field,
        )
    params = {_EXPERT_TARGETS[old] for old in converted}
    chosen = [
        m
        for m in modules
        if (m.experts and any(m.name.endswith("." + p) for p in params))
        or (not m.experts and any(m.name == t or m.name.endswith("." + t) for t in remaining))
    ]
    if any(m.experts for m in chosen):
        if config.dropout > 0:
            raise LoraError(
                "PEFT's ParamWrapper (DeepSeek's routed experts, the router) does not work "
                "with lora_dropout != 0",
                "dropout",
            )
        if config.use_dora:
            raise LoraError(
                "PEFT's ParamWrapper (DeepSeek's routed experts, the router) does not work "
                "with use_dora",
                "use_dora",
            )
    return tuple(chosen)


def lora_plan(layers: Sequence[LayerAnalysis], config: LoraConfig) -> LoraPlan:
    """The modules ``config`` adapts on the graph ``layers`` and what trains.

    Raises
    ------
    LoraError
        No module matches the targets (field ``target_modules`` / ``target_regex`` /
        ``target_kind``), an entry of ``target_modules`` or ``modules_to_save`` matches nothing,
        or ``r`` exceeds an adapted layer's width min(in, out) (field ``r``).
    """
    modules = linear_modules(layers)
    head = output_head(layers, modules)
    field = (
        "target_regex"
        if config.target_regex is not None
        else "target_kind"
        if config.target_kind is not None
        else "target_modules"
    )
    if any(m.experts for m in modules):
        chosen = _expert_targets(config, modules, head, field)
    else:
        chosen = tuple(m for m in modules if _targeted(config, m, head))
    if not chosen:
        known = sorted({m.name.rsplit(".", 1)[-1] for m in modules})
        raise LoraError(
            f"the LoRA targets match no module of the model; its Linear / embedding modules "
            f"end in: {', '.join(known) or 'none'}",
            field,
        )
    for target in config.target_modules:
        if not any(m.name == target or m.name.endswith("." + target) for m in modules):
            raise LoraError(f"target module '{target}' matches no module", "target_modules")
    for module in chosen:
        width = min(module.in_features, module.out_features)
        if config.r > width:
            raise LoraError(
                f"r={config.r} exceeds the width of {module.name} (in {module.in_features}, "
                f"out {module.out_features}): a rank above min(in, out) = {width} adds nothing",
                "r",
            )
    if config.use_dora and any(m.embedding for m in chosen):
        raise LoraError(
            "use_dora on an embedding is not modelled: target Linear modules only",
            "use_dora",
        )
    r = config.r
    shapes: list[tuple[int, ...]] = []
    for module in chosen:
        # lora_A: r x in, lora_B: out x r (embeddings: A r x num, B dim x r); a ParamWrapper
        # of E experts: A (r' x E) x in, B out x (r' x E), r' = r x rank_factor
        width = module_rank(module, r)
        shapes += [(width, module.in_features), (module.out_features, width)]
    adapter = sum(math.prod(s) for s in shapes)
    magnitude = 0
    if config.use_dora:  # src/peft/tuners/lora/dora.py DoraLinearLayer: weight of (out,)
        shapes += [(m.out_features,) for m in chosen]
        magnitude = sum(m.out_features for m in chosen)
    # a tied output head has no parameter of its own in the graph: PEFT's copy of it
    # (ModulesToSaveWrapper deep-copies the module) trains a whole out x in weight
    tied = {m.layer: (m.out_features, m.in_features) for m in modules if not m.embedding}
    saved_shapes: dict[int, tuple[tuple[int, ...], ...]] = {}
    for i, layer in enumerate(layers):
        if not any(layer.name.endswith(entry) for entry in config.modules_to_save):
            continue
        layer_shapes = layer.result.param_shapes
        if not layer_shapes and layer.op == "linear" and i in tied:
            layer_shapes = (tied[i],)
        if layer_shapes:
            saved_shapes[i] = tuple(layer_shapes)
    saved_layers = tuple(saved_shapes)
    for entry in config.modules_to_save:
        if not any(layers[i].name.endswith(entry) for i in saved_layers):
            raise LoraError(
                f"modules_to_save entry '{entry}' matches no layer with parameters",
                "modules_to_save",
            )
    saved = set(saved_layers)
    bias = 0
    bias_layers: list[int] = []
    if config.bias is LoraBias.ALL:
        for i, layer in enumerate(layers):
            if i in saved:
                continue
            for j, s in enumerate(layer.result.param_shapes):
                if _is_bias(layer, j, s):
                    bias += math.prod(s)
                    shapes.append(s)
                    bias_layers.append(i)
    elif config.bias is LoraBias.LORA_ONLY:
        for module in chosen:
            if module.bias and module.layer not in saved:
                bias += module.out_features
                shapes.append((module.out_features,))
                bias_layers.append(module.layer)
    saved_params = 0
    for layer_shapes in saved_shapes.values():
        saved_params += sum(math.prod(s) for s in layer_shapes)
        shapes += list(layer_shapes)
    return LoraPlan(
        modules=chosen,
        adapter_params=adapter,
        bias_params=bias,
        saved_params=saved_params,
        saved_layers=saved_layers,
        saved_shapes=tuple(saved_shapes.values()),
        adapter_shapes=tuple(shapes),
        magnitude_params=magnitude,
        bias_layers=tuple(dict.fromkeys(bias_layers)),
    )


def lora_trainable_params(layers: Sequence[LayerAnalysis], config: LoraConfig) -> int:
    """Trainable parameter elements of the graph under ``config``, as PEFT counts them:
    ``r x (in + out)`` per adapted Linear, the biases ``bias`` unfreezes, and every parameter
    of the ``modules_to_save`` copies."""
    return lora_plan(layers, config).trainable_params
