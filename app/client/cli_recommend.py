"""``capplan recommend``: the CPU-vs-GPU inference recommendation, its request from the
command line and its ranked table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from app.client.cli_output import (
    EXIT_OK,
    EXIT_VERDICT_NO,
    UsageError,
    _dump,
    _echo,
    table,
    wait_with_progress,
)
from app.client.cli_requests import CALIBRATION_CLASSES, CALIBRATION_FIELDS, _bindings
from app.client.transport import Json, JsonClient


def _prices(values: list[str]) -> dict[str, float]:
    prices: dict[str, float] = {}
    for value in values:
        slug, _, price = value.partition("=")
        try:
            prices[slug] = float(price)
        except ValueError:
            raise UsageError(f"--price {value!r}: expected SLUG=USD_PER_HOUR") from None
    return prices


def _calibration(values: list[str]) -> dict[str, dict[str, float]]:
    calibration: dict[str, dict[str, float]] = {}
    for value in values:
        key, _, number = value.partition("=")
        kind, _, field = key.partition(".")
        if kind not in CALIBRATION_CLASSES or field not in CALIBRATION_FIELDS:
            raise UsageError(
                f"--calibration {value!r}: expected KIND.FIELD=VALUE, KIND one of "
                f"{', '.join(CALIBRATION_CLASSES)}, FIELD one of {', '.join(CALIBRATION_FIELDS)}"
            )
        try:
            calibration.setdefault(kind, {})[field] = float(number)
        except ValueError:
            raise UsageError(f"--calibration {value!r}: {number!r} is not a number") from None
    return calibration


def _check_decoder_serving(args: argparse.Namespace) -> None:
    """The request's rules between decoder-serving flags, checked before anything is sent."""
    for mean, longest in (("prompt_tokens_mean", "prompt_tokens"),
                          ("generated_tokens_mean", "generated_tokens")):  # fmt: skip
        value, maximum = getattr(args, mean), getattr(args, longest)
        if value is not None and maximum is not None and value > maximum:
            raise UsageError(
                f"--{mean.replace('_', '-')} {value} exceeds --{longest.replace('_', '-')} "
                f"{maximum}, the maximum"
            )
    if args.kv_block_tokens is not None and args.batching != "continuous":
        raise UsageError(
            "--kv-block-tokens sizes the paged KV cache of --batching continuous; static "
            "batching reserves the whole padded context"
        )
    if args.beams_share_prompt is not None and args.batching != "continuous":
        raise UsageError(
            "--beams-copy-prompt is about the paged KV cache of --batching continuous; static "
            "batching gives every beam its own padded copy of the prompt"
        )


def _recommend_body(args: argparse.Namespace) -> Json:
    _check_decoder_serving(args)
    payload: Json = {"model": args.model, "objective": args.objective}
    for key, value in (
        ("batch_sizes", args.batch),
        ("max_batch_size", args.max_batch),
        ("precisions", args.precision),
        ("latency_slo_ms", args.slo_ms),
        ("slo_margin", args.slo_margin),
        ("scenario", args.scenario),
        ("serving_runtime", args.serving_runtime),
        ("tensor_parallel_max", args.tensor_parallel_max),
        ("parallelism", args.parallelism),
        ("pipeline_parallel_max", args.pipeline_parallel_max),
        ("price_kind", args.price_kind),
        ("throughput_target_per_s", args.target),
        ("devices", args.devices.split(",") if args.devices else None),
        ("sequence_length", args.seq),
        ("tokens_mean", args.tokens_mean),
        ("image_size", args.image),
        ("prompt_tokens", args.prompt_tokens),
        ("generated_tokens", args.generated_tokens),
        ("prompt_tokens_mean", args.prompt_tokens_mean),
        ("generated_tokens_mean", args.generated_tokens_mean),
        ("batching", args.batching),
        ("beam_width", args.beam_width),
        ("kv_block_tokens", args.kv_block_tokens),
        ("beams_share_prompt", args.beams_share_prompt),
        ("fuse_elementwise", args.fuse),
        ("limit", args.limit),
    ):
        if value is not None:
            payload[key] = value
    if args.bind:
        payload["bindings"] = _bindings(args.bind)
    if args.price:
        payload["prices_usd_per_hour"] = _prices(args.price)
    if args.calibration:
        payload["calibration"] = _calibration(args.calibration)
    return payload


def ranking_column(result: Json) -> tuple[str, str]:
    """The candidate field the server ranks by and its column header (recommend.py's
    ``_objective_key``: fleet $/h with a throughput target, else $/M; J; latency)."""
    objective = result["objective"]
    if objective == "cost":
        if result.get("throughput_target_per_s") is not None:
            return "fleet_cost_usd_per_hour", "fleet $/h"
        return "cost_usd_per_million", "$/M"
    if objective == "energy":
        return "energy_j_per_inference", "J/inf"
    return "latency_ms", "latency ms"


def cmd_recommend(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    payload = _recommend_body(args)
    result = wait_with_progress(
        "ranking devices", lambda: client.recommend_inference(payload), sys.stderr
    )
    candidates = result["candidates"]
    # a tensor-parallel group ("slug x4") is charted as the GPU it is made of
    chosen = list(dict.fromkeys(c["device"].split(" x")[0] for c in candidates[:4]))
    if args.svg and chosen:
        Path(args.svg).write_text(client.roofline_svg(args.model, chosen), encoding="utf-8")
    verdict = EXIT_OK if result["eligible_candidates"] else EXIT_VERDICT_NO
    if args.json:
        out.write(_dump(result) + "\n")
        return verdict
    out.write(result["recommendation"] + "\n\n")
    workload = result["workload"]
    out.write(_echo(workload["bindings"], workload["defaults_used"], workload["attention"]))
    serving = decoder_serving_line(workload)
    out.write((f"decoder serving: {serving}\n" if serving else "") + "\n")
    out.write(recommendation_table(result) + "\n")
    groups = pipeline_lines(result["candidates"])
    if groups:
        out.write("\npipeline groups (--json has every stage and phase):\n" + groups + "\n")
    out.write(
        f"\n{result['eligible_candidates']} of {result['total_candidates']} candidates eligible; "
        f"{len(result['excluded'])} device/precision pairs excluded (--json lists why)\n"
    )
    out.write(f"$/M: {result['price_kind']} prices only")
    budget, margin = result.get("latency_budget_ms"), result.get("slo_margin")
    if budget is not None and margin is not None:
        out.write(f"; SLO met at <= {budget:.4g} ms ({margin:.0%} margin)")
    out.write("\n")
    if args.svg:
        written = f"written to {args.svg}" if chosen else "not written: no candidates"
        out.write(f"roofline of the top devices {written}\n")
    return verdict


def decoder_serving_line(workload: Json) -> str | None:
    """How a decoder's requests are served, in one line (None for other models)."""
    if not workload.get("decoder") or workload.get("batching") is None:
        return None
    continuous = workload["batching"] == "continuous"
    parts = [f"{workload['batching']} batching"]
    for what in ("prompt", "generated"):
        mean, maximum = workload.get(f"{what}_tokens_mean"), workload.get(f"{what}_tokens")
        if mean is None or mean == maximum:
            parts.append(f"{what} {maximum} tokens")
        else:
            priced = "priced at the mean" if continuous else "padded to the maximum"
            parts.append(f"{what} mean {mean} / max {maximum} tokens ({priced})")
    beams = workload.get("beam_width") or 1
    if beams > 1:
        parts.append(f"beam search, {beams} beams per request")
    if continuous and workload.get("kv_block_tokens"):
        parts.append(f"paged KV cache in blocks of {workload['kv_block_tokens']} tokens")
    if continuous and beams > 1 and workload.get("beams_share_prompt") is not None:
        parts.append(
            "the beams share the prompt's KV cache"
            if workload["beams_share_prompt"]
            else "every beam holds its own copy of the prompt's KV cache"
        )
    return "; ".join(parts)


def pipeline_lines(candidates: list[Json]) -> str:
    """One line per pipeline-parallel candidate: stages, micro-batches, the link, and per
    phase the steady-state idle share and the GPipe bubble of a lone batch."""
    lines = []
    for c in candidates:
        pipeline = c.get("pipeline")
        if not pipeline:
            continue
        sizes = [stage["blocks"] for stage in pipeline["stage_layout"]]
        blocks = (
            f"{sizes[0]} blocks each"
            if len(set(sizes)) == 1
            else ("+".join(map(str, sizes)) + " blocks")
        )
        idle = ", ".join(
            f"{phase['name']} {phase['idle_fraction']:.1%}" for phase in pipeline["phases"]
        )
        bubble = max(phase["gpipe_bubble_fraction"] for phase in pipeline["phases"])
        lines.append(
            f"  #{c['rank']} {c['device']}: {pipeline['stages']} stages of {blocks}, "
            f"{pipeline['micro_batches']} micro-batches of {pipeline['micro_batch_size']}, "
            f"{pipeline['link_bytes_per_s'] / 1e9:,.0f} GB/s between stages; idle {idle}; "
            f"GPipe bubble {bubble:.0%} for a lone batch"
        )
    return "\n".join(lines)


def _value(candidate: Json, key: str) -> Any:
    """A candidate field; ``block.field`` reads a nested one (None when the block is)."""
    block, _, field = key.partition(".")
    if not field:
        return candidate.get(key)
    return (candidate.get(block) or {}).get(field)


def recommendation_table(result: Json) -> str:
    """The ranked candidates with the column they are ranked by (and, for decoders, the
    time to first token, per-token latency and tokens per second; with continuous batching
    the concurrent requests and the most whose KV cache fits)."""
    key, header = ranking_column(result)
    decoder = bool(result["workload"].get("decoder"))
    continuous = decoder and result["workload"].get("batching") == "continuous"
    columns: list[tuple[str, str]] = [
        ("rank", "#"), ("device", "device"), ("precision", "precision"),
        ("batch_size", "concurrent" if continuous else "batch"),
    ]  # fmt: skip
    if continuous:
        columns.append(("decoder_serving.max_concurrent_requests", "max (KV)"))
    columns.append(("latency_ms", "latency ms"))
    if decoder:
        columns += [("time_to_first_token_ms", "TTFT ms"), ("per_token_latency_ms", "ms/token"),
                    ("tokens_per_s", "tokens/s")]  # fmt: skip
    columns += [("throughput_per_s", "seq/s" if decoder else "per s"),
                ("devices_needed", "devices"), ("cost_usd_per_million", "$/M")]  # fmt: skip
    if key not in {k for k, _ in columns}:
        columns.append((key, header))
    columns += [("bound", "bound"), ("fits_in_memory", "fits")]
    rows = [
        [_value(c, k) for k, _ in columns]
        + ["yes" if c["eligible"] else "; ".join(c["reasons"])[:40]]
        for c in result["candidates"]
    ]
    headers = [f"{h} (ranked)" if k == key else h for k, h in columns] + ["eligible"]
    return table(rows, headers) + f"\nranked: eligible first, then by {header} (ascending)"
