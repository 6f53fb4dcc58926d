"""The recommendation search: every candidate at every batch size that fits, assessed, and
the best batch (or the server scenario's rate) of each candidate ranked (pure).

Batch sizes are the powers of two up to the request's maximum (or its own list; batch 1 under
single stream). Under continuous batching a decoder is tried at the powers of two below the
most concurrent requests whose paged KV cache fits (:func:`largest_fitting`) and at that
number itself. Memory grows with the batch: once a batch overfills a candidate, its larger
batches are not tried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from app.domain.budget import checkpoint
from app.domain.engines.vllm import VLLM_0_19
from app.domain.performance.calibration import Calibration, CalibrationClass, calibration_class
from app.domain.performance.candidates import Runnable, WorkloadSource
from app.domain.performance.explanation import compared_index
from app.domain.performance.phases import PhasedRequest
from app.domain.performance.pipeline import micro_batching, predict_pipeline
from app.domain.performance.prediction import Prediction
from app.domain.performance.recommend import (
    Assessment,
    LlmPlan,
    MemoryFit,
    Objective,
    OptionRow,
    RecommendationInputError,
    Requirements,
    Scenario,
    assess,
    assess_llm_server,
    assess_server,
    best_batch,
    best_option,
    llm_objective_floor,
    llm_plan,
    objective_key,
    option_row,
    rank,
    server_objective_floor,
    sort_key,
    with_reason,
)
from app.domain.performance.roofline import predict, predict_seconds
from app.domain.performance.runtimes import decode_host_seconds, with_decode_host_overhead


def batch_sizes(scenario: Scenario, given: Sequence[int] | None, max_batch_size: int) -> list[int]:
    """The batch sizes to try: 1 under single stream, the request's own list (sorted, each
    once), else the powers of two up to ``max_batch_size``."""
    if scenario is Scenario.SINGLE_STREAM:
        return [1]  # the request's validation allows no other batch
    if given is not None:
        return sorted(set(given))
    batches = [1]
    while batches[-1] * 2 <= max_batch_size:
        batches.append(batches[-1] * 2)
    return batches


def largest_fitting(limit: int, fits: Callable[[int], bool]) -> int:
    """The largest ``n`` in ``[0, limit]`` with ``fits(n)`` (0 when none), for a ``fits``
    that stays false once it turns false (memory grows with the requests): a bisection."""
    low, high = 0, limit
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def decoder_batch_sizes(
    source: WorkloadSource,
    batches: list[int],
    runnable: Runnable,
    *,
    sizes_given: bool,
    scenario: Scenario,
    max_batch_size: int,
) -> list[int]:
    """Continuous batching and no explicit batch_sizes: the powers of two below the most
    concurrent requests that fit, and that number itself (the engine keeps it going); one
    request in flight under scenario single_stream."""
    candidate, scheme = runnable
    if (
        not (source.decoder and source.plan.continuous)
        or sizes_given
        or scenario is Scenario.SINGLE_STREAM
    ):
        return batches
    most = source.max_concurrent_requests(scheme, candidate, max_batch_size)
    if most < 1:
        return batches[:1]  # does not fit: shown at batch 1 with the reason
    return sorted({b for b in batches if b <= most} | {most})


def in_scenario(prediction: Prediction, scenario: Scenario) -> Prediction:
    """Under scenario single_stream the next query waits for the answer: nothing overlaps,
    so a request comes every latency (offline and server keep the overlapped interval)."""
    if scenario is not Scenario.SINGLE_STREAM:
        return prediction
    return replace(prediction, interval_s=prediction.latency_s)


def search(
    source: WorkloadSource,
    runnable: Sequence[Runnable],
    *,
    batches: list[int],
    calibrations: Mapping[CalibrationClass, Calibration],
    requirements: Requirements,
    scenario: Scenario,
    objective: Objective,
    host_step_s: float,
    sizes_given: bool,
    max_batch_size: int,
    shown: int | None = None,
) -> list[Assessment]:
    """Every candidate assessed at each batch size that fits it, its best batch (server: the
    rate its simulated p99 allows) shown, ranked by ``objective``.

    With ``shown`` (offline and single stream), only the first ``shown`` ranked answers and the
    one :func:`~app.domain.performance.explanation.explain` compares the best with carry the
    memory engine's requirement when they do not fit; the others' ``memory`` may be the floor
    of ``source.floor_fit`` (``exact`` False) where that floor alone overfills: whether an
    answer fits is all its rank depends on, and the estimate is the costly part.

    Parameters
    ----------
    source : the model's memory fits and phased requests
    runnable : candidates and precisions, in the order ties keep
    batches : batch sizes to try (:func:`batch_sizes`) [-]
    calibrations : efficiencies and overheads per class, under the serving runtime
    requirements : SLO, throughput target, price kind
    scenario : offline, server or single stream
    objective : what the ranking minimises
    host_step_s : the runtime's host work per sequence per decode step [s]
    sizes_given : the request listed its batch sizes (no concurrency search)
    max_batch_size : the largest batch the concurrency search may try [-]
    shown : answers the caller shows with their memory figures (None: every one) [-]
    """
    options: dict[tuple[str, str], list[Assessment]] = {}
    # Candidates a smaller batch already overfilled: memory grows with the batch, so larger
    # batches do not fit either, and best_batch never shows one (a device on which nothing
    # fits shows its smallest batch). Multi-GPU groups keep no option that does not fit.
    outgrown: set[tuple[str, str]] = set()
    plans = [
        (batch, index)
        for index, (candidate, scheme) in enumerate(runnable)
        for batch in decoder_batch_sizes(
            source,
            batches,
            (candidate, scheme),
            sizes_given=sizes_given,
            scenario=scenario,
            max_batch_size=(
                max_num_seqs(candidate.device.memory_bytes, requirements)
                if scenario is Scenario.SERVER and requirements.token_bounds
                else max_batch_size
            ),
        )
    ]
    plans.sort(key=lambda item: item[0])  # stable: candidates keep their order per batch
    # What does not depend on the batch, found once per candidate: its key and calibration
    keys = [(c.device.slug, s.precision.value) for c, s in runnable]
    cals = [calibrations[calibration_class(c.device, s)] for c, s in runnable]
    # The request at each batch and precision (tensor-parallel: and degree), looked up once
    workloads: dict[tuple[int, str, int], PhasedRequest] = {}
    floor_only = shown is not None and scenario is not Scenario.SERVER
    judged: dict[int, tuple[int, int]] = {}  # id(assessment on a floor) -> (index, batch)
    # Offline and single stream show each candidate's best batch only: the others are judged
    # on their figures (option_row) and the shown one's prediction is built after the loop
    rows: dict[tuple[str, str], list[tuple[OptionRow, _Deferred | Assessment]]] = {}
    deferred = scenario is not Scenario.SERVER
    for batch, index in plans:
        checkpoint()  # each plan predicts every layer: stop here past the deadline
        candidate, scheme = runnable[index]
        device = candidate.device
        key = keys[index]
        if key in outgrown:
            continue
        if candidate.gpus > 1 and source.overfills(batch, scheme, candidate):
            outgrown.add(key)  # a group that does not fit is not offered: no estimate needed
            continue
        # A floor is worth its cost where a device's first batch may overfill it
        fit = (
            source.floor_fit(batch, scheme, candidate)
            if floor_only and key not in options
            else None
        )
        if fit is None:
            fit = source.memory_fit(batch, scheme, candidate)
        if not fit.fits:
            outgrown.add(key)
            if candidate.gpus > 1:
                continue
        if candidate.pipeline_parallel > 1:
            micro, size = micro_batching(batch, candidate.pipeline_parallel)
            stages = source.staged(
                size, scheme, candidate.pipeline_parallel, candidate.tensor_parallel
            )
            prediction = predict_pipeline(
                stages,
                device,
                cals[index],
                batch=batch,
                micro_batches=micro,
            )
            prediction = in_scenario(with_decode_host_overhead(prediction, host_step_s), scenario)
            answer = assess(prediction, fit, requirements)
            options.setdefault(key, []).append(answer)
            if deferred:
                rows.setdefault(key, []).append((row_of(answer, objective), answer))
            continue
        which = (batch, key[1], candidate.tensor_parallel)
        workload = workloads.get(which)
        if workload is None:
            if candidate.tensor_parallel > 1:
                workload = source.sharded(batch, scheme, candidate.tensor_parallel)
            else:
                workload = source.workload(batch, scheme)
            workloads[which] = workload
        if deferred:
            options.setdefault(key, [])
            row = _option_row(
                workload, runnable[index], cals[index], fit, host_step_s, scenario, requirements
            )
            rows.setdefault(key, []).append((row, (index, batch, workload, fit)))
            continue
        prediction = predict(workload, device, cals[index])
        prediction = in_scenario(with_decode_host_overhead(prediction, host_step_s), scenario)
        answer = assess(prediction, fit, requirements)
        options.setdefault(key, []).append(answer)
        if not fit.exact:
            judged[id(answer)] = (index, batch)
    if scenario is Scenario.SERVER and requirements.token_bounds:
        shown_answers = llm_server_assessments(source, list(options.values()), requirements)
    elif scenario is Scenario.SERVER:
        shown_answers = server_assessments(list(options.values()), requirements)
    else:
        chosen = []
        for quoted in rows.values():
            _, option = quoted[best_option([row for row, _ in quoted])]
            if isinstance(option, Assessment):
                chosen.append(option)
                continue
            index, batch, workload, fit = option
            prediction = predict(workload, runnable[index][0].device, cals[index])
            prediction = in_scenario(with_decode_host_overhead(prediction, host_step_s), scenario)
            answer = assess(prediction, fit, requirements)
            if not fit.exact:
                judged[id(answer)] = (index, batch)
            chosen.append(answer)
        ranked = rank(chosen, objective)
        if shown is None:
            return ranked
        return _with_estimates(source, runnable, ranked, judged, shown, requirements)
    return rank(shown_answers, objective)


# A candidate's option whose prediction is built only if it is the one shown: (index in
# runnable, batch, its phased request, its memory fit)
_Deferred = tuple[int, int, PhasedRequest, MemoryFit]


def _option_row(
    workload: PhasedRequest,
    runnable: Runnable,
    calibration: Calibration,
    fit: MemoryFit,
    host_step_s: float,
    scenario: Scenario,
    requirements: Requirements,
) -> OptionRow:
    """The row of ``assess(in_scenario(with_decode_host_overhead(predict(...))))`` (the
    search's assessment of one option) from the prediction's times alone
    (:func:`~app.domain.performance.roofline.predict_seconds`): the same figures."""
    candidate, scheme = runnable
    precision = scheme.precision.value
    device = candidate.device
    latency, interval, _, _ = predict_seconds(workload, device, calibration)
    if workload.decoder and host_step_s > 0.0:  # with_decode_host_overhead
        added = decode_host_seconds(
            workload.decoder,
            device.kind,
            workload.batch,
            sum(phase.repeats for phase in workload.phases),
            host_step_s,
        )
        if added is not None:
            latency, interval = latency + added[1], interval + added[1]
    if scenario is Scenario.SINGLE_STREAM:  # in_scenario
        interval = latency
    return option_row(device, precision, workload.batch, latency, interval, fit.fits, requirements)


def row_of(item: Assessment, objective: Objective) -> OptionRow:
    """An assessment's row (:func:`~app.domain.performance.recommend.best_option`)."""
    p = item.prediction
    return (sort_key(item, objective), item.eligible, item.memory.fits, p.latency_s, p.batch)


def _with_estimates(
    source: WorkloadSource,
    runnable: Sequence[Runnable],
    ranked: list[Assessment],
    judged: Mapping[int, tuple[int, int]],
    shown: int,
    requirements: Requirements,
) -> list[Assessment]:
    """``ranked`` with the answers a response shows (the first ``shown`` and the one the
    paragraph compares the best with) assessed again on the memory engine's requirement where
    they were judged on a floor: the verdict, and so the rank, stay."""
    compared = compared_index(ranked)
    for position in {*range(min(shown, len(ranked))), *([] if compared is None else [compared])}:
        answer = ranked[position]
        where = judged.get(id(answer))
        if where is None:
            continue
        candidate, scheme = runnable[where[0]]
        fit = source.memory_fit(where[1], scheme, candidate)
        ranked[position] = assess(answer.prediction, fit, requirements)
    return ranked


def max_num_seqs(gpu_memory_bytes: int, requirements: Requirements) -> int:
    """Sequences an LLM server keeps in flight at most, before the KV pool's limit: the
    request's, else vLLM 0.19's default for the GPU's memory (1,024 on a GPU of >= 70 GiB,
    else 256: app.domain.engines.vllm.VLLM_0_19; a group's device carries one GPU's memory)."""
    if requirements.max_num_seqs is not None:
        return requirements.max_num_seqs
    large = gpu_memory_bytes >= VLLM_0_19.large_gpu_bytes
    return VLLM_0_19.default_max_num_seqs[0 if large else 1]


def max_batched_tokens(option: Assessment, requirements: Requirements) -> int:
    """Tokens per engine iteration: the request's, else vLLM 0.19's default for the GPU's
    memory (8,192 on a GPU of >= 70 GiB, else 2,048: ``EngineArgs`` for ``vllm serve``;
    app.domain.engines.vllm.VLLM_0_19)."""
    if requirements.max_batched_tokens is not None:
        return requirements.max_batched_tokens
    # A group's device carries one GPU's memory (candidates.tensor_parallel_group).
    large = option.prediction.device.memory_bytes >= VLLM_0_19.large_gpu_bytes
    return VLLM_0_19.default_max_num_batched_tokens[0 if large else 1]


# Candidates simulated in full under TTFT / TPOT bounds before the rest may be pruned: a
# candidate whose objective floor is above the LLM_TOP-th best simulated one cannot rank above
# it (a policy: each simulation costs ~0.1 s of CPU).
LLM_TOP = 8


def llm_server_assessments(
    source: WorkloadSource, groups: list[list[Assessment]], requirements: Requirements
) -> list[Assessment]:
    """Decoder serving under TTFT / TPOT p99 bounds for every device and precision.

    Candidates are simulated in the order of their objective floor
    (:func:`app.domain.performance.recommend.llm_objective_floor`: the objective at the rate
    ceiling); once ``LLM_TOP`` eligible answers are in and the next floor is above the
    ``LLM_TOP``-th best answer, the rest are shown at their widest fitting concurrency,
    ineligible, with the floor that ruled them out (they cannot rank above those answers).
    """
    if not (source.decoder and source.plan.continuous):
        raise RecommendationInputError(
            "ttft_p99 and tpot_p99 bounds need a decoder served with continuous batching"
        )
    plan_of = source.plan
    if plan_of.beam_width != 1:
        raise RecommendationInputError(
            "ttft_p99 and tpot_p99 bounds are simulated for one sequence per request "
            f"(beam width 1), got {plan_of.beam_width}"
        )
    shown: list[Assessment] = []
    queued: list[tuple[float, int, LlmPlan]] = []
    for found in groups:
        plan = llm_plan(
            found,
            prompt_tokens=plan_of.prompt_tokens_mean,
            generated_tokens=plan_of.generated_tokens_mean,
            max_batched_tokens=max_batched_tokens(found[0], requirements),
            lengths=requirements.request_lengths,
            kv_block_tokens=plan_of.kv_block_tokens,
            max_num_seqs=max_num_seqs(found[0].prediction.device.memory_bytes, requirements),
        )
        if plan is None:
            shown.append(best_batch(found, requirements.objective))
        else:
            queued.append((llm_objective_floor(plan, requirements), len(queued), plan))
    queued.sort(key=lambda item: (item[0], item[1]))
    best: list[float] = []  # first objective keys of the eligible answers, ascending
    for floor, _, plan in queued:
        if len(best) >= LLM_TOP and floor > best[LLM_TOP - 1]:
            shown.append(
                with_reason(
                    plan.widest,
                    f"not simulated: even at its rate ceiling its {requirements.objective.value} "
                    f"({floor:.4g}) is above the {LLM_TOP} best simulated candidates'",
                )
            )
            continue
        checkpoint()  # a simulated LLM server per device and precision
        answer = assess_llm_server(plan, requirements)
        shown.append(answer)
        if answer.eligible:
            best.append(objective_key(answer, requirements.objective)[0])
            best.sort()
    return shown


# Candidates whose queue is simulated in full under a p99 bound before the rest may be pruned:
# a candidate whose objective floor is above the SERVER_TOP-th best simulated one cannot rank
# above it. A policy: a stable queue costs ~30 ms of CPU (~270 in a whole catalog: 8-19 s,
# benchmarks/server_stability.py), and a response lists 10 candidates unless asked for more.
SERVER_TOP = 10


def server_assessments(
    groups: list[list[Assessment]], requirements: Requirements
) -> list[Assessment]:
    """The server scenario (dynamic batching under a p99 bound) for every device and precision.

    Candidates are simulated in the order of their objective floor
    (:func:`app.domain.performance.recommend.server_objective_floor`: the objective at the
    queue's rate ceiling); once ``SERVER_TOP`` eligible answers are in and the next floor is
    above the ``SERVER_TOP``-th best answer, the rest are shown at their offline figures,
    ineligible, with the floor that ruled them out (they cannot rank above those answers).
    Candidates the queue answers no rate for (nothing fits, a lone request misses the bound)
    are shown as :func:`assess_server` shows them.
    """
    shown: list[Assessment] = []
    queued: list[tuple[float, int, float, list[Assessment]]] = []
    for found in groups:
        at_ceiling = server_objective_floor(found, requirements)
        if at_ceiling is None:
            shown.append(assess_server(found, requirements))
        else:
            queued.append((at_ceiling[0], len(queued), at_ceiling[1], found))
    queued.sort(key=lambda item: (item[0], item[1]))
    best: list[float] = []  # first objective keys of the eligible answers, ascending
    objective = requirements.objective
    for floor, _, ceiling, found in queued:
        if len(best) >= SERVER_TOP and floor > best[SERVER_TOP - 1]:
            shown.append(
                with_reason(
                    best_batch(found, objective),
                    f"not simulated: even at its rate ceiling ({ceiling:.4g}/s) its "
                    f"{objective.value} ({floor:.4g}) is above the {SERVER_TOP} best simulated "
                    "candidates'; shown at its offline figures",
                )
            )
            continue
        checkpoint()  # a simulated queue per device and precision
        answer = assess_server(found, requirements)
        shown.append(answer)
        if answer.eligible:
            best.append(objective_key(answer, objective)[0])
            best.sort()
    return shown
