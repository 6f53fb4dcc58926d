"""What a recommendation answers: the ranked candidates, the exclusions, the calibration
used and the workload it was computed for.
"""

from __future__ import annotations

from pydantic import Field

from app.domain.hardware import DeviceKind, PriceKind
from app.domain.performance.calibration import (
    CalibrationClass,
)
from app.domain.performance.decoding import Batching
from app.domain.performance.prediction import Bound
from app.domain.performance.recommend import (
    Objective,
    Scenario,
)
from app.domain.performance.runtimes import ServingRuntime
from app.domain.precision import Precision
from app.schemas.base import Schema
from app.schemas.estimates import (
    DefaultUsedRow,
)
from app.schemas.recommendations.prediction import (
    DecoderServingRead,
    LlmServerRead,
    PhaseRead,
    PipelineRead,
    RooflineInputs,
    ServerScenarioRead,
    TimeShares,
)


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
    llm_server: LlmServerRead | None = Field(
        default=None,
        description="scenario server with ttft_p99_ms / tpot_p99_ms: the continuous-batching "
        "server behind throughput_per_s (its rate) and latency_ms (its TTFT p99); null "
        "otherwise, or when the candidate was not simulated (its reasons say why).",
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
