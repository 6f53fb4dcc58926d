"""What a recommendation request asks: the model, the scenario and its service-level
objective, the candidates, precisions and prices, and calibration overrides.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, StringConstraints, model_validator

from app.domain.hardware import MIN_EFFICIENCY, PriceKind
from app.domain.performance.calibration import (
    GPU_HALF_PRECISION_SCALE,
    MAX_PRECISION_SCALE,
    CalibrationClass,
)
from app.domain.performance.decoding import DEFAULT_KV_BLOCK_TOKENS, MAX_BEAM_WIDTH, Batching
from app.domain.performance.pipeline import ParallelStrategy
from app.domain.performance.recommend import (
    DEFAULT_SLO_MARGIN_FRACTION,
    MAX_SLO_MARGIN_FRACTION,
    Objective,
    Scenario,
)
from app.domain.performance.request_lengths import LengthKind
from app.domain.performance.runtimes import DEFAULT_RUNTIME, ServingRuntime
from app.domain.precision import Precision
from app.schemas.base import Schema, Slug, located_error
from app.schemas.engine_options import EngineOptions
from app.schemas.estimates import (
    BatchSize,
    InlineArchitecture,
    Length,
    one_model_rule,
)
from app.schemas.recommendations.lengths import LengthDistributionSpec

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
    ttft_p99_ms: float | None = Field(
        default=None,
        gt=0,
        le=3.6e6,
        allow_inf_nan=False,
        description="Decoder serving under scenario server: bound on the 99th-percentile time "
        "to first token (arrival to the end of the iteration that completes the prompt's "
        "prefill, queueing included) [ms]. With tpot_p99_ms (both or neither) and batching "
        "continuous (or serving_runtime vllm), it replaces latency_slo_ms: each candidate is "
        "an LLM server simulated under Poisson arrivals with continuous batching (every "
        "iteration one decode step of each sequence in flight plus the prompt tokens of new "
        "ones, within max_num_batched_tokens; at most as many sequences in flight as its KV "
        "pool holds), and its throughput is the largest arrival rate whose simulated TTFT and "
        "TPOT p99s stay within the bounds over twice the simulated arrivals, moving by less "
        "than 5 % when they are doubled. MLPerf's Llama-2-70B Server bounds: 2000 ms / 200 "
        "ms.",
        examples=[None],
    )
    tpot_p99_ms: float | None = Field(
        default=None,
        gt=0,
        le=3.6e6,
        allow_inf_nan=False,
        description="Decoder serving under scenario server: bound on the 99th-percentile time "
        "per output token after the first (last token's time - first token's, over the "
        "tokens in between) [ms]. With ttft_p99_ms.",
        examples=[None],
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        le=16_777_216,
        description="With ttft_p99_ms / tpot_p99_ms: tokens per engine iteration (vLLM "
        "`--max-num-batched-tokens`: decode tokens first, then prompt chunks). Default: "
        "vLLM 0.19's, 8192 on a GPU of >= 70 GiB, else 2048.",
        examples=[None],
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="With ttft_p99_ms / tpot_p99_ms: sequences the server keeps in flight at "
        "most (vLLM `--max-num-seqs`); the KV pool may allow fewer (each request holds its "
        "whole context's blocks at the maximum lengths). Default: vLLM 0.19's, 1024 on a GPU "
        "of >= 70 GiB, else 256.",
        examples=[None],
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
    prompt_length_distribution: LengthDistributionSpec | None = Field(
        default=None,
        description="Decoder serving under ttft_p99_ms / tpot_p99_ms: how prompt lengths are "
        "spread. Each simulated request draws its own prompt (fixed, uniform, lognormal or a "
        "histogram: see its kind), is prefilled for that many tokens and is admitted into the "
        "KV pool with its own blocks (prompt + output, rounded up to kv_block_tokens), so the "
        "long prompts set the TTFT p99 and the mix of lengths the concurrency. "
        "prompt_tokens stays the longest prompt (every length at most that; memory is sized "
        "for it); the mean request the roofline times and the memory fit counts is the "
        "distribution's mean (leave prompt_tokens_mean out). Drawn by stratified sampling "
        "from a fixed seed: the same request gives the same answer. Default: fixed (every "
        "prompt at prompt_tokens_mean, else prompt_tokens).",
        examples=[{"kind": "lognormal", "mean_tokens": 512, "p99_tokens": 2048}],
    )
    generated_length_distribution: LengthDistributionSpec | None = Field(
        default=None,
        description="Decoder serving under ttft_p99_ms / tpot_p99_ms: how output lengths "
        "(the first token included) are spread, drawn independently of the prompt's; as "
        "prompt_length_distribution, with generated_tokens the longest output "
        "(max_tokens) and generated_tokens_mean left out. Default: fixed.",
        examples=[{"kind": "uniform", "min_tokens": 16, "max_tokens": 256}],
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
    tensor_parallel_size: Literal[2, 4, 8] | None = Field(
        default=None,
        description="Also offer every whole GPU (not a MIG slice) as a tensor-parallel group of "
        "exactly this many GPUs (2, 4 or 8), whether or not one GPU holds the model (a "
        "shorter latency, or a larger KV pool per replica); a group whose per-GPU peak does "
        "not fit, or whose heads do not split over it, is excluded with the reason. Default: "
        "only the groups tensor_parallel_max allows, for GPUs batch 1 does not fit.",
        examples=[None],
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
        token_bounds = {"ttft_p99_ms": self.ttft_p99_ms, "tpot_p99_ms": self.tpot_p99_ms}
        given_bounds = [k for k, v in token_bounds.items() if v is not None]
        if len(given_bounds) == 1:
            other = next(k for k in token_bounds if k not in given_bounds)
            raise located_error(
                name,
                (other,),
                f"{given_bounds[0]} and {other} bound decoder serving together: set both",
            )
        if given_bounds:
            if self.scenario is not Scenario.SERVER:
                raise located_error(
                    name,
                    ("scenario",),
                    "ttft_p99_ms and tpot_p99_ms are bounds of scenario server (Poisson "
                    "arrivals): set scenario server",
                )
            if self.batching is not Batching.CONTINUOUS and self.serving_runtime is not (
                ServingRuntime.VLLM
            ):
                raise located_error(
                    name,
                    ("batching",),
                    "ttft_p99_ms and tpot_p99_ms are simulated for continuous batching (an LLM "
                    "server such as vLLM): set batching continuous",
                )
            if self.beam_width != 1:
                raise located_error(
                    name,
                    ("beam_width",),
                    "ttft_p99_ms and tpot_p99_ms are simulated for one sequence per request: "
                    "beam_width must be 1",
                )
        else:
            for engine_option in ("max_num_batched_tokens", "max_num_seqs"):
                if engine_option in self.model_fields_set:
                    raise located_error(
                        name,
                        (engine_option,),
                        f"{engine_option} sizes the LLM server simulated under ttft_p99_ms / "
                        "tpot_p99_ms: set those too",
                    )
        if self.scenario is Scenario.SERVER and self.latency_slo_ms is None and not given_bounds:
            raise located_error(
                name,
                ("latency_slo_ms",),
                "scenario server needs latency_slo_ms (its p99 latency bound), or ttft_p99_ms "
                "and tpot_p99_ms for a decoder under continuous batching",
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
        self._length_distributions(name, given_bounds)
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

    def _length_distributions(self, name: str, given_bounds: list[str]) -> None:
        """Length distributions: simulated under TTFT / TPOT bounds only, instead of a mean,
        every length within the maxima (and max_model_len)."""
        sides = (
            ("prompt_length_distribution", "prompt_tokens_mean", "prompt_tokens"),
            ("generated_length_distribution", "generated_tokens_mean", "generated_tokens"),
        )
        longest = 0
        for field, mean, maximum in sides:
            spec: LengthDistributionSpec | None = getattr(self, field)
            if spec is None:
                longest += getattr(self, maximum)
                continue
            if not given_bounds:
                raise located_error(
                    name,
                    (field,),
                    f"{field} is drawn by the LLM server simulated under ttft_p99_ms / "
                    "tpot_p99_ms: set those too",
                )
            if spec.kind is not LengthKind.FIXED and getattr(self, mean) is not None:
                raise located_error(
                    name,
                    (mean,),
                    f"{field} ({spec.kind.value}) gives the mean length: leave {mean} out",
                )
            limit = getattr(self, maximum)
            found = spec.beyond(limit)
            if found is not None:
                where, what = found
                raise located_error(
                    name,
                    (field, *where),
                    f"{what} exceeds {maximum} {limit}, the longest request served (raise "
                    f"{maximum}: memory is sized for it)",
                )
            longest += spec.longest_tokens(limit)
        engine = self.engine
        if engine is not None and engine.max_model_len is not None:
            for field, _, _ in sides:
                if getattr(self, field) is not None and longest > engine.max_model_len:
                    raise located_error(
                        name,
                        (field,),
                        f"the longest request drawn ({longest} tokens, prompt + output) "
                        f"exceeds engine.max_model_len {engine.max_model_len}",
                    )
