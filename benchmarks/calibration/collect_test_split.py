"""Collect the rows of ``calibration_test.yaml`` by the rule in its header (issue 30, point 3).

Walks one MLPerf Inference results repository (``mlcommons/inference_results_vX.Y``, a local
git clone or bare mirror, read at one pinned commit with ``git ls-tree`` / ``git show``; no
network) and prints, as YAML, every row the rule takes: every performance run
(``results/<system>/<model>/<scenario>/performance/run_1/mlperf_log_summary.txt`` with
``Result is : VALID``) of the closed division for resnet50, bert-99, gptj-99 and 3d-unet-99 in
the Offline, Server and SingleStream scenarios, of every (submitter, system) folder whose
accelerator (or, CPU-only, whose CPU) maps to a catalog device (:data:`DEVICES`) at a
precision a request can express (the submission's ``measurements/.../*.json``
``weight_data_types``: :data:`PRECISIONS`), minus the systems rule (C) excludes: those this
repository already cites (:func:`cited_systems`, over the committed files of ``--project``),
MIG slices, and GPU + DLA runs. Nothing is picked by
hand: a system is in or out by these tests, and every row of a system that is in is printed.
``--report`` prints, to stderr, every system folder of the round and why it is in or out.

The fields follow ``calibration_more.yaml``: a SingleStream run gives its p90 (scored) and p50
latency rows in ms, a Server run its scheduled samples/s at the run's own latency bound
(``target_latency (ns)``) and its p99 latency, an Offline run its samples/s;
``value_per_accelerator`` (GPUs, more than one) or ``value_per_socket`` (CPUs) = value / count.

Usage (``--project`` is this repository, whose committed files at ``--project-commit`` are
searched with ``git grep`` for the systems they already cite). The rows of the file, round by
round, in the order they were added::

    python benchmarks/calibration/collect_test_split.py --project . --project-commit cf14ff9 \\
        --repo <inference_results_v2.0 clone> --round v2.0 \\
        --commit 425a0d30c6e0cb9b65595881572cbba5f18572eb --added 2026-11-27 --report
    python benchmarks/calibration/collect_test_split.py --project . --project-commit 17d7b15 \\
        --repo <inference_results_v2.1 clone> --round v2.1 \\
        --commit 91f7859b8b5847b7c5fdf95ce65699ad6477093b --added 2026-11-28 --report
    python benchmarks/calibration/collect_test_split.py --project . --project-commit 17d7b15 \\
        --repo <inference_results_v3.0 clone> --round v3.0 \\
        --commit 1948f9b5b93c5b4dcafe15de0faa08cdf1439fca --added 2026-11-28 --report
    python benchmarks/calibration/collect_test_split.py --project . --project-commit 17d7b15 \\
        --repo <inference_results_v1.1 clone> --round v1.1 \\
        --commit 7fc43356c4d71ed6ec97af9d035a34ed146587b8 --added 2026-11-28 --report

The device table gained the T4's "Tesla T4" names, the 500 W A100 SXM4 80GB ("CTS", "-500W")
and the vGPU test before rounds v2.1, v3.0 and v1.1 were collected; round v2.0's output is
unchanged by them (the round names none of these). Since 2026-11-28 a round before v2.0 has no
eligible 3d-unet-99 (:data:`KITS19_3D_UNET_FROM_ROUND`: that round's 3D-UNet is the BraTS 2019
model, not the KiTS19 model the service prices); ``--report`` lists each such run as left out,
and round v1.1's output is its 288 rows in the file (its 65 3d-unet-99 rows removed, rule (D)).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MODELS = ("resnet50", "bert-99", "gptj-99", "3d-unet-99")  # rule (B)
SCENARIOS = ("Offline", "Server", "SingleStream")  # rule (B)
# 3d-unet-99 is the KiTS19 model (the service's 3d-unet) only from MLPerf Inference v2.0 on.
# Before it the benchmark of that name is the BraTS 2019 model (inference_results_v1.1 @
# 912dcdb9163736beca40a1f86e25d1305deab549, closed/NVIDIA/code/3d-unet/tensorrt/README.md:
# "The dataset used for this benchmark is BraTS 2019 ... The ONNX model 3dUNetBraTS.onnx ...
# vision/medical_imaging/3d-unet-brats19"), another network whose rates are ~17x those of
# later rounds on the same GPU: a round before this one has no eligible 3d-unet-99 run.
KITS19_3D_UNET_FROM_ROUND = (2, 0)

# accelerator_model_name (system JSON, normalised: lower case, "_" and "-" as spaces) ->
# calibration device id (calibrate.CATALOG_SLUGS). Only devices the catalog holds; a name
# missing here makes its system "not in the catalog" (rule (C)).
DEVICES = {
    "nvidia a100 pcie 80gb": "nvidia_a100_80gb_pcie",
    "nvidia a100 sxm 80gb": "nvidia_a100_80gb_sxm",
    "nvidia a100 sxm4 80gb": "nvidia_a100_80gb_sxm",
    # The same A100 SXM4 80GB at a 500 W TDP instead of 400 W ("CTS", custom thermal solution:
    # v2.1 Dell XE8545 hw_notes "NVIDIA A100-SXM-80GB (TDP: 500W)"): same part, peaks and
    # memory; a power setting, as the power-capped MaxQ systems are (in, v2.0 0eb9f8a).
    "nvidia a100 sxm 80gb cts": "nvidia_a100_80gb_sxm",
    "nvidia a100 sxm4 80gb cts": "nvidia_a100_80gb_sxm",
    "nvidia a100 sxm 80gb 500w": "nvidia_a100_80gb_sxm",  # v1.1 Lenovo SD650v2-N
    "nvidia a100 sxm 40gb": "nvidia_a100_40gb_sxm",
    "nvidia a100 sxm4 40gb": "nvidia_a100_40gb_sxm",
    "nvidia a30": "nvidia_a30",
    "nvidia a30 pcie 24gb": "nvidia_a30",
    "nvidia a10": "nvidia_a10",
    "nvidia t4": "nvidia_t4",
    "tesla t4": "nvidia_t4",  # v3.0 cTuning aws_g4dn.xlarge (AWS g4dn: one T4)
    "nvidia tesla t4": "nvidia_t4",  # v1.1 Alibaba T4x1_TRT
    "nvidia l4": "nvidia_l4",
    "nvidia l40s": "nvidia_l40s",
    "nvidia h100 pcie 80gb": "nvidia_h100_pcie",
    "nvidia h100 sxm 80gb": "nvidia_h100_sxm",
    "nvidia h200 sxm 141gb": "nvidia_h200_sxm",
}
# NVIDIA vGPU profiles (accelerator_model_name "<GPU>-<frame buffer GB><series letter>", e.g.
# "NVIDIA A10-24Q", "NVIDIA H100-80C": NVIDIA Virtual GPU Software's profile names): a GPU seen
# through a hypervisor's virtual device, as a MIG slice is a partition: no catalog device.
VGPU = re.compile(r" \d+[abcq]$")
# host_processor_model_name patterns of CPU-only systems -> calibration device id
CPUS = {
    r"platinum 8380 cpu": "intel_xeon_platinum_8380",
    r"8380h": "intel_xeon_platinum_8380h",
    r"platinum 8280m?": "intel_xeon_platinum_8280m",
    r"gold 6248r": "intel_xeon_gold_6248r",
    r"gold 6258r": "intel_xeon_gold_6258r",
    r"gold 6330": "intel_xeon_gold_6330",
    r"platinum 8352m": "intel_xeon_platinum_8352m",
    r"platinum 8360y": "intel_xeon_platinum_8360y",
    r"platinum 8480\+": "intel_xeon_platinum_8480plus",
    r"platinum 8592\+": "intel_xeon_platinum_8592plus_emr",
}
# weight_data_types of the measurements JSON -> the row's precision (rule (B): a precision a
# request can express: int8 W8A8, fp8, fp16, bf16). Anything else (fp32, "int8,fp16" mixes,
# 4-bit) is not expressible and leaves the system out (rule (C)).
PRECISIONS = {"int8": "INT8", "fp8": "FP8", "fp16": "FP16", "bf16": "BF16"}

SERVER_BATCH = "server (Poisson arrivals, 1 sample/query; dynamic batching by SUT)"
OFFLINE_BATCH = "offline (submitter-chosen batch)"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def _normalise(name: str) -> str:
    return re.sub(r"[\s_\-]+", " ", name.strip().lower())


def summary_fields(text: str) -> dict[str, str]:
    """``key : value`` lines of an mlperf_log_summary.txt (first occurrence wins)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def _round_number(round_: str) -> tuple[int, ...]:
    """``"v1.1"`` -> ``(1, 1)``."""
    return tuple(int(part) for part in round_.lstrip("vV").split("."))


def _ms(ns: str) -> float:
    return round(float(ns) / 1e6, 4)


@dataclass
class System:
    submitter: str
    name: str
    spec: dict[str, Any]
    device: str | None
    count: int
    cpu: bool
    why_out: str


def classify(
    repo: Path, commit: str, round_: str, submitter: str, name: str, cited: set[str]
) -> System:
    """The system's device and count, and why it is out ("" when in)."""
    try:
        spec = json.loads(git(repo, "show", f"{commit}:closed/{submitter}/systems/{name}.json"))
    except (subprocess.CalledProcessError, json.JSONDecodeError) as error:
        return System(submitter, name, {}, None, 0, False, f"no readable system JSON ({error})")
    accelerator = str(spec.get("accelerator_model_name", "")).strip()
    count_text = str(spec.get("accelerators_per_node", "0")).strip() or "0"
    count = int(count_text) if count_text.isdigit() else 0
    cpu = count == 0 or _normalise(accelerator) in ("", "n/a", "na", "none", "-")
    if cpu:
        host = _normalise(str(spec.get("host_processor_model_name", "")))
        device = next((d for pattern, d in CPUS.items() if re.search(pattern, host)), None)
        count = int(str(spec.get("host_processors_per_node", "0")).strip() or 0)
    else:
        device = DEVICES.get(_normalise(accelerator))
    why = ""
    if f"inference_results_{round_}|closed|{submitter}|{name}" in cited:
        why = "cited by this repository (rule (C))"
    elif "mig" in _normalise(accelerator) or "MIG" in name:
        why = f"MIG slice {accelerator!r}: not a catalog device (rule (C))"
    elif VGPU.search(_normalise(accelerator)):
        why = f"vGPU profile {accelerator!r}: a virtual GPU, not a catalog device (rule (C))"
    elif device is None:
        what = spec.get("host_processor_model_name") if cpu else accelerator
        why = f"{what!r} not in the catalog (rule (C))"
    elif "dla" in str(spec.get("hw_notes", "")).lower():
        why = f"GPU + DLA runs ({spec.get('hw_notes')!r}; rule (C))"
    return System(submitter, name, spec, device, count, cpu, why)


def precision_of(
    repo: Path, commit: str, system: System, model: str, scenario_dir: str
) -> tuple[str | None, str]:
    """The row's precision from measurements/<system>/<model>/<scenario>/*.json."""
    folder = f"closed/{system.submitter}/measurements/{system.name}/{model}/{scenario_dir}"
    names = [n for n in git(repo, "ls-tree", "--name-only", f"{commit}:{folder}").split("\n") if n]
    jsons = [n for n in names if n.endswith(".json")]
    preferred = [n for n in jsons if n.startswith(system.name)] or jsons
    if not preferred:
        return None, "no measurements JSON"
    spec = json.loads(git(repo, "show", f"{commit}:{folder}/{preferred[0]}"))
    weights = str(spec.get("weight_data_types", "")).strip().lower()
    inputs = str(spec.get("input_data_types", "")).strip().lower()
    precision = PRECISIONS.get(weights)
    return precision, f"weights {weights}, inputs {inputs}"


def _row(
    common: dict[str, Any],
    system: System,
    added: str,
    metric: str,
    unit: str,
    value: float,
    **extra: Any,
) -> dict[str, Any]:
    """One row in calibration_more.yaml's field order; a throughput row of several GPUs (of a
    CPU system's sockets) also gives value / count."""
    row = {**common, **extra, "metric": metric, "unit": unit, "value": value}
    if unit != "ms" and (system.cpu or system.count > 1):
        per = "value_per_socket" if system.cpu else "value_per_accelerator"
        row[per] = round(value / system.count, 3)
    if system.cpu:
        row["sockets"] = system.count
    row["added"] = added
    return row


def rows_of(
    repo: Path, commit: str, round_: str, system: System, added: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every row of one system folder, and the runs left out (invalid, not expressible)."""
    base = f"https://github.com/mlcommons/inference_results_{round_}/blob/{commit}"
    results = f"closed/{system.submitter}/results/{system.name}"
    spec = system.spec
    framework = str(spec.get("framework", "")).strip()
    if system.cpu:
        hw = f"N/A x0 | host {spec.get('host_processor_model_name')} x{system.count}"
    else:
        hw = (
            f"{spec.get('accelerator_model_name')} x{system.count} | host "
            f"{spec.get('host_processor_model_name')} x{spec.get('host_processors_per_node')}"
        )
    common = {
        "device": system.device,
        "system": f"{system.submitter} {system.name}",
        "system_hw": hw,
        "accelerators": 0 if system.cpu else system.count,
        "framework": framework,
    }
    rows: list[dict[str, Any]] = []
    left: list[str] = []
    paths = git(repo, "ls-tree", "-r", "--name-only", commit, "--", results).splitlines()
    for path in sorted(paths):
        parts = path.split("/")
        if not re.fullmatch(
            r"closed/[^/]+/results/[^/]+/[^/]+/[^/]+/performance/run_\d+/mlperf_log_summary\.txt",
            path,
        ):
            continue
        model, scenario_dir = parts[4], parts[5]
        if model not in MODELS:
            continue
        fields = summary_fields(git(repo, "show", f"{commit}:{path}"))
        scenario = fields.get("Scenario", "")
        if scenario not in SCENARIOS:
            continue
        where = f"{system.submitter}/{system.name}/{model}/{scenario}/{parts[7]}"
        if model == "3d-unet-99" and _round_number(round_) < KITS19_3D_UNET_FROM_ROUND:
            left.append(
                f"{where}: round {round_}'s 3d-unet-99 is the BraTS 2019 model, not the"
                " KiTS19 model the service prices (no eligible 3d-unet-99 before v2.0)"
            )
            continue
        if fields.get("Result is") != "VALID":
            left.append(f"{where}: Result is {fields.get('Result is')!r}")
            continue
        precision, stated = precision_of(repo, commit, system, model, scenario_dir)
        if precision is None:
            left.append(f"{where}: precision not expressible ({stated})")
            continue
        row_common = {
            **common,
            "model": model,
            "benchmark": f"MLPerf Inference {round_} closed",
            "scenario": scenario,
            "precision": f"{precision} ({stated}; {framework})",
            "source": f"{base}/{path}",
            "system_source": f"{base}/closed/{system.submitter}/systems/{system.name}.json",
            "confirmed": True,
            "result_valid": "VALID",
        }
        if scenario == "Offline":
            rows.append(
                _row(
                    row_common,
                    system,
                    added,
                    "throughput",
                    "samples/s",
                    float(fields["Samples per second"]),
                    batch=OFFLINE_BATCH,
                )
            )
        elif scenario == "Server":
            bound = _ms(fields["target_latency (ns)"])
            extra = {"batch": SERVER_BATCH, "latency_bound_ms": bound}
            rows.append(
                _row(
                    row_common,
                    system,
                    added,
                    "server_throughput_at_latency_bound",
                    "scheduled samples/s",
                    float(fields["Scheduled samples per second"]),
                    **extra,
                )
            )
            rows.append(
                _row(
                    row_common,
                    system,
                    added,
                    "p99_latency",
                    "ms",
                    _ms(fields["99.00 percentile latency (ns)"]),
                    **extra,
                )
            )
        else:  # SingleStream
            rows.append(
                _row(
                    row_common,
                    system,
                    added,
                    "p90_latency",
                    "ms",
                    _ms(fields["90th percentile latency (ns)"]),
                    batch=1,
                )
            )
            rows.append(
                _row(
                    row_common,
                    system,
                    added,
                    "p50_latency",
                    "ms",
                    _ms(fields["50.00 percentile latency (ns)"]),
                    batch=1,
                )
            )
    return rows, left


CITED = re.compile(
    r"inference_results_(v[0-9.]+)(?:/(?:blob|tree)/[0-9a-f]+)?/(closed|open|network)/"
    r"([^/\s\"'`]+)/(?:results|systems|measurements|code|compliance)/([^/\s\"'`]+)"
)


def cited_systems(project: Path, as_of: str = "HEAD") -> set[str]:
    """``round|division|submitter|system`` of every results-repository path that a file of
    ``project`` committed at ``as_of`` names (rule (C)), calibration_test.yaml itself aside (its
    own rows are not "another file"); a system JSON's ``.json`` is dropped."""
    text = subprocess.run(
        [
            "git",
            "-C",
            str(project),
            "grep",
            "-hoE",
            r"inference_results_v[0-9.]+/[^ \"'`)>]+",
            as_of,
            "--",
            ".",
            ":!benchmarks/calibration/calibration_test.yaml",
        ],
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    found = set()
    for match in CITED.finditer(text):
        round_, division, submitter, system = match.groups()
        system = system.removesuffix(".json")
        found.add(f"inference_results_{round_}|{division}|{submitter}|{system}")
    return found


def system_folders(repo: Path, commit: str) -> Iterable[tuple[str, str]]:
    for submitter in git(repo, "ls-tree", "--name-only", f"{commit}:closed").splitlines():
        try:
            listing = git(repo, "ls-tree", f"{commit}:closed/{submitter}/results")
        except subprocess.CalledProcessError:
            continue
        for line in listing.splitlines():  # "<mode> <type> <hash>\t<name>": folders only
            entry, _, name = line.partition("\t")
            if entry.split()[1] == "tree":
                yield submitter, name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="the round's git repository")
    parser.add_argument("--round", required=True, help="e.g. v2.0")
    parser.add_argument("--commit", required=True, help="the pinned commit (40 hex digits)")
    parser.add_argument("--project", type=Path, required=True, help="this repository's root")
    parser.add_argument(
        "--project-commit", default="HEAD", help="the project's commit whose files are searched"
    )
    parser.add_argument("--added", required=True, help="the date the rows are committed")
    parser.add_argument("--report", action="store_true", help="why each system is in or out")
    args = parser.parse_args(argv)
    cited = cited_systems(args.project, args.project_commit)
    if args.report:
        for entry in sorted(cited):
            print(f"cited: {entry}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for submitter, name in system_folders(args.repo, args.commit):
        system = classify(args.repo, args.commit, args.round, submitter, name, cited)
        if system.why_out:
            if args.report:
                print(f"OUT {submitter}/{name}: {system.why_out}", file=sys.stderr)
            continue
        found, left = rows_of(args.repo, args.commit, args.round, system, args.added)
        if args.report:
            print(
                f"IN  {submitter}/{name}: {system.device} x{system.count}, {len(found)} rows",
                file=sys.stderr,
            )
            for line in left:
                print(f"      left: {line}", file=sys.stderr)
        rows.extend(found)
    sys.stdout.write(yaml.safe_dump(rows, sort_keys=False, width=100, allow_unicode=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
