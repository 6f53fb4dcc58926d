"""Memory estimate and model summary contract."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import Field, model_validator

from app.domain.memory.estimate import MAX_REPLAYED_LAYERS, UNREPLAYED_FRAGMENTATION_FRACTION
from app.domain.peft import LoraBias, LoraKind
from app.domain.peft.lora import INFERENCE_NEEDS_MERGED
from app.domain.peft.qlora import QuantType
from app.domain.precision import Precision
from app.domain.workload import (
    COMPILE_WITH_ENGINE,
    DEFAULT_SAFETY_MARGIN_FRACTION,
    Attention,
    Checkpointing,
    Logits,
    LossKind,
    Mode,
    Optimizer,
    OptimizerImpl,
    Runtime,
)
from app.schemas.base import MAX_BYTES, Schema, Slug, located_error
from app.schemas.engine_options import EngineFitRead, EngineOptions
from app.schemas.hardware import DeviceName
from app.schemas.models import InputSpec
from app.schemas.parallelism import ParallelismSpec

BatchSize = Annotated[int, Field(ge=1, le=1_048_576)]
Length = Annotated[int, Field(ge=1, le=16_777_216)]


class InlineArchitecture(Schema):
    """An architecture given in the request instead of a stored model."""

    inputs: list[InputSpec] = Field(min_length=1, max_length=16, description="Model inputs.")
    layers: list[dict[str, Any]] = Field(
        min_length=1,
        max_length=10_000,
        description="Layer graph, as in `POST /v1/models`.",
        examples=[[{"name": "fc", "op": "linear", "out_features": 10}]],
    )
    default_bindings: dict[str, Annotated[int, Field(ge=1, le=2**40)]] = Field(
        default_factory=dict,
        description="Values for symbolic dims other than `batch` when the request gives none.",
        examples=[{"seq": 2048}],
    )


class OverheadSpec(Schema):
    """Overrides for the runtime's framework overhead lines (CUDA)."""

    cuda_context_bytes: int | None = Field(
        default=None, ge=0, le=MAX_BYTES, description="CUDA context [B].", examples=[536870912]
    )
    workspace_bytes: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BYTES,
        description="cuBLAS/cuDNN workspace [B].",
        examples=[33554432],
    )
    fragmentation_fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="A fixed reserve for cached free segments, as a fraction of the allocated "
        "bytes, instead of replaying PyTorch's caching allocator (the default).",
        examples=[None],
    )
    round_allocations: bool | None = Field(
        default=None,
        description="false: skip the caching-allocator replay (no rounding line; "
        "fragmentation_fraction or nothing for cached segments); faster for very large graphs. "
        f"Default true; a graph of more than {MAX_REPLAYED_LAYERS:,} executed layers is never "
        "replayed (each tensor rounded to 512 B or 2 MiB, a "
        f"{UNREPLAYED_FRAGMENTATION_FRACTION} reserve unless fragmentation_fraction is given; "
        "the assumptions say so).",
        examples=[None],
    )
    expandable_segments: bool | None = Field(
        default=None,
        description="Replay the allocator with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`"
        " (segments grow in 2 MiB / 20 MiB pages; less fragmentation). Default false.",
        examples=[None],
    )


class Bnb4bitComputeDtype(StrEnum):
    """``bnb_4bit_compute_dtype``: what a Linear4bit dequantizes to and computes in."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class QloraSpec(Schema):
    """A 4-bit bitsandbytes base (QLoRA), with the names of transformers'
    ``BitsAndBytesConfig(load_in_4bit=True, ...)`` (which vLLM's bitsandbytes loader reads
    from a checkpoint's ``quantization_config`` too) and their defaults."""

    bnb_4bit_quant_type: QuantType = Field(
        default=QuantType.FP4,
        description="nf4 (QLoRA's NormalFloat) or fp4: the same bytes, 4 bits per weight in "
        "blocks of 64 with an absmax each. Default fp4, BitsAndBytesConfig's.",
        examples=["nf4"],
    )
    bnb_4bit_use_double_quant: bool = Field(
        default=False,
        description="Quantize the per-64 absmax to 8 bits in blocks of 256 with fp32 "
        "second-level scales (1 B instead of 4 B per 64 weights, + 4 B per 256 blocks).",
        examples=[True],
    )
    bnb_4bit_compute_dtype: Bnb4bitComputeDtype = Field(
        default=Bnb4bitComputeDtype.FP32,
        description="The dtype a 4-bit weight is dequantized to for each GEMM (one layer's "
        "at a time: the adapter_transient line). bf16 needs compute capability 8.0+; a "
        "16-bit training precision must compute in the same 16-bit type. Default fp32, "
        "BitsAndBytesConfig's.",
        examples=["bf16"],
    )
    llm_int8_skip_modules: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=256,
        description="Linear modules kept unquantized, by name or suffix. Given, they replace "
        "transformers' default skips (the output head then is quantized too, as "
        "HfQuantizer.get_modules_to_not_convert does); T5's wo always stays fp32 "
        "(_keep_in_fp32_modules).",
        examples=[[]],
    )
    prepare_model_for_kbit_training: bool = Field(
        default=True,
        description="PEFT's prepare_model_for_kbit_training was applied: every unquantized "
        "parameter (embeddings, norms, biases, output head) is cast to fp32, and gradient "
        "checkpointing is on (see use_gradient_checkpointing). Default true, as PEFT's "
        "QLoRA examples do.",
        examples=[True],
    )
    use_gradient_checkpointing: bool = Field(
        default=True,
        description="prepare_model_for_kbit_training's argument: true (its default) enables "
        "gradient checkpointing, so the workload's checkpointing becomes full (echoed in "
        "defaults_used); false leaves the workload's checkpointing as given.",
        examples=[True],
    )


class LoraSpec(Schema):
    """LoRA adapters on a frozen base, as Hugging Face PEFT's ``LoraConfig`` builds them."""

    r: Annotated[int, Field(ge=1, le=65_536)] = Field(
        default=8,
        description="Rank: each adapted Linear(in, out) gets lora_A (r x in) and lora_B "
        "(out x r), no biases. At most min(in, out) of every adapted layer. PEFT's default 8.",
        examples=[8],
    )
    alpha: Annotated[int, Field(ge=1, le=1_048_576)] = Field(
        default=8,
        description="lora_alpha: the update is scaled by alpha / r (no effect on memory).",
        examples=[16],
    )
    target_modules: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        default=None,
        max_length=256,
        description="Module names: a module is adapted when its qualified name equals an entry "
        "or ends with '.' + entry (PEFT's rule). The graph's attention and MLP layers hold "
        "the modules of the family's transformers modeling file: q_proj, k_proj, v_proj, "
        "o_proj, gate_proj, up_proj, down_proj (Llama, Mistral, Qwen2 ...); qkv_proj, o_proj, "
        "gate_up_proj, down_proj (Phi-3, fused); c_attn, c_proj, "
        "c_fc (GPT-2: c_attn fused q/k/v); query, key, value, dense (BERT, RoBERTa; and "
        "pooler's dense); q, k, v, o, wi (wi_0, wi_1 gated), wo (T5). Linear and embedding "
        "layers are named as in the graph (lm_head, embed_tokens). Give exactly one of "
        "target_modules, target_regex, target_kind.",
        examples=[["q_proj", "v_proj"]],
    )
    target_regex: str | None = Field(
        default=None,
        max_length=500,
        description="A regular expression matched against the whole qualified name "
        "(re.fullmatch, PEFT's rule for a string target_modules), e.g. "
        "`.*\\.(q_proj|v_proj)`. Llama-style decoders (Llama, Mistral, Qwen, Gemma, Phi-3, "
        "DeepSeek ...) use transformers' `model.named_modules()` names "
        "(`model.layers.1.self_attn.q_proj`, `lm_head`); other families the graph's "
        "(`h.0.attn.c_attn`).",
        examples=[None],
    )
    target_kind: LoraKind | None = Field(
        default=None,
        description="attention (the attention layers' projections: q/k/v/o, c_attn/c_proj, "
        "query/key/value/dense ...), mlp (the MLP layers': gate/up/down, c_fc/c_proj, "
        "dense, wi/wo) or all-linear (PEFT's shorthand: every Linear except the output head).",
        examples=[None],
    )
    dropout: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="lora_dropout: above 0 each adapted layer keeps a dropout mask and the "
        "dropped input for backward.",
        examples=[0.05],
    )
    bias: LoraBias = Field(
        default=LoraBias.NONE,
        description="Biases that train besides the adapters: none, all (every bias of the "
        "model) or lora_only (those of the adapted layers).",
        examples=["none"],
    )
    modules_to_save: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=256,
        description="Layers trained in full beside the adapters (PEFT trains a copy: names "
        "matched as a suffix of the layer's name), e.g. `lm_head`.",
        examples=[[]],
    )
    use_dora: bool = Field(
        default=False,
        description="DoRA (PEFT use_dora): a trainable magnitude vector of out_features per "
        "adapted Linear, and the weight-norm computation's tensors in forward.",
        examples=[False],
    )
    merged: bool | None = Field(
        default=None,
        description="Inference only, and required there: true after PEFT's merge_and_unload "
        "(the base's weights alone, in its dtype; a 4-bit base stays 4-bit), false with the "
        "adapters beside the base (their fp32 weights and each adapted layer's forward "
        "temporaries). Left out in training.",
        examples=[None],
    )
    qlora: QloraSpec | None = Field(
        default=None,
        description="A 4-bit bitsandbytes base (QLoRA): the weights line is the Linear4bit "
        "bytes and the unquantized rest; `precision` is then the training precision of the "
        "adapters and the unquantized layers (fp32, bf16, fp16, amp_bf16, amp_fp16).",
    )


class WorkloadInput(Schema):
    """A model (stored or inline) and how it runs: the inputs of a memory estimate."""

    model: Slug | None = Field(
        default=None, description="Stored model slug.", examples=["llama-2-7b"]
    )
    architecture: InlineArchitecture | None = Field(
        default=None, description="Inline architecture (instead of `model`)."
    )
    mode: Mode = Field(description="training or inference.", examples=["training"])
    batch_size: BatchSize = Field(
        description="Global batch per data-parallel replica per optimizer step.", examples=[8]
    )
    micro_batch_size: BatchSize | None = Field(
        default=None,
        description="Batch per forward pass (gradient accumulation); must divide batch_size. "
        "Default: batch_size.",
        examples=[None],
    )
    sequence_length: Length | None = Field(
        default=None, description="Binds the `seq` dim (tokens).", examples=[2048]
    )
    decoder_sequence_length: Length | None = Field(
        default=None,
        description="Encoder-decoder models (T5): binds the decoder's `decoder_seq` dim "
        "(tokens of decoder_input_ids; in training the right-shifted labels), which the "
        "decoder's self-attention, its cross-attention queries and the LM head run over. "
        "Default: sequence_length (the decoder as long as the encoder's input). A seq2seq "
        "fine-tune's labels are often far shorter (PEFT's seq2seq examples pad them to the "
        "longest class label). A 422 naming this field for a model without a decoder input.",
        examples=[None],
    )
    image_size: Length | None = Field(
        default=None, description="Binds the `image` dim (pixels per side).", examples=[None]
    )
    bindings: dict[str, Annotated[int, Field(ge=1, le=2**40)]] = Field(
        default_factory=dict,
        description="Values for other symbolic dims.",
        examples=[{}],
    )
    precision: Precision | None = Field(
        default=None,
        description="Precision convention (the one table in app/domain/precision.py: fp32, "
        "tf32, bf16/fp16 (pure), amp_bf16/amp_fp16 (PyTorch autocast), mixed_bf16/mixed_fp16 "
        "(ZeRO/Megatron), fp8 and int8 (W8A8 inference), int8_weight_only (W8A16), int4 "
        "(W4A16), fp4 (NVFP4 W4A4 inference, Blackwell)). Default: bf16 for inference and "
        "amp_bf16 for training on CUDA, fp16 / amp_fp16 on a GPU below compute capability 8.0 "
        "(no bf16: V100, T4), fp32 on CPU.",
        examples=["bf16"],
    )
    optimizer: Optimizer | None = Field(
        default=None, description="Optimizer (training). Default: adamw.", examples=["adamw"]
    )
    optimizer_impl: OptimizerImpl | None = Field(
        default=None,
        description="auto (foreach on CUDA, for-loop on CPU, fused for mixed_*), for_loop, "
        "foreach or fused. Default: auto.",
        examples=["auto"],
    )
    checkpointing: Checkpointing | None = Field(
        default=None, description="Activation checkpointing. Default: none.", examples=["none"]
    )
    attention: Attention | None = Field(
        default=None,
        description="How attention is computed: eager, sdpa_math (S x S scores materialised), "
        "flash or mem_efficient (fused, no S x S matrix). Default: what PyTorch's SDPA "
        "dispatcher picks for the hardware's compute capability: flash on CUDA fp16/bf16 "
        "(sm80+, head_dim <= 256), mem_efficient on CUDA fp32 or below sm80 (fp16/fp32 inputs), "
        "sdpa_math otherwise (bf16 below sm80); flash on CPU (sdpa_math in training with "
        "attention dropout).",
        examples=["flash"],
    )
    logits: Logits | None = Field(
        default=None,
        description="Decoder inference: compute the output head for the last position only "
        "(`last`, what serving stacks do) or for every position (`all`). Default: last at "
        "inference; training always computes every position.",
        examples=["last"],
    )
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Parallel degrees."
    )
    fp32_grad_buffer: bool = Field(
        default=False,
        description="mixed_* only: keep an fp32 gradient buffer (18 B/param with Adam).",
        examples=[False],
    )
    kv_cache: bool | None = Field(
        default=None,
        description="Inference: include the KV cache of causal (decoder) attention layers. "
        "Default: true; encoders never have one.",
        examples=[True],
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="Training: fine-tune LoRA adapters on a frozen base (Hugging Face "
        "PEFT); inference: a model served with its adapters, merged or not (`merged`). "
        "Gradients, optimizer state and master weights exist for the adapters (fp32, "
        "PEFT's default) and modules_to_save only; the adapters' weights and saved activations "
        "are lines of their own. trainable_params counts what PEFT's "
        "get_nb_trainable_parameters counts.",
    )
    engine: EngineOptions | None = Field(
        default=None,
        description='Inference only: the serving engine that runs the model (`{name: "vllm", '
        "...vLLM options}`). The requirement on a GPU or MIG slice is then the engine's "
        "start-up memory (it claims gpu_memory_utilization x the memory CUDA shows), and the "
        "workload fits where the engine starts (with at least `min_concurrency` sequences of "
        "max_model_len), in the estimate's fit, the MIG fit and plan, recommendations and "
        "admission alike; answers show the engine's KV tokens, concurrency and start verdict.",
    )
    optimizer_in_backward: bool = Field(
        default=False,
        description="Training: the optimizer step fused into backward (torchtune "
        "`optimizer_in_bwd`, PyTorch `register_post_accumulate_grad_hook`): each parameter is "
        "stepped and its gradient freed as soon as it is computed, so backward holds at most "
        "the largest parameter's gradient and its step temporaries; no optimizer_step phase. "
        "Cannot accumulate gradients (micro_batch_size < batch_size), nor run under ZeRO-1/2, "
        "nor with keep_gradients (422 naming this field).",
        examples=[False],
    )
    loss_chunks: Annotated[int, Field(ge=1, le=65_536)] | None = Field(
        default=None,
        description="Training, token-level loss: torchtune's `CEWithChunkedOutputLoss` with this "
        "many chunks (the output head and the fp32 upcast per chunk of tokens): one chunk's "
        "fp32 upcast at the end of forward, twice that (fp32 gradients) in the loss's "
        "backward; the fp32 log-probabilities stay for every chunk (eager autograd). Default: "
        "Hugging Face's whole-sequence loss.",
        examples=[None],
    )
    loss: LossKind = Field(
        default=LossKind.CROSS_ENTROPY,
        description="Training: what the loop computes from the model's output. "
        "`cross_entropy` (default): Hugging Face's loss; for token logits `ForCausalLMLoss` "
        "(the logits upcast to fp32, then `F.cross_entropy`: the fp32 copy at the end of "
        "forward, the fp32 log-probabilities kept, their two fp32 gradients in the loss's "
        "backward), the output dropped before backward (the loop keeps the loss alone). "
        "`logits_sum`: `outputs.logits.sum().backward()` (benchmark loops): no cross-entropy, "
        "the output held through backward. Not with loss_chunks (422 naming this field).",
        examples=["cross_entropy"],
    )
    tokens_per_batch: Annotated[int, Field(ge=1, le=16_777_216)] | None = Field(
        default=None,
        description="Training with packed sequences: the tokens of one micro-batch, its "
        "documents concatenated into one row (flash-attention varlen, no padding). The graph "
        "runs batch 1 x this many tokens instead of micro_batch_size x sequence_length; "
        "sequence_length, if given, is the longest document (at most this).",
        examples=[None],
    )
    keep_gradients: bool = Field(
        default=False,
        description="Training: `zero_grad(set_to_none=False)`: gradients are zeroed in place, "
        "so every gradient stays allocated through the next step's forward (as under "
        "gradient accumulation). PyTorch's default is set_to_none=True.",
        examples=[False],
    )

    keep_outputs: bool = Field(
        default=False,
        description="Training: the loop holds the model's outputs (`outputs = model(**batch)`; "
        "`loss = outputs.loss`): the logits (and the key/value cache a decoder returns, "
        "`use_cache` without checkpointing) stay through the backward and until the next "
        "step's forward returns, when `outputs` is rebound. Default: the loop keeps the loss "
        "alone (Trainer.compute_loss, torchtune's `del logits`).",
        examples=[False],
    )
    activation_offload: bool = Field(
        default=False,
        description="Training on CUDA: tensors saved for backward are copied to pinned host "
        "memory (torchtune `OffloadActivations`, `torch.autograd.graph.save_on_cpu`); the GPU "
        "keeps a kept tensor until the forward no longer reads it and one layer more (the copy "
        "stream), and in backward the tensors of the layer running and of the one prefetched; "
        "the pinned host memory is the `host_memory` line `offloaded_activations`. A 422 on a "
        "CPU runtime.",
        examples=[False],
    )

    compile: bool = Field(
        default=False,
        description='The model runs under `torch.compile` (TorchInductor, mode "default"). '
        "Training: what each layer keeps for backward follows Inductor's partitioner "
        "(torch/_functorch/partitioners.py `min_cut_rematerialization_partition`: pointwise "
        "ops are recomputed in backward; matmuls, SDPA, random ops and row reductions are "
        "not): a gated MLP keeps gate, up and their product but not act(gate), a composite "
        "activation's intermediates are recomputed, RMSNorm keeps its 16-bit input and the "
        "fp32 per-row statistic instead of an fp32 copy and the normalized tensor; dropout "
        "masks, norm statistics, matmul inputs and attention's tensors stay as in eager mode. "
        "Approximated: the cut is taken per layer (the partitioner's cross-layer heuristics, "
        "attention patterns Inductor rewrites into SDPA and the CUDA graphs of mode "
        "reduce-overhead are not modelled). Inference: accepted, changes no line. A 422 with "
        "`engine` (the engine compiles by its own configuration).",
        examples=[False],
    )

    @model_validator(mode="after")
    def _one_model(self) -> Self:
        one_model_rule(type(self).__name__, self.model, self.architecture)
        if self.compile and self.engine is not None:
            raise located_error(type(self).__name__, ("compile",), COMPILE_WITH_ENGINE)
        if self.engine is not None:
            engine_rule(type(self).__name__, self.mode, self.engine, self.parallelism)
        if self.lora is not None and self.mode is not Mode.TRAINING and self.lora.merged is None:
            raise located_error(type(self).__name__, ("lora",), INFERENCE_NEEDS_MERGED)
        if self.lora is not None and self.mode is Mode.TRAINING and self.lora.merged is not None:
            raise located_error(
                type(self).__name__,
                ("lora", "merged"),
                "merged is an inference option (training keeps the adapters)",
            )
        if self.lora is not None:
            lora = self.lora
            given = (lora.target_modules is not None, lora.target_regex is not None)
            if sum((*given, lora.target_kind is not None)) != 1:
                raise located_error(
                    type(self).__name__,
                    ("lora", "target_modules"),
                    "give exactly one of target_modules, target_regex and target_kind",
                )
        _training_options_rule(self)
        if self.micro_batch_size is not None and self.batch_size % self.micro_batch_size:
            micro, batch = self.micro_batch_size, self.batch_size
            raise located_error(
                type(self).__name__,
                ("micro_batch_size",),
                f"micro_batch_size {micro} must divide batch_size {batch}",
            )
        return self


def engine_rule(
    model_name: str, mode: Mode, engine: EngineOptions, parallelism: ParallelismSpec
) -> None:
    """An engine serves inference, and its parallel degrees agree with the workload's (422
    naming the engine's field otherwise)."""
    if mode is not Mode.INFERENCE:
        raise located_error(
            model_name, ("engine",), "engine is an inference option: set mode to inference"
        )
    for field, degree in (
        ("tensor_parallel_size", parallelism.tensor),
        ("pipeline_parallel_size", parallelism.pipeline),
    ):
        given = getattr(engine, field)
        if given is not None and degree != 1 and given != degree:
            raise located_error(
                model_name,
                ("engine", field),
                f"engine.{field} {given} differs from the workload's parallelism ({degree}); "
                "give one",
            )


_TRAINING_OPTIONS = (
    "optimizer_in_backward",
    "loss_chunks",
    "tokens_per_batch",
    "keep_gradients",
    "keep_outputs",
    "activation_offload",
)


def _training_options_rule(spec: WorkloadInput) -> None:
    """Training options need training; optimizer_in_backward cannot accumulate gradients
    (422 naming the field)."""
    name = type(spec).__name__
    for option in _TRAINING_OPTIONS:
        value = getattr(spec, option)
        if value not in (None, False) and spec.mode is not Mode.TRAINING:
            raise located_error(
                name, (option,), f"{option} is a training option: set mode to training"
            )
    if spec.loss is not LossKind.CROSS_ENTROPY and spec.mode is not Mode.TRAINING:
        raise located_error(name, ("loss",), "loss is a training option: set mode to training")
    if spec.loss is LossKind.LOGITS_SUM and spec.loss_chunks is not None:
        raise located_error(
            name,
            ("loss",),
            "loss logits_sum computes no cross-entropy: loss_chunks has nothing to chunk",
        )
    micro = spec.micro_batch_size
    if spec.optimizer_in_backward and micro is not None and micro < spec.batch_size:
        raise located_error(
            name,
            ("optimizer_in_backward",),
            "optimizer_in_backward steps each parameter as its gradient is computed: it cannot "
            f"accumulate gradients over {spec.batch_size // micro} micro-batches",
        )


def one_model_rule(model_name: str, model: str | None, architecture: object) -> None:
    """Exactly one of a stored model's slug and an inline architecture (422 naming the field)."""
    if model is None and architecture is None:
        raise located_error(
            model_name, ("model",), "give 'model' (a stored slug) or 'architecture' (inline)"
        )
    if model is not None and architecture is not None:
        raise located_error(
            model_name,
            ("architecture",),
            "give exactly one of 'model' (a stored slug) or 'architecture', not both",
        )


class MemoryEstimateRequest(WorkloadInput):
    """What to estimate: a workload, and where it runs."""

    hardware: DeviceName | None = Field(
        default=None,
        description="Hardware profile, `slug` or `slug/profile` (one MIG slice): sets the "
        "runtime, overhead, precision and attention defaults (by its compute capability) and "
        "the fit check (a slice: its profile's usable memory).",
        examples=["nvidia-a100-80gb-sxm"],
    )
    runtime: Runtime | None = Field(
        default=None,
        description="pytorch_cuda or pytorch_cpu; default from the hardware kind, else CUDA.",
        examples=["pytorch_cuda"],
    )
    framework_overhead: OverheadSpec | None = Field(
        default=None, description="Override the framework overhead lines."
    )
    per_layer: bool = Field(
        default=False, description="Include the per-layer view.", examples=[False]
    )
    safety_margin_fraction: float = Field(
        default=DEFAULT_SAFETY_MARGIN_FRACTION,
        ge=0,
        lt=1,
        description="Reserve on top of estimate + context + workspace in the fit.",
        examples=[0.05],
    )


class BreakdownLine(Schema):
    """One line of the footprint at the peak."""

    key: str = Field(description="What the bytes are.", examples=["optimizer_state"])
    bytes: int = Field(description="Size [B].", examples=[53_907_317_248])
    gib: float = Field(description="Size [GiB], rounded.", examples=[50.2])
    formula: str = Field(
        description="How the line is computed.",
        examples=["adamw: 2 state tensor(s) per parameter x 4 B"],
    )
    assumptions: list[str] = Field(description="Assumptions behind the line.", examples=[[]])


class KeptTensorRow(Schema):
    """A tensor a layer keeps for backward."""

    label: str = Field(description="What the tensor is.", examples=["input"])
    source: str = Field(
        description="`input` or `output` (shared with a neighbour layer) or `new`.",
        examples=["input"],
    )
    elements: int = Field(description="Number of elements.", examples=[3_211_264])
    dtype: str = Field(description="Storage dtype.", examples=["fp32"])
    bytes: int = Field(description="Size [B].", examples=[12_845_056])


class LayerRow(Schema):
    """One executed layer."""

    name: str = Field(description="Qualified layer name.", examples=["layers.0.attn"])
    op: str = Field(description="Op.", examples=["attention"])
    output_shape: list[int] = Field(description="Output shape.", examples=[[1, 2048, 4096]])
    params: int = Field(description="Trainable parameters.", examples=[67_108_864])
    flops: int = Field(description="Forward FLOPs.", examples=[1_099_511_627_776])
    output_bytes: int = Field(description="Output size [B].", examples=[16_777_216])
    saved_bytes: int = Field(
        description="New tensors this layer keeps for backward (training) [B].",
        examples=[83_886_080],
    )
    kept_for_backward: list[KeptTensorRow] = Field(
        description="Training: every tensor the layer keeps for backward, with its dtype "
        "(shared ones count once in the totals).",
        examples=[[]],
    )


class RequiredLine(Schema):
    """One part of the memory a workload requires on a device."""

    key: str = Field(
        description="memory_estimate, cuda_context, workspace or safety_margin.",
        examples=["cuda_context"],
    )
    bytes: int = Field(description="Size [B].", examples=[536_870_912])
    detail: str = Field(
        description="The arithmetic that gives the line.",
        examples=["536,870,912 [B: the estimate's cuda_context line] = 536,870,912 B"],
    )


class DefaultUsedRow(Schema):
    """An option the request left out, the value it got from the default table, and why."""

    option: str = Field(description="Option name.", examples=["precision"])
    value: str = Field(description="Value used.", examples=["bf16"])
    reason: str = Field(description="Why.", examples=["inference on pytorch_cuda"])


class CudaMemoryRead(Schema):
    """The step as PyTorch's CUDA counters report it, from a replay of its caching allocator."""

    allocated_bytes: int = Field(
        description="torch.cuda.max_memory_allocated(): tensors rounded by the allocator, plus "
        "the cuBLAS workspace it allocates [B].",
        examples=[25_000_000_000],
    )
    reserved_bytes: int = Field(
        description="torch.cuda.max_memory_reserved(): allocated + cached free segments [B].",
        examples=[26_000_000_000],
    )
    context_bytes: int = Field(
        description="CUDA context and libraries outside the allocator [B].", examples=[536870912]
    )
    device_total_bytes: int = Field(
        description="reserved + context: the device memory the process holds; equals "
        "peak_bytes [B].",
        examples=[26_500_000_000],
    )
    first_iteration_allocated_bytes: int | None = Field(
        default=None,
        description="Training: allocated in the first step (optimizer state created in step()) "
        "[B].",
        examples=[None],
    )
    first_iteration_reserved_bytes: int | None = Field(
        default=None, description="Training: reserved in the first step [B].", examples=[None]
    )
    expandable_segments: bool = Field(
        description="Whether the replay used expandable segments.", examples=[False]
    )


class FitSummary(Schema):
    """Whether the workload fits the hardware profile's memory (the same requirement and verdict
    as the MIG fit, admission and recommendations)."""

    hardware: str = Field(
        description="Hardware slug, or `slug/profile` for a MIG slice.",
        examples=["nvidia-a100-80gb-sxm"],
    )
    memory_bytes: int = Field(
        description="Device memory (a MIG slice: its profile's usable memory) [B].",
        examples=[85_899_345_920],
    )
    usable_bytes: int = Field(description="Memory the workload may use [B].", examples=[1])
    required_bytes: int = Field(
        description="Estimate + CUDA context + workspace + safety margin [B].",
        examples=[40_000_000_000],
    )
    required: list[RequiredLine] = Field(description="The lines of required_bytes.")
    safety_margin_fraction: float = Field(
        description="Reserve on top of estimate + context + workspace.", examples=[0.05]
    )
    fits: bool = Field(description="required_bytes <= usable_bytes.", examples=[True])
    headroom_bytes: int = Field(
        description="usable_bytes minus required_bytes (negative: short by).",
        examples=[4_294_967_296],
    )
    engine: EngineFitRead | None = Field(
        default=None,
        description="With a workload `engine`: the engine's figures on this device; "
        "required_bytes is then the least memory the device must show to CUDA for it to "
        "start with min_concurrency, and usable_bytes the memory it shows.",
    )


class MemoryEstimateResponse(Schema):
    """A footprint with its breakdown and assumptions."""

    model: str = Field(description="Model slug, or `inline`.", examples=["llama-2-7b"])
    mode: Mode = Field(description="training or inference.", examples=["training"])
    runtime: Runtime = Field(description="Runtime the numbers are for.", examples=["pytorch_cuda"])
    precision: Precision = Field(description="Precision convention.", examples=["bf16"])
    batch_size: int = Field(description="Batch per optimizer step.", examples=[8])
    micro_batch_size: int = Field(description="Batch per forward pass.", examples=[8])
    bindings: dict[str, int] = Field(
        description="Every symbolic dim as bound.", examples=[{"batch": 8, "seq": 2048}]
    )
    params: int = Field(description="Parameters of the model.", examples=[6_738_415_616])
    trainable_params: int = Field(
        description="Parameters that train: every parameter in training, none at inference; "
        "with `lora`, the adapters, the biases `bias` unfreezes and the modules_to_save copies, "
        "as PEFT's get_nb_trainable_parameters counts them.",
        examples=[4_194_304],
    )
    flops_per_forward: int = Field(
        description="Forward FLOPs at the micro-batch.", examples=[110_000_000_000_000]
    )
    breakdown: list[BreakdownLine] = Field(description="Lines that add up to peak_bytes.")
    peak_bytes: int = Field(description="Peak per device [B].", examples=[120_000_000_000])
    peak_gib: float = Field(description="Peak per device [GiB].", examples=[111.8])
    peak_phase: str = Field(
        description="forward, backward or optimizer_step (steady state).", examples=["backward"]
    )
    phase_peaks: dict[str, int] = Field(
        description="Largest total per phase [B].", examples=[{"forward": 1, "backward": 2}]
    )
    first_iteration_peak_bytes: int | None = Field(
        default=None,
        description="Training: peak of the first iteration, before optimizer state exists "
        "during forward/backward [B].",
        examples=[110_000_000_000],
    )
    first_iteration_peak_phase: str | None = Field(
        default=None, description="Phase of the first-iteration peak.", examples=["optimizer_step"]
    )
    seed_rule_bytes: int | None = Field(
        default=None,
        description="Inference on chains: weights + the two largest consecutive feature maps.",
        examples=[1_375_513_760],
    )
    assumptions: list[str] = Field(description="Global assumptions.", examples=[["runtime: ..."]])
    attention: list[str] = Field(
        description="Attention implementations used, with why (empty without attention).",
        examples=[["flash: CUDA with 16-bit (or 8-bit) attention inputs: SDPA picks flash"]],
    )
    defaults_used: list[DefaultUsedRow] = Field(
        description="Every option the request left out and the value the default table gave."
    )
    cuda: CudaMemoryRead | None = Field(
        default=None, description="Runtime pytorch_cuda: what PyTorch's counters would report."
    )
    host_memory: list[BreakdownLine] = Field(
        default_factory=list,
        description="Host (CPU) memory the step holds beside the device peak, not part of "
        "peak_bytes: pinned activations (activation_offload), paged optimizer state "
        "(paged_adamw_*: unified memory evicted to the host under pressure).",
    )
    fit: FitSummary | None = Field(default=None, description="Fit against `hardware`.")
    engine: EngineFitRead | None = Field(
        default=None,
        description="With a workload `engine` and a `hardware`: the engine's start-up figures "
        "per GPU on that device, every number its fit uses: weights, profile-run peak (and "
        "where it comes from), memory outside the allocator, CUDA-graph pool, KV pool, KV "
        "bytes a token, KV tokens, maximum concurrency at max_model_len, whether it starts "
        "and, if not, vLLM's reason, per pipeline stage; the same object as `fit.engine`. "
        "`breakdown` and `peak_bytes` stay the model's PyTorch forward at the workload's batch "
        "and sequence: with an engine they do not decide the fit.",
    )
    layers: list[LayerRow] | None = Field(
        default=None, description="Per-layer view when `per_layer` is true."
    )


class ModelSummaryRow(Schema):
    """One layer of a model summary."""

    name: str = Field(description="Qualified layer name.", examples=["features.conv1"])
    op: str = Field(description="Op.", examples=["conv2d"])
    output_shape: list[int] = Field(description="Output shape.", examples=[[1, 64, 224, 224]])
    params: int = Field(description="Trainable parameters.", examples=[1792])
    flops: int = Field(description="Forward FLOPs.", examples=[173_408_256])
    activation_elements: int = Field(
        description="Elements of the layer's output.", examples=[3_211_264]
    )
    activation_bytes: int = Field(
        description="Bytes of the layer's output at the chosen precision.", examples=[12_845_056]
    )
    allocates: bool = Field(
        description="False for views and in-place ops, whose output shares its input's memory.",
        examples=[True],
    )


class ModelSummary(Schema):
    """A per-layer table of a stored model and its totals."""

    model: str = Field(description="Model slug.", examples=["vgg-16"])
    bindings: dict[str, int] = Field(
        description="Symbolic dims as bound.", examples=[{"batch": 1, "image": 224}]
    )
    precision: Precision = Field(description="Precision for byte figures.", examples=["fp32"])
    layers: list[ModelSummaryRow] = Field(description="Layers in execution order.")
    total_params: int = Field(description="Trainable parameters.", examples=[138_357_544])
    total_flops: int = Field(description="Forward FLOPs.", examples=[30_960_000_000])
    total_activation_bytes: int = Field(
        description="Sum of the outputs of layers that allocate (views and in-place ops share "
        "memory); not a peak.",
        examples=[1_934_357_504],
    )
    layer_count: int = Field(description="Executed layers.", examples=[40])
