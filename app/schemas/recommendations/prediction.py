"""How one candidate's figures were computed: the roofline inputs, the phases of a
request, decoder serving, pipeline stages, time shares and the server-scenario queue.
"""

from __future__ import annotations

from datetime import date

from pydantic import Field

from app.domain.hardware import PriceKind
from app.domain.performance.calibration import (
    CalibrationClass,
)
from app.domain.performance.decoding import Batching
from app.schemas.base import Schema
from app.schemas.recommendations.lengths import LengthsSimulatedRead


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
    """The server scenario's queue for one candidate: what was simulated and what came out.

    The rate is stable: its p99 over ``requests_simulated`` arrivals and over twice as many
    (the same arrival stream, extended) both stay within the bound and differ by less than 5 %
    (issue 31 point 4). Where the first run length does not settle, the run is doubled (up to
    131,072 arrivals) before the rate is lowered."""

    arrival_rate_per_s: float = Field(
        description="Largest Poisson arrival rate whose simulated p99 latency stays within the "
        "budget over requests_simulated arrivals and over twice as many, and moves by less "
        "than 5 % between the two: the candidate's throughput [1/s].",
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
        description="Arrivals simulated for the answer's p99 (the first 10 % left out).",
        examples=[4000],
    )
    p99_doubled_ms: float = Field(
        description="p99 at the same rate over twice the arrivals (the same stream, extended; "
        "the first 10 % left out) [ms].",
        examples=[9.5],
    )
    p99_drift: float = Field(
        description="Relative move of the p99 when the simulated arrivals are doubled "
        "(below 0.05 when stable).",
        examples=[0.02],
    )
    stable: bool = Field(
        description="Both runs met the bound and the p99 moved by less than 5 %; false only "
        "when no rate down to 1/1000 of the first one found settles (the rate is then "
        "optimistic and the candidate ineligible).",
        examples=[True],
    )
    lowered_for_stability: bool = Field(
        description="The rate is below the highest whose first run met the bound: that rate's "
        "p99 moved by 5 % or more (or missed the bound) over twice the arrivals.",
        examples=[False],
    )
    note: str = Field(description="The same in one line.", examples=["server scenario: ..."])


class LlmServerRead(Schema):
    """Decoder serving under TTFT / TPOT p99 bounds for one candidate: the continuous-batching
    server that was simulated and what came out (app.domain.performance.llm_server)."""

    arrival_rate_per_s: float = Field(
        description="Largest Poisson arrival rate whose simulated TTFT and TPOT p99s stay "
        "within the bounds: the candidate's throughput per replica [requests/s].",
        examples=[12.5],
    )
    ttft_p99_ms: float = Field(
        description="Simulated TTFT p99 at that rate [ms].", examples=[140.0]
    )
    tpot_p99_ms: float = Field(description="Simulated TPOT p99 at that rate [ms].", examples=[31.0])
    ttft_p99_bound_ms: float = Field(
        description="The request's TTFT bound [ms].", examples=[2000.0]
    )
    tpot_p99_bound_ms: float = Field(description="The request's TPOT bound [ms].", examples=[200.0])
    max_num_seqs: int = Field(
        description="Sequences in flight at most: the largest concurrency whose paged KV cache "
        "fits beside the weights (at the request's maximum lengths).",
        examples=[64],
    )
    max_num_batched_tokens: int = Field(
        description="Tokens per engine iteration (request's, or vLLM's default).", examples=[2048]
    )
    mean_sequences_in_flight: float = Field(
        description="Sequences in flight at that rate, time-weighted.", examples=[31.6]
    )
    capacity_per_s: float = Field(
        description="Back-to-back requests per second at max_num_seqs in flight (the rate's "
        "ceiling) [requests/s].",
        examples=[14.2],
    )
    requests_simulated: int = Field(
        description="Arrivals simulated for the answer's p99s (the first 10 % left out).",
        examples=[2000],
    )
    ttft_p99_doubled_ms: float = Field(
        description="TTFT p99 at the same rate over twice the arrivals [ms].", examples=[142.0]
    )
    tpot_p99_doubled_ms: float = Field(
        description="TPOT p99 at the same rate over twice the arrivals [ms].", examples=[31.2]
    )
    p99_drift: float = Field(
        description="Largest relative move of a p99 when the simulated arrivals are doubled "
        "(below 0.05 when stable).",
        examples=[0.02],
    )
    stable: bool = Field(
        description="The doubled run met both bounds and moved each p99 by less than 5 %.",
        examples=[True],
    )
    limited_by: str = Field(
        description="What stops a higher rate: ttft, tpot, capacity (the rate ceiling) or "
        "stability (the doubled run moved a p99 by 5 % or more, or missed a bound).",
        examples=["tpot"],
    )
    lengths: LengthsSimulatedRead | None = Field(
        default=None,
        description="With prompt_length_distribution / generated_length_distribution: the "
        "distributions, the lengths the simulated requests drew (mean, p99, longest), the KV "
        "pool they were admitted into with their own blocks and the sequence cap. Absent: "
        "every request at the mean lengths.",
    )
    note: str = Field(description="The same in one line.", examples=["LLM server ..."])
