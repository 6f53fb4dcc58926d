"""Inference recommendation contract: CPU vs GPU vs MIG slice, with the roofline behind it."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Self

from pydantic import Field, StringConstraints, model_validator

from app.domain.hardware import MIN_EFFICIENCY, DeviceKind, PriceKind
from app.domain.performance.calibration import (
    GPU_HALF_PRECISION_SCALE,
    MAX_PRECISION_SCALE,
    CalibrationClass,
)
from app.domain.performance.decoding import DEFAULT_KV_BLOCK_TOKENS, MAX_BEAM_WIDTH, Batching
from app.domain.performance.pipeline import ParallelStrategy
from app.domain.performance.prediction import Bound
from app.domain.performance.recommend import (
    DEFAULT_SLO_MARGIN_FRACTION,
    MAX_SLO_MARGIN_FRACTION,
    Objective,
    Scenario,
)
from app.domain.performance.runtimes import DEFAULT_RUNTIME, ServingRuntime
from app.domain.precision import Precision
from app.schemas.base import Schema, Slug, located_error
from app.schemas.engine_options import EngineOptions
from app.schemas.estimates import (
    BatchSize,
    DefaultUsedRow,
    InlineArchitecture,
    Length,
    one_model_rule,
)

MAX_BATCH_SIZES = 16
MAX_DEVICES = 200
MAX_SEARCH_BATCH = 65_536

CANDIDATE_PATTERN = (
    r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?(?:/[1-8]g\.[0-9]{1,3}gb(?:[+-][a-z]+(?:\.[a-z]+)?)?)?$"
)
CandidateName = Annotated[
    str,
    StringConstraints(pattern=CANDIDATE_PATTERN, min_length=1, max_length=100),
    Field(
        description="A hardware slug (the whole device) or `slug/profile` (one MIG slice).",
        examples=["nvidia-a100-80gb-sxm/1g.10gb"],
    ),
]


PriceUsdPerHour = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]


class CalibrationOverride(Schema):
    """Replace some of a device kind's calibrated efficiencies and overheads."""

    compute_efficiency: float | None = Field(
        default=None,
        ge=MIN_EFFICIENCY,
        le=1,
        allow_inf_nan=False,
        description="Achieved / dense peak FLOP/s, in [0.0001, 1].",
        examples=[0.5],
    )
    memory_efficiency: float | None = Field(
        default=None,
        ge=MIN_EFFICIENCY,
        le=1,
        allow_inf_nan=False,
        description="Achieved / peak memory bandwidth, in [0.0001, 1].",
        examples=[0.8],
    )
    activation_cache_share: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description="Share of activation traffic between kernels served by on-chip caches.",
        examples=[0.5],
    )
    host_link_efficiency: float | None = Field(
        default=None,
        ge=MIN_EFFICIENCY,
        le=1,
        allow_inf_nan=False,
        description="Achieved / theoretical host-link bandwidth, in [0.0001, 1].",
        examples=[0.75],
    )
    kernel_launch_overhead_us: float | None = Field(
        default=None,
        ge=0,
        le=1e6,
        allow_inf_nan=False,
        description="Per kernel launch, serial with the kernels [us].",
        examples=[5.0],
    )
    host_dispatch_us: float | None = Field(
        default=None,
        ge=0,
        le=1e6,
        allow_inf_nan=False,
        description="The serving framework's host time per kernel, overlapped with the "
        "device's work (a phase takes max(device time, launches x this)) [us].",
        examples=[20.0],
    )
    request_overhead_us: float | None = Field(
        default=None,
        ge=0,
        le=1e9,
        allow_inf_nan=False,
        description="Per request [us].",
        examples=[50.0],
    )
    half_precision_scale: float | None = Field(
        default=None,
        ge=MIN_EFFICIENCY,
        le=MAX_PRECISION_SCALE,
        allow_inf_nan=False,
        description="Multiplier on compute_efficiency where the math runs in fp16 or bf16 (the "
        "efficiencies are fitted on int8 rows; the product is capped at 1), in [0.0001, 10]. "
        f"GPU classes ship {GPU_HALF_PRECISION_SCALE:g} (fitted on published fp16 TensorRT-LLM "
        "runs), the others 1.",
        examples=[1.0],
    )


class InferenceRecommendationRequest(Schema):
    """Which device, precision and batch size should serve a model, and why."""

    model: Slug | None = Field(
        default=None, description="Stored model slug.", examples=["resnet-50"]
    )
    architecture: InlineArchitecture | None = Field(
        default=None, description="Inline architecture (instead of `model`)."
    )
    engine: EngineOptions | None = Field(
        default=None,
        description="Served by this engine (vLLM): a device, MIG slice or tensor x pipeline "
        "group is eligible only where the engine starts with its `min_concurrency` sequences "
        "of `max_model_len` (the same requirement and verdict as the estimate's fit, the MIG "
        "fit and admission); the others are listed in `excluded` with the engine's reason.",
    )
    batch_sizes: list[BatchSize] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_BATCH_SIZES,
        description="Batch sizes to consider. Default: find the best among 1, 2, 4, ... up to "
        "`max_batch_size`.",
        examples=[[1, 8, 32]],
    )
    max_batch_size: int = Field(
        default=256,
        ge=1,
        le=MAX_SEARCH_BATCH,
        description="Largest batch the search tries when `batch_sizes` is not given.",
        examples=[256],
    )
    precisions: list[Precision] = Field(
        default=[
            Precision.FP32,
            Precision.BF16,
            Precision.FP16,
            Precision.INT8,
        ],
        min_length=1,
        max_length=len(Precision),
        description="Precisions to consider: fp32, tf32, bf16, fp16, fp8 / int8 (W8A8), int4 "
        "(weight-only W4A16), fp4 (NVFP4 W4A4, Blackwell). A device without a peak for one is "
        "excluded for it, with the reason.",
        examples=[["fp16", "int8"]],
    )
    latency_slo_ms: float | None = Field(
        default=None,
        ge=1e-3,
        le=3.6e6,
        allow_inf_nan=False,
        description="Latency service-level objective per request, 1 us to 1 h [ms]; decoders: "
        "the whole request (time to first token + every further token). A candidate meets it "
        "when its predicted latency is at most latency_slo_ms x (1 - slo_margin).",
        examples=[20.0],
    )
    slo_margin: float = Field(
        default=DEFAULT_SLO_MARGIN_FRACTION,
        ge=0,
        le=MAX_SLO_MARGIN_FRACTION,
        allow_inf_nan=False,
        description="Headroom kept under the latency SLO, a fraction in [0, 0.9]: a candidate "
        "whose predicted latency is within this fraction of the SLO does not meet it (the "
        "budget is latency_slo_ms x (1 - slo_margin)). Only with latency_slo_ms. Default 0.1: "
        "the predicted latency is a roofline mean, and a prediction touching the SLO is no "
        "evidence of meeting it; 10 % is the minimum headroom kept, a policy choice, not a "
        "bound on the model's error, which is larger (out of sample, p90 latency predicted / "
        "measured has a median of 0.72 for ResNet-50 and 1.17 for BERT: "
        "benchmarks/calibration/README.md); raise it for a safer answer, 0 compares with the "
        "SLO itself.",
        examples=[0.1],
    )
    throughput_target_per_s: float | None = Field(
        default=None,
        ge=1e-6,
        le=1e12,
        allow_inf_nan=False,
        description="Inferences (decoders: sequences) per second to serve, in [1e-6, 1e12]; "
        "sets devices needed.",
        examples=[1000.0],
    )
    devices: list[CandidateName] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_DEVICES,
        description="Candidate devices. Default: every hardware profile and every MIG slice.",
        examples=[["intel-xeon-platinum-8480plus", "nvidia-a10", "nvidia-a100-80gb-sxm/1g.10gb"]],
    )
    objective: Objective = Field(
        default=Objective.COST,
        description="cost (per million inferences, or per hour for the throughput target), "
        "energy (per inference) or latency.",
        examples=["cost"],
    )
    sequence_length: Length | None = Field(
        default=None,
        description="Binds `seq` for encoders (tokens); decoders use prompt_tokens.",
        examples=[None],
    )
    tokens_mean: Length | None = Field(
        default=None,
        description="Encoders served without padding (variable-length batching, as TensorRT, "
        "FasterTransformer and MLPerf BERT submissions run): the mean number of real tokens "
        "per input. Compute, latency and throughput are priced at this length; memory at "
        "`sequence_length` (buffers are sized for the longest input). At most the sequence "
        "length; not for decoders (they use prompt_tokens). Unset: every input is padded to "
        "the sequence length.",
        examples=[None],
    )
    image_size: Length | None = Field(
        default=None, description="Binds `image` (pixels per side).", examples=[224]
    )
    bindings: dict[str, Annotated[int, Field(ge=1, le=2**40)]] = Field(
        default_factory=dict, description="Values for other symbolic dims.", examples=[{}]
    )
    prompt_tokens: Length = Field(
        default=512,
        description="Decoder LLMs: prompt length of the prefill phase [tokens].",
        examples=[512],
    )
    generated_tokens: Length = Field(
        default=128,
        description="Decoder LLMs: tokens generated per sequence; the prefill gives the first, "
        "each further one is a decode step [tokens]. With `generated_tokens_mean` this is the "
        "maximum (max_new_tokens).",
        examples=[128],
    )
    prompt_tokens_mean: Length | None = Field(
        default=None,
        description="Decoder LLMs: mean prompt length when prompts vary; `prompt_tokens` is "
        "then the maximum. Continuous batching prices the prefill and decode context at the "
        "mean; static batching pads every prompt to the maximum. At most prompt_tokens. "
        "Default: prompt_tokens (every prompt that long).",
        examples=[None],
    )
    generated_tokens_mean: Length | None = Field(
        default=None,
        description="Decoder LLMs: mean tokens generated per request when outputs vary; "
        "`generated_tokens` is then the maximum. Continuous batching runs the mean number of "
        "decode steps; static batching runs every batch until its longest output (the "
        "maximum). At most generated_tokens. Default: generated_tokens.",
        examples=[None],
    )
    batching: Batching = Field(
        default=Batching.STATIC,
        description="Decoder LLMs: static (default, the behaviour before this option): a "
        "batch is padded to the maximum lengths and runs until its longest output, with the "
        "whole padded KV cache reserved per sequence. continuous: in-flight batching with a "
        "paged KV cache (TensorRT-LLM, vLLM): finished requests leave at once and waiting ones "
        "join, so the mean request is priced (a prefill of prompt_tokens_mean, "
        "generated_tokens_mean - 1 decode steps at the mean context), and the concurrent "
        "requests are those whose paged KV cache (the mean request's prompt + generated "
        "tokens, in blocks of kv_block_tokens) fits beside the weights; throughput is "
        "requests completed per second in steady state. With serving_runtime vllm the default "
        "is continuous (vLLM always batches in flight) and static is a 422.",
        examples=["static"],
    )
    beam_width: int = Field(
        default=1,
        ge=1,
        le=MAX_BEAM_WIDTH,
        description="Decoder LLMs: beams per request (beam search), 1 to 16; 1 = greedy or "
        "sampling. Decode runs requests x beam_width sequences, each with its KV cache. "
        "static: every beam is a padded row with its own copy of the prompt (transformers' "
        "generate expands the input beam_width times). continuous: the prompt is prefilled "
        "once and its full KV blocks are shared by the beams (TensorRT-LLM's KV cache manager, "
        "vLLM's copy-on-write blocks); the prompt's last partial block and the generated "
        "tokens' blocks are per beam. Throughput counts requests, not beams.",
        examples=[1],
    )
    kv_block_tokens: int = Field(
        default=DEFAULT_KV_BLOCK_TOKENS,
        ge=1,
        le=4096,
        description="Decoder LLMs, continuous batching: tokens per paged KV-cache block; a "
        "request's cache is rounded up to whole blocks. Default 64, TensorRT-LLM's "
        "tokens_per_block default (its PluginConfig); vLLM's default is 16.",
        examples=[64],
    )
    beams_share_prompt: bool = Field(
        default=True,
        description="Decoder LLMs, continuous batching with beam_width > 1: whether the beams "
        "share the prompt's KV cache. true (default): one copy of the prompt's full KV blocks "
        "is shared by the beams and each decode step reads the cached prompt once per request, "
        "not once per beam (TensorRT-LLM: its KV cache manager shares the prompt's full blocks "
        "among the beams and its masked MHA kernel reads every beam's context from beam 0's "
        "blocks; vLLM: copy-on-write blocks; Intel Extension for PyTorch). false: every beam "
        "holds and reads its own copy of the prompt's KV cache (Neural Speed copies the "
        "prompt's cache to every beam): a request holds beam_width x (prompt + generated "
        "tokens, rounded up to blocks) KV slots, so fewer requests fit, and each decode step "
        "reads the prompt beam_width times. No effect with one beam. Not with batching static, "
        "where every beam is already a padded row with its own copy.",
        examples=[True],
    )
    prices_usd_per_hour: dict[Slug, PriceUsdPerHour] = Field(
        default_factory=dict,
        max_length=MAX_DEVICES,
        description="Prices per device slug, overriding the catalog, 0 to 1 000 000 [USD/h]; "
        "MIG slices pay their share of compute slices. They are taken as prices of "
        "`price_kind` (no region or date).",
        examples=[{"intel-xeon-platinum-8480plus": 1.1}],
    )
    scenario: Scenario = Field(
        default=Scenario.OFFLINE,
        description="How requests arrive (MLPerf's scenarios). offline: batches back to back; "
        "throughput = batch / interval, latency = one batch's. server: requests arrive one at "
        "a time at random (Poisson) and a dynamic batcher groups what is waiting, up to a "
        "batch cap chosen among the batch sizes tried; throughput is the largest arrival rate "
        "whose simulated 99th-percentile latency stays within the latency budget "
        "(latency_slo_ms x (1 - slo_margin)), latency is that p99, and costs are priced at "
        "that rate. server needs latency_slo_ms. single_stream: one sample per query, the next "
        "sent when the answer is back (MLPerf SingleStream, an interactive user): batch 1 only, "
        "latency = that request's, throughput = 1 / latency (nothing overlaps the next query), "
        "and costs are priced at that rate; batch_sizes, if given, must be [1], and "
        "max_batch_size is not used.",
        examples=["offline"],
    )
    price_kind: PriceKind = Field(
        default=PriceKind.ON_DEMAND,
        description="The one kind of price costs are computed and ranked by: on_demand, "
        "reserved or spot. A device whose price is of another kind (or has no kind) gets no "
        "cost figure and is not ranked by cost, with the reason.",
        examples=["on_demand"],
    )
    calibration: dict[CalibrationClass, CalibrationOverride] = Field(
        default_factory=dict,
        description="Override the calibrated efficiencies and overheads per calibration class: "
        "gpu_ampere (A10, A30, A100), gpu_hopper (H100, H200, GH200), gpu (every other GPU: "
        "Turing, Volta, Ada, Blackwell), cpu (math on a CPU's vector units: AVX-512 VNNI or "
        "AVX2 Xeons, AMD EPYC, Arm, and fp32 on any CPU), cpu_amx (int8, bf16 or fp16 math on "
        "the AMX tiles of a CPU whose catalog `simd` names AMX: Xeon 8480+, 8592+, 6980P), "
        "edge, tpu. An override of gpu applies to every GPU class, and an architecture class's "
        "own override wins over it field by field; an override of cpu does not change cpu_amx. "
        "A candidate's `inputs.calibration_class` says which one it ran under.",
        examples=[{"gpu": {"compute_efficiency": 0.5}, "cpu_amx": {"compute_efficiency": 0.3}}],
    )
    tensor_parallel_max: int = Field(
        default=8,
        ge=1,
        le=8,
        description="A whole GPU (not a MIG slice) on which batch 1 does not fit is also "
        "offered as the smallest tensor-parallel group of 2, 4 or 8 such GPUs (at most this "
        "many) whose per-GPU memory-engine peak fits: each GPU runs 1/t of the FLOPs, weights "
        "and KV cache, with two ring all-reduces of the hidden state per attention layer over "
        "the catalog's GPU link (NVLink; else the host link). Needs attention layers. 1: "
        "single GPUs only.",
        examples=[8],
    )
    parallelism: ParallelStrategy = Field(
        default=ParallelStrategy.TENSOR,
        description="How a whole GPU on which batch 1 does not fit is grouped with others of "
        "its kind. tensor (default, the answer before this option): tensor-parallel groups "
        "(see tensor_parallel_max). pipeline: instead, the smallest pipeline-parallel group of "
        "2, 4 or 8 GPUs (at most pipeline_parallel_max) whose per-GPU memory-engine peak fits: "
        "the transformer blocks are split evenly over the GPUs in order (the remainder to the "
        "stages before the last), each GPU holds its stage's weights and KV cache, the batch "
        "runs as min(batch, stages) micro-batches and the hidden state crosses the GPU link "
        "(NVLink; else the host link) between stages; the candidate's `pipeline` block has the "
        "stage layout, per-stage times, bytes and time sent, the cycle, the steady-state idle "
        "share and the GPipe bubble. both: tensor groups, pipeline groups and the smallest "
        "tensor x pipeline group (t, p >= 2, at most 8 GPUs). Pipeline groups need repeated "
        "blocks (layers named like `layers.0.*`).",
        examples=["tensor"],
    )
    pipeline_parallel_max: int = Field(
        default=8,
        ge=1,
        le=8,
        description="Most pipeline stages (GPUs) a pipeline group may have (parallelism "
        "pipeline or both). 1: no pipeline groups.",
        examples=[8],
    )
    serving_runtime: ServingRuntime = Field(
        default=DEFAULT_RUNTIME,
        description="The framework that serves the model: tensorrt (default: the calibration "
        "as fitted on MLPerf results; on "
        "published framework-level TensorRT runs it is within 1.5x for 8 of 9; for decoder "
        "LLMs it is TensorRT-LLM-grade serving, within 1.5x of 35 of 35 published TensorRT-LLM "
        "throughputs, benchmarks/calibration/llm_serving.md), torch_compile, "
        "pytorch_eager, tensorflow, onnxruntime (ONNX Runtime's CUDA execution provider; its "
        "TensorRT provider is tensorrt), or vllm (decoder LLMs only: 422 for other models). Each "
        "profile fuses element-wise layers or not, scales the compute efficiency and sets the "
        "framework's host time per kernel (host_dispatch_s: overlapped with the GPU's kernels, "
        "which wait for it only when they are shorter), fitted on published same-model, "
        "same-device measurements (benchmarks/calibration/runtimes.md: leaving each device out, "
        "torch_compile 5 of 6 rows within 1.5x, pytorch_eager 12 of 20, tensorflow 10 of 10, "
        "onnxruntime 5 of 16 and 11 of 16 within 2x: fitted on transformer encoders, one "
        "source per device, which disagree). vllm scales the "
        "compute efficiency by 0.7 and adds 70 us of host work per sequence per engine step, "
        "serial with the GPU (benchmarks/calibration/vllm_profile.md: 5 published rows, mostly "
        "vLLM v0.5.4; leaving each device out 5 of 5 within 1.5x). On CPUs only pytorch_eager "
        "has a scale of its own (x 0.7 on the CPU compute efficiency, element-wise layers "
        "unfused; fitted on 20 published ratios of Intel's optimized PyTorch to stock PyTorch "
        "on a Xeon 8380 and an 8380H, 16 of 20 within 1.5x leaving each CPU out); under the other "
        "runtimes CPUs keep the MLPerf-fitted calibration (no CPU measurements of them; the "
        "assumptions say so). An explicit fuse_elementwise or calibration override wins.",
        examples=["tensorrt"],
    )
    fuse_elementwise: bool = Field(
        default=True,
        description="Fuse batchnorm, activations and residual adds into the kernel before them "
        "(as TensorRT, OpenVINO and torch.compile do); false: one kernel per layer (eager). "
        "Default: what serving_runtime does (false for pytorch_eager and tensorflow).",
        examples=[True],
    )
    limit: int = Field(
        default=10,
        ge=1,
        le=2000,
        description=(
            "Ranked candidates to return (the whole catalog is about 500 device / precision "
            "pairs: 2,000 lists every one)."
        ),
        examples=[10],
    )

    @model_validator(mode="after")
    def _one_model(self) -> Self:
        name = type(self).__name__
        one_model_rule(name, self.model, self.architecture)
        if self.scenario is Scenario.SERVER and self.latency_slo_ms is None:
            raise located_error(
                name,
                ("latency_slo_ms",),
                "scenario server needs latency_slo_ms: its p99 latency bound",
            )
        if self.scenario is Scenario.SINGLE_STREAM:
            if self.batch_sizes is not None and set(self.batch_sizes) != {1}:
                raise located_error(
                    name,
                    ("batch_sizes",),
                    "scenario single_stream sends one sample per query: batch_sizes must be "
                    "[1] or left out",
                )
            if "max_batch_size" in self.model_fields_set and self.max_batch_size != 1:
                raise located_error(
                    name,
                    ("max_batch_size",),
                    "scenario single_stream sends one sample per query: max_batch_size "
                    "would not be used (leave it out)",
                )
        for mean, longest in (("prompt_tokens_mean", "prompt_tokens"),
                              ("generated_tokens_mean", "generated_tokens")):  # fmt: skip
            value = getattr(self, mean)
            if value is not None and value > getattr(self, longest):
                raise located_error(
                    name,
                    (mean,),
                    f"{mean} {value} exceeds {longest} {getattr(self, longest)}, the maximum",
                )
        if self.serving_runtime is ServingRuntime.VLLM:
            if "batching" not in self.model_fields_set:
                # vLLM serves in flight: its default, not the request's (the field stays unset,
                # so defaults_used lists it). Set without __setattr__, which would mark it set.
                self.__dict__["batching"] = Batching.CONTINUOUS
            elif self.batching is Batching.STATIC:
                raise located_error(
                    name,
                    ("batching",),
                    "serving_runtime vllm batches continuously (in-flight batching with a "
                    "paged KV cache); batching static is not how it serves",
                )
        if "kv_block_tokens" in self.model_fields_set and self.batching is Batching.STATIC:
            raise located_error(
                name,
                ("kv_block_tokens",),
                "kv_block_tokens sizes the paged KV cache of batching continuous; static "
                "batching reserves the whole padded context",
            )
        if "beams_share_prompt" in self.model_fields_set and self.batching is Batching.STATIC:
            raise located_error(
                name,
                ("beams_share_prompt",),
                "beams_share_prompt is about the paged KV cache of batching continuous; static "
                "batching gives every beam its own padded copy of the prompt",
            )
        if "slo_margin" in self.model_fields_set and self.latency_slo_ms is None:
            raise located_error(
                name, ("slo_margin",), "slo_margin is headroom under latency_slo_ms: set that too"
            )
        for field, values in (("precisions", self.precisions), ("devices", self.devices or [])):
            seen: set[str] = set()
            for index, value in enumerate(values):
                if value in seen:
                    raise located_error(name, (field, index), f"{field} must not repeat: {value}")
                seen.add(value)
        return self


class RooflineInputs(Schema):
    """Every number the prediction of one candidate is computed from."""

    sm_count: int | None = Field(
        default=None,
        description="Streaming multiprocessors the candidate's GEMM tiles are spread over (a MIG "
        "slice: floor(GPU SMs x compute fraction)); null: unknown, or a CPU or TPU, and GEMMs "
        "are priced without wave quantization.",
        examples=[108],
    )
    gemm_tile: int | None = Field(
        default=None,
        description="Side of the square output tile of one thread block, the same at every "
        "precision (an assumption: CUTLASS's default SIMT tile, between its 128 x 256 "
        "tensor-op default and cuBLAS's smaller tiles) [elements]; null when `sm_count` is.",
        examples=[128],
    )
    tiling: str | None = Field(
        default=None,
        description="The tile and wave model in words (the per-phase `wave_efficiency` is its "
        "result); null when it does not apply.",
        examples=[
            "GEMMs and convolutions in 128 x 128 output tiles spread over 108 SMs in waves; ..."
        ],
    )

    precision_convention: str = Field(
        description="What the precision means: bytes per weight and activation, and the math.",
        examples=["int8 W8A8 as in MLPerf (TensorRT, OpenVINO, IPEX): ..."],
    )
    compute_dtype: str = Field(description="Dtype whose peak runs the math.", examples=["int8"])
    peak_flops_per_s: float = Field(
        description="The whole device's dense catalog peak for compute_dtype [FLOP/s].",
        examples=[229.4e12],
    )
    peak_source: str = Field(
        description="Which peak that is, and why.",
        examples=["catalog dense int8 peak (AMX tiles; the CPU has AVX-512 + AMX)"],
    )
    compute_fraction: float = Field(
        description="Share of the device's compute (MIG: compute slices / total).", examples=[1.0]
    )
    calibration_class: CalibrationClass = Field(
        description="The calibration the efficiencies and overheads here come from, a key of "
        "the response's `calibration` map: the device kind; gpu_ampere or gpu_hopper for a GPU "
        "of those architectures (each generation reaches its own share of its spec peak); "
        "cpu_amx where Intel AMX tiles run the math (int8, bf16, fp16 on a CPU with AMX: the "
        "tiles reach a smaller share of their peak than AVX-512 VNNI does of its own).",
        examples=["cpu_amx"],
    )
    compute_efficiency: float = Field(description="Calibrated efficiency.", examples=[0.46])
    precision_scale: float = Field(
        description="Multiplier on compute_efficiency for this compute dtype: the calibration's "
        "half_precision_scale for fp16 / bf16 math, else 1.",
        examples=[1.0],
    )
    effective_flops_per_s: float = Field(
        description="peak x compute_fraction x min(1, compute_efficiency x precision_scale) "
        "[FLOP/s].",
        examples=[1.05e14],
    )
    memory_bandwidth_bytes_per_s: float = Field(
        description="The whole device's peak memory bandwidth [B/s].", examples=[307.2e9]
    )
    bandwidth_fraction: float = Field(
        description="Share of the bandwidth (MIG: memory slices / total).", examples=[1.0]
    )
    memory_efficiency: float = Field(description="Assumed efficiency.", examples=[0.7])
    activation_cache_share: float = Field(
        description="Share of activation traffic served on chip (calibrated).", examples=[0.35]
    )
    effective_bandwidth_bytes_per_s: float = Field(
        description="bandwidth x bandwidth_fraction x memory_efficiency [B/s].", examples=[2.15e11]
    )
    host_link_bytes_per_s: float | None = Field(
        default=None,
        description="Theoretical per-direction host link (null: no copy) [B/s].",
        examples=[31.5e9],
    )
    host_link_source: str = Field(
        description="Where the link figure comes from.", examples=["catalog"]
    )
    host_link_efficiency: float = Field(description="Calibrated efficiency.", examples=[0.73])
    effective_host_link_bytes_per_s: float | None = Field(
        default=None,
        description="host link x host_link_efficiency (null: no copy) [B/s].",
        examples=[23.0e9],
    )
    kernel_launch_overhead_s: float = Field(
        description="Per kernel launch, serial with the kernels [s].", examples=[4e-6]
    )
    host_dispatch_s: float = Field(
        default=0.0,
        description="The serving framework's host time per kernel, overlapped with the "
        "device's work (see the phases' host_wait_s) [s].",
        examples=[0.0],
    )
    request_overhead_s: float = Field(description="Per request [s].", examples=[4.2e-5])
    tdp_watts: float | None = Field(
        default=None, description="TDP (MIG: share) [W].", examples=[350.0]
    )
    price_usd_per_hour: float | None = Field(
        default=None,
        description="The device's price (MIG: share) [USD/h]; it gives a cost only when "
        "price_kind is the request's.",
        examples=[1.1],
    )
    price_source: str = Field(
        description="Where the price comes from: `request`, or `catalog` with the offer and "
        "page it was read on.",
        examples=["catalog"],
    )
    price_kind: PriceKind | None = Field(
        default=None,
        description="Kind of the price (null: no price, or one stored without its kind).",
        examples=["on_demand"],
    )
    price_region: str | None = Field(
        default=None, description="Region of the price (null: not stated).", examples=["us-east-1"]
    )
    price_date: date | None = Field(
        default=None,
        description="Date of the price (null: unknown; see price_source).",
        examples=[None],
    )


class PhaseRead(Schema):
    """One phase of a request on the candidate, per repetition."""

    name: str = Field(description="forward, prefill or decode.", examples=["forward"])
    repeats: int = Field(
        description="Times per request (decode: generated tokens - 1).", examples=[1]
    )
    kernels: int = Field(description="Kernels after fusion.", examples=[71])
    launches: int = Field(description="Kernel launches.", examples=[71])
    compute_bound_kernels: int = Field(
        description="Kernels whose intensity is above the ridge point.", examples=[53]
    )
    flops: int = Field(description="FLOPs per repetition.", examples=[8_239_859_200])
    bytes_moved: int = Field(
        description="Weights + inputs + outputs (+ KV cache) per repetition [B].",
        examples=[70_000_000],
    )
    dram_bytes: float = Field(
        description="Of those, what reaches DRAM: weights + KV cache + (1 - activation cache "
        "share) x activations [B].",
        examples=[40_000_000],
    )
    compute_s: float = Field(description="Time of compute-bound kernels [s].", examples=[1e-4])
    memory_s: float = Field(description="Time of memory-bound kernels [s].", examples=[2e-5])
    launch_s: float = Field(
        description="Launch overhead: launches x the calibration's kernel_launch_overhead_s, "
        "serial with the kernels [s].",
        examples=[2.8e-4],
    )
    host_wait_s: float = Field(
        default=0.0,
        description="The device idle waiting for the framework's host to issue kernels: "
        "launches x the calibration's host_dispatch_s beyond the device's own time (compute_s "
        "+ memory_s + launch_s + allreduce_s); 0 when the kernels outlast the host's dispatch "
        "(launches are asynchronous) and under the tensorrt default (no host dispatch) [s].",
        examples=[0.0],
    )
    h2d_bytes: int = Field(description="Host-to-device copy [B].", examples=[150_528])
    h2d_s: float = Field(description="Host-to-device time [s].", examples=[6.5e-6])
    d2h_bytes: int = Field(description="Device-to-host copy [B].", examples=[1000])
    d2h_s: float = Field(description="Device-to-host time [s].", examples=[4e-8])
    latency_s: float = Field(description="h2d + kernels + d2h [s].", examples=[4e-4])
    allreduces: int = Field(
        default=0, description="Tensor parallel: all-reduces per repetition.", examples=[0]
    )
    allreduce_bytes: int = Field(
        default=0,
        description="Tensor parallel: bytes all-reduced per repetition [B].",
        examples=[0],
    )
    allreduce_s: float = Field(
        default=0.0,
        description="Tensor parallel: their time, between the kernels [s].",
        examples=[0.0],
    )
    pipeline_transfer_bytes: int = Field(
        default=0,
        description="Pipeline parallel: bytes one micro-batch sends between stages per "
        "repetition, every boundary together [B].",
        examples=[0],
    )
    pipeline_transfer_s: float = Field(
        default=0.0,
        description="Pipeline parallel: their time, sum of the sends X_s [s].",
        examples=[0.0],
    )
    pipeline_wait_s: float = Field(
        default=0.0,
        description="Pipeline parallel: the wait for the other micro-batches, cycle - round "
        "trip (0 when one micro-batch's round trip sets the pace). Pipeline figures are one "
        "micro-batch through every stage: compute_s + memory_s + launch_s + allreduce_s + "
        "host_wait_s + pipeline_transfer_s + pipeline_wait_s = the cycle [s].",
        examples=[0.0],
    )
    wave_efficiency: float = Field(
        default=1.0,
        description="FLOPs / the FLOPs the device pays for: each GEMM's (convolution's, "
        "attention core's) FLOPs divided by its wave efficiency tiles / (ceil(tiles / SMs) x "
        "SMs) on the device (see the roofline inputs' `sm_count` and `gemm_tile`); 1 when the "
        "device has no SM count. compute_s already includes it [-].",
        examples=[0.93],
    )


class DecoderServingRead(Schema):
    """How a decoder candidate is served: the numbers its throughput comes from."""

    batching: Batching = Field(description="static or continuous.", examples=["continuous"])
    concurrent_requests: int = Field(
        description="Requests in flight together (batch_size): static, the batch; continuous, "
        "the requests the engine keeps going.",
        examples=[192],
    )
    max_concurrent_requests: int | None = Field(
        default=None,
        description="Continuous: the most requests whose paged KV cache fits (null: static).",
        examples=[201],
    )
    beam_width: int = Field(description="Beams per request.", examples=[4])
    decode_sequences: int = Field(
        description="Sequences per decode step: concurrent_requests x beam_width.",
        examples=[768],
    )
    prompt_tokens: int = Field(
        description="Prompt the prefill is priced at: the mean (continuous) or the maximum "
        "(static) [tokens].",
        examples=[1065],
    )
    decode_steps: int = Field(
        description="Decode steps per request: generated tokens priced - 1.", examples=[74]
    )
    mean_context_tokens: int = Field(
        description="Context each decode step attends to, on average: prompt + generated / 2 "
        "at the priced lengths [tokens].",
        examples=[1102],
    )
    kv_bytes_per_token: int = Field(
        description="KV cache of one token of one sequence, all layers, at the precision [B].",
        examples=[229376],
    )
    kv_tokens_per_request: int = Field(
        description="KV token slots one request holds, all beams: static k x (max prompt + max "
        "generated); continuous the paged blocks of the mean request [tokens].",
        examples=[1536],
    )
    kv_bytes_per_request: int = Field(
        description="kv_tokens_per_request x kv_bytes_per_token per GPU of a tensor x pipeline "
        "group: a tensor-parallel rank holds its share of the KV heads, one replicated head "
        "when the group is larger than the KV heads (vLLM), and a stage its layers [B].",
        examples=[352321536],
    )
    note: str = Field(description="The serving assumptions in words.", examples=["..."])


class PipelineStageRead(Schema):
    """The kernels one pipeline stage (one GPU, or one tensor-parallel group) runs."""

    stage: int = Field(description="0 = the first (it receives the inputs).", examples=[0])
    blocks: int = Field(description="Repeated blocks (transformer layers).", examples=[20])
    kernels: int = Field(description="Kernels after fusion.", examples=[81])
    first_kernel: str = Field(description="Its first kernel.", examples=["embed_tokens"])
    last_kernel: str = Field(description="Its last kernel.", examples=["layers.19.mlp"])


class PipelinePhaseRead(Schema):
    """One repetition of a phase (forward, prefill, one decode step) through the pipeline."""

    name: str = Field(description="forward, prefill or decode.", examples=["decode"])
    stage_s: list[float] = Field(
        description="T_s: each stage's kernel time on one micro-batch (the roofline of its "
        "kernels; under tensor x pipeline with its all-reduces) [s].",
        examples=[[0.0061, 0.0061, 0.0061, 0.0066]],
    )
    send_bytes: list[int] = Field(
        description="Activation each boundary sends per micro-batch: the output of the "
        "stage's last kernel (hidden state of every token of the micro-batch) [B].",
        examples=[[262144, 262144, 262144]],
    )
    send_s: list[float] = Field(
        description="X_s = transfer_latency_s + send_bytes / link_bytes_per_s [s].",
        examples=[[1.001e-5, 1.001e-5, 1.001e-5]],
    )
    slot_s: float = Field(
        description="tau = max over stages of T_s + X_s (the send is not overlapped) [s].",
        examples=[0.0066],
    )
    round_trip_s: float = Field(
        description="R = sum T_s + sum X_s: one micro-batch through every stage [s].",
        examples=[0.0249],
    )
    cycle_s: float = Field(
        description="I = max(micro_batches x slot_s, round_trip_s): one repetition of the "
        "batch in steady state, and of one micro-batch (a decode step's latency) [s].",
        examples=[0.0264],
    )
    idle_fraction: float = Field(
        description="Share of the p GPUs' time idle in steady state: 1 - micro_batches x "
        "sum T_s / (stages x cycle_s) (transfers, unequal stages, fewer micro-batches than "
        "stages) [-].",
        examples=[0.06],
    )
    gpipe_bubble_fraction: float = Field(
        description="(p - 1) / (m + p - 1): the idle share of one pass of a batch run alone, "
        "the pipeline filled and drained (a lone batch, the first after idle); not in the "
        "steady-state figures [-].",
        examples=[0.43],
    )


class PipelineRead(Schema):
    """How a pipeline-parallel candidate runs: the numbers its figures come from."""

    stages: int = Field(description="p: GPUs (or tensor-parallel groups) in order.", examples=[4])
    micro_batches: int = Field(
        description="m = min(batch_size, stages): p keep every stage busy.", examples=[4]
    )
    micro_batch_size: int = Field(
        description="ceil(batch_size / m) requests per micro-batch (each priced full).",
        examples=[16],
    )
    link: str = Field(
        description="The link the activations cross.",
        examples=["the catalog's GPU link (NVLink)"],
    )
    link_bytes_per_s: float = Field(
        description="Its bandwidth per direction x the calibrated host-link efficiency [B/s].",
        examples=[3.285e11],
    )
    transfer_latency_s: float = Field(
        description="Per send (assumed, as per all-reduce: 10 us) [s].", examples=[1e-5]
    )
    stage_layout: list[PipelineStageRead] = Field(
        description="Blocks split evenly, the remainder to the stages before the last (vLLM "
        "get_pp_indices); embedding on the first stage, final norm and LM head on the last."
    )
    phases: list[PipelinePhaseRead] = Field(description="Per phase: stages, sends, cycle.")


class TimeShares(Schema):
    """What fraction of the latency goes where."""

    compute: float = Field(description="Compute-bound kernels.", examples=[0.2])
    memory: float = Field(description="Memory-bound kernels.", examples=[0.05])
    transfer: float = Field(
        description="Host-link copies (and all-reduces, sends between pipeline stages).",
        examples=[0.05],
    )
    overhead: float = Field(
        description="Launches, the wait for a framework's host to dispatch kernels (the "
        "phases' host_wait_s) and per-request overhead (and a pipeline's wait for the other "
        "micro-batches).",
        examples=[0.7],
    )


class ServerScenarioRead(Schema):
    """The server scenario's queue for one candidate: what was simulated and what came out."""

    arrival_rate_per_s: float = Field(
        description="Largest Poisson arrival rate whose simulated p99 latency stays within the "
        "budget: the candidate's throughput [1/s].",
        examples=[8500.0],
    )
    p99_latency_ms: float = Field(description="Simulated p99 at that rate [ms].", examples=[9.7])
    p99_bound_ms: float = Field(
        description="The bound: latency_slo_ms x (1 - slo_margin) [ms].", examples=[13.5]
    )
    batch_cap: int = Field(
        description="The dynamic batcher's largest batch (a batch size tried).", examples=[64]
    )
    mean_batch: float = Field(description="Requests per batch at that rate.", examples=[31.2])
    utilisation: float = Field(description="Share of the time the device is busy.", examples=[0.9])
    offline_throughput_per_s: float = Field(
        description="Back-to-back full batches at the best batch size tried [1/s].",
        examples=[10062.0],
    )
    offline_share: float = Field(
        description="arrival_rate_per_s / offline_throughput_per_s.", examples=[0.85]
    )
    requests_simulated: int = Field(
        description="Arrivals simulated per rate tried (the first 10 % left out).",
        examples=[4000],
    )
    note: str = Field(description="The same in one line.", examples=["server scenario: ..."])


class RankedCandidate(Schema):
    """One device at one precision, at its best batch size, judged against the request."""

    rank: int = Field(description="1 = recommended.", examples=[1])
    device: str = Field(description="Candidate name.", examples=["intel-xeon-platinum-8480plus"])
    device_name: str = Field(description="Human-readable name.", examples=["Xeon Platinum 8480+"])
    kind: DeviceKind = Field(description="gpu, cpu, edge or tpu.", examples=["cpu"])
    mig_profile: str | None = Field(
        default=None, description="MIG profile of a slice.", examples=[None]
    )
    precision: Precision = Field(description="Precision.", examples=["int8"])
    batch_size: int = Field(description="Best batch among those tried.", examples=[4])
    gpus: int = Field(
        default=1,
        description="GPUs the candidate is (a tensor- or pipeline-parallel group: its price, "
        "TDP and throughput are the group's; memory is per GPU).",
        examples=[1],
    )
    tensor_parallel: int = Field(
        default=1, description="GPUs per tensor-parallel group (1: none).", examples=[1]
    )
    pipeline_parallel: int = Field(
        default=1,
        description="Pipeline stages (1: none); gpus = tensor_parallel x pipeline_parallel.",
        examples=[1],
    )
    allreduce_link: str | None = Field(
        default=None,
        description="Tensor parallel: the link the all-reduces cross.",
        examples=[None],
    )
    eligible: bool = Field(
        description="Fits, meets the SLO with its margin, has a price of price_kind for cost.",
        examples=[True],
    )
    reasons: list[str] = Field(description="Why it is not eligible.", examples=[[]])
    latency_ms: float = Field(
        description="Latency per request [ms]: one batch's (offline), the simulated p99 (server).",
        examples=[1.9],
    )
    throughput_per_s: float = Field(
        description="Steady-state inferences (decoders: sequences) per second per device: "
        "back-to-back batches (offline), the sustained Poisson arrival rate (server).",
        examples=[2100.0],
    )
    meets_latency_slo: bool = Field(
        description="latency <= SLO x (1 - slo_margin) (or no SLO).", examples=[True]
    )
    devices_needed: int | None = Field(
        default=None, description="Devices for the throughput target.", examples=[1]
    )
    cost_usd_per_million: float | None = Field(
        default=None, description="price / 3600 / throughput x 1e6 [USD].", examples=[0.15]
    )
    fleet_cost_usd_per_hour: float | None = Field(
        default=None, description="devices_needed x price [USD/h].", examples=[1.1]
    )
    unpriced_reason: str | None = Field(
        default=None,
        description="Why the cost figures are null: no price of the request's price_kind "
        "(null: priced).",
        examples=[None],
    )
    energy_j_per_inference: float | None = Field(
        default=None, description="TDP x latency / batch (an upper bound) [J].", examples=[0.17]
    )
    fits_in_memory: bool = Field(description="Memory engine peak <= memory.", examples=[True])
    memory_required_bytes: int = Field(
        description="Inference peak from the memory engine [B].", examples=[700_000_000]
    )
    memory_available_bytes: int = Field(
        description="Device or MIG profile memory [B].", examples=[549_755_813_888]
    )
    memory_detail: str = Field(
        description="How the required bytes were estimated.",
        examples=["POST /v1/estimates/memory with mode=inference, precision=int8, ..."],
    )
    bound: Bound = Field(description="Largest share of the latency.", examples=["compute"])
    time_shares: TimeShares = Field(description="Latency split.")
    arithmetic_intensity_flops_per_byte: float = Field(
        description="Operational intensity: FLOPs / DRAM bytes over the request [FLOP/B].",
        examples=[117.0],
    )
    ridge_point_flops_per_byte: float = Field(
        description="Effective peak / effective bandwidth [FLOP/B].", examples=[490.0]
    )
    flops_per_inference: float = Field(
        description="FLOPs per inference (per sequence for decoders).", examples=[8.24e9]
    )
    time_to_first_token_ms: float | None = Field(
        default=None, description="Decoders: request overhead + prefill [ms].", examples=[None]
    )
    per_token_latency_ms: float | None = Field(
        default=None, description="Decoders: one decode step [ms].", examples=[None]
    )
    tokens_per_s: float | None = Field(
        default=None, description="Decoders: generated tokens per second.", examples=[None]
    )
    inputs: RooflineInputs = Field(description="What the figures are computed from.")
    phases: list[PhaseRead] = Field(description="Per-phase time split.")
    server: ServerScenarioRead | None = Field(
        default=None,
        description="scenario server: the queue behind latency_ms (its p99) and "
        "throughput_per_s (the sustained rate); null offline.",
    )
    decoder_serving: DecoderServingRead | None = Field(
        default=None,
        description="Decoder LLMs: concurrent requests, beams, KV bytes per request and the "
        "mean context the figures come from (null for other models).",
    )
    pipeline: PipelineRead | None = Field(
        default=None,
        description="Pipeline-parallel groups: stages, micro-batches, per-stage times, bytes "
        "and time sent between stages, cycle, idle share and bubble (null otherwise).",
    )


class Exclusion(Schema):
    """A device and precision that was not evaluated, and why."""

    device: str = Field(description="Candidate name.", examples=["nvidia-v100-32gb-sxm2"])
    precision: Precision = Field(description="Precision.", examples=["int8"])
    reason: str = Field(
        description="Why.", examples=["no int8 peak in the hardware profile (it lists: fp16)"]
    )


class CalibrationRead(Schema):
    """Efficiencies and overheads used for one device kind."""

    compute_efficiency: float = Field(description="Achieved / peak FLOP/s.", examples=[0.41])
    memory_efficiency: float = Field(description="Achieved / peak bandwidth.", examples=[0.8])
    activation_cache_share: float = Field(
        description="Share of activation traffic served on chip.", examples=[0.5]
    )
    host_link_efficiency: float = Field(description="Achieved / link.", examples=[0.73])
    kernel_launch_overhead_s: float = Field(
        description="Per launch, serial with the kernels [s].", examples=[4e-6]
    )
    request_overhead_s: float = Field(description="Per request [s].", examples=[4.2e-5])
    host_dispatch_s: float = Field(
        description="The serving framework's host time to issue one kernel, overlapped with "
        "the device's work: a phase's kernel time is max(device time, launches x "
        "host_dispatch_s) (0: the engine enqueues its kernels at once, as the MLPerf "
        "calibration's TensorRT does) [s].",
        examples=[0.0],
    )
    half_precision_scale: float = Field(
        description="x compute_efficiency for fp16 / bf16 math (capped at an efficiency of 1).",
        examples=[1.28],
    )
    basis: str = Field(
        description="How the values were derived (or that the request overrode them).",
        examples=["geometric mean of ... MLPerf ResNet-50 Offline INT8 rows"],
    )


class WorkloadSummary(Schema):
    """The model as evaluated."""

    model: str = Field(description="Model slug, or `inline`.", examples=["resnet-50"])
    decoder: bool = Field(
        description="Decoder LLM: prefill + per-token decode phases.", examples=[False]
    )
    params: int = Field(description="Parameters.", examples=[25_557_032])
    bindings: dict[str, int] = Field(
        description="Symbolic dims at batch 1 (decoders: the prefill).",
        examples=[{"batch": 1, "image": 224}],
    )
    flops_per_inference: float = Field(
        description="FLOPs per inference at batch 1 (decoders: per sequence).", examples=[8.24e9]
    )
    prompt_tokens: int | None = Field(
        default=None, description="Decoders: maximum prompt length.", examples=[None]
    )
    generated_tokens: int | None = Field(
        default=None, description="Decoders: maximum tokens generated.", examples=[None]
    )
    prompt_tokens_mean: int | None = Field(
        default=None, description="Decoders: mean prompt length.", examples=[None]
    )
    generated_tokens_mean: int | None = Field(
        default=None, description="Decoders: mean tokens generated.", examples=[None]
    )
    batching: Batching | None = Field(
        default=None, description="Decoders: static or continuous.", examples=[None]
    )
    beam_width: int | None = Field(
        default=None, description="Decoders: beams per request.", examples=[None]
    )
    kv_block_tokens: int | None = Field(
        default=None,
        description="Decoders, continuous batching: tokens per KV block.",
        examples=[None],
    )
    beams_share_prompt: bool | None = Field(
        default=None,
        description="Decoders, continuous batching: whether the beams share the prompt's KV "
        "cache (false: every beam holds and reads its own copy).",
        examples=[None],
    )
    batch_sizes: list[int] = Field(description="Batch sizes tried.", examples=[[1, 2, 4]])
    attention: list[str] = Field(
        description="Attention implementation(s) the latency and memory figures assume, with "
        "why (PyTorch SDPA's choice; empty without attention).",
        examples=[[]],
    )
    defaults_used: list[DefaultUsedRow] = Field(
        description="Every option the request left out and the value it got.",
        examples=[[{"option": "image_size", "value": "224", "reason": "the model's default"}]],
    )


class InferenceRecommendationResponse(Schema):
    """A ranked list of candidates with a recommendation in plain words."""

    recommendation: str = Field(
        description="One paragraph: what to run, why, and what the alternative costs.",
        examples=["Run resnet-50 on Xeon Platinum 8480+ at int8, batch 4: ..."],
    )
    objective: Objective = Field(description="What was minimised.", examples=["cost"])
    scenario: Scenario = Field(
        description="offline, server or single_stream.", examples=["offline"]
    )
    serving_runtime: ServingRuntime = Field(
        description="The runtime profile applied to accelerators.", examples=["tensorrt"]
    )
    latency_slo_ms: float | None = Field(
        default=None, description="The SLO applied [ms].", examples=[20.0]
    )
    slo_margin: float | None = Field(
        default=None,
        description="Headroom kept under the SLO (null without an SLO).",
        examples=[0.1],
    )
    latency_budget_ms: float | None = Field(
        default=None,
        description="latency_slo_ms x (1 - slo_margin): the latency a candidate must stay at "
        "or under [ms].",
        examples=[18.0],
    )
    price_kind: PriceKind = Field(
        description="The kind of price costs were computed and ranked by.", examples=["on_demand"]
    )
    throughput_target_per_s: float | None = Field(
        default=None, description="The target applied.", examples=[1000.0]
    )
    workload: WorkloadSummary = Field(
        description="The model, its shapes and the batch sizes that were evaluated."
    )
    candidates: list[RankedCandidate] = Field(description="Best first, `limit` of them.")
    total_candidates: int = Field(
        description="Device/precision pairs evaluated (before `limit`).", examples=[412]
    )
    eligible_candidates: int = Field(description="Of those, eligible.", examples=[96])
    excluded: list[Exclusion] = Field(description="Pairs not evaluated, with the reason.")
    calibration: dict[CalibrationClass, CalibrationRead] = Field(
        description="Efficiencies and overheads per calibration class, as used: gpu_ampere, "
        "gpu_hopper, gpu (every other GPU), cpu (a CPU's vector units), cpu_amx (a CPU's Intel "
        "AMX tiles), edge, tpu.",
        examples=[
            {
                "cpu": {
                    "compute_efficiency": 0.63,
                    "memory_efficiency": 0.7,
                    "activation_cache_share": 0.4,
                    "host_link_efficiency": 0.73,
                    "kernel_launch_overhead_s": 2e-6,
                    "request_overhead_s": 4.24e-5,
                    "basis": "CPUs without AMX (AVX-512 VNNI, AVX2, AMD EPYC, Arm): ...",
                },
                "cpu_amx": {
                    "compute_efficiency": 0.4,
                    "memory_efficiency": 0.7,
                    "activation_cache_share": 0.85,
                    "host_link_efficiency": 0.73,
                    "kernel_launch_overhead_s": 2e-6,
                    "request_overhead_s": 4.24e-5,
                    "basis": "CPUs with AMX tiles (Xeon 8480+, 8592+, 6980P): ...",
                },
            }
        ],
    )
    formulas: list[str] = Field(
        description="The formulas behind every figure.",
        examples=[["t_kernel = max(F / P_eff, B / BW_eff) + t_launch"]],
    )
    assumptions: list[str] = Field(
        description="Conventions behind the figures.", examples=[["bytes moved = ..."]]
    )
