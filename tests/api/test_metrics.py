"""/metrics in one process: admission decisions, cache lookups, database pool, process metrics;
JSON logs without terminal colours. (Several worker processes: tests/test_serve_workers.py.)"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.api.metrics import MULTIPROC_ENV, live_worker_pids, prepare_multiprocess_dir
from app.logs import JsonFormatter
from tests.api.test_admission import NOTES, _container, review
from tests.support import ApiClient


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


def test_admission_decisions_are_counted_by_outcome_and_reason(client: ApiClient) -> None:
    chat = {"slug": "chat", "name": "Chat", "model": "gpt-2", "mode": "inference",
            "batch_size": 1, "sequence_length": 128, "precision": "bf16"}  # fmt: skip
    assert client.post("/v1/workloads", json=chat).status_code == 201
    before = client.get("/metrics").text
    fits = review(_container("server", {"nvidia.com/mig-1g.10gb": "1"}), annotations=NOTES)
    unknown = review(
        _container("server", {"nvidia.com/mig-1g.10gb": "1"}),
        annotations={**NOTES, "capacity-planner.io/workload": "no-such"},
    )
    for body in (fits, fits, fits, unknown, review(_container("cpu-only"))):
        assert client.post("/v1/admission/pods", json=body).status_code == 200
    assert client.post("/v1/admission/pods", content=b"not json").status_code == 200
    check = {"workload": "chat", "gpu_model": "nvidia-a100-80gb-sxm",
             "resource": "nvidia.com/mig-1g.10gb"}  # fmt: skip
    assert client.post("/v1/admission/check", json=check).json()["allowed"] is True
    after = client.get("/metrics").text

    def added(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    decisions = "capplan_admission_decisions_total"
    assert added(decisions, endpoint="pods", outcome="allowed", reason="fits") == 3
    assert added(decisions, endpoint="pods", outcome="denied", reason="invalid_review") == 2
    assert added(decisions, endpoint="pods", outcome="allowed", reason="no_gpu") == 1
    assert added(decisions, endpoint="check", outcome="allowed", reason="fits") == 1
    assert 'reason="does_not_fit"' not in after
    # The same question three times: one miss, then two answers from the cache; the unknown
    # workload is a miss too (errors are not cached).
    lookups = "capplan_cache_lookups_total"
    assert added(lookups, cache="admission_decisions", result="miss") == 2
    assert added(lookups, cache="admission_decisions", result="hit") == 2


def test_a_denied_fit_and_the_allow_policy_are_counted_as_such(make_client: Any) -> None:
    client: ApiClient = make_client(admission_failure_policy="allow")
    big = {"slug": "llama-chat", "name": "Llama", "model": "llama-3-8b", "mode": "inference",
           "batch_size": 8, "sequence_length": 4096, "precision": "bf16"}  # fmt: skip
    assert client.post("/v1/workloads", json=big).status_code == 201
    notes = {**NOTES, "capacity-planner.io/workload": "llama-chat"}
    denied = review(_container("server", {"nvidia.com/mig-1g.10gb": "1"}), annotations=notes)
    assert client.post("/v1/admission/pods", json=denied).json()["response"]["allowed"] is False
    unknown = review(
        _container("server", {"nvidia.com/mig-1g.10gb": "1"}),
        annotations={**NOTES, "capacity-planner.io/workload": "no-such"},
    )
    assert client.post("/v1/admission/pods", json=unknown).json()["response"]["allowed"] is True
    text = client.get("/metrics").text
    decisions = "capplan_admission_decisions_total"
    assert value(text, decisions, endpoint="pods", outcome="denied", reason="does_not_fit") == 1
    assert value(text, decisions, endpoint="pods", outcome="allowed", reason="invalid_review") == 1


def test_estimate_cache_hits_are_counted(client: ApiClient) -> None:
    body = {"model": "gpt-2", "mode": "inference", "batch_size": 3, "sequence_length": 96}
    before = client.get("/metrics").text
    for _ in range(3):
        assert client.post("/v1/estimates/memory", json=body).status_code == 200
    after = client.get("/metrics").text
    lookups = "capplan_cache_lookups_total"
    hits = value(after, lookups, cache="estimate_runs", result="hit") - value(
        before, lookups, cache="estimate_runs", result="hit"
    )
    misses = value(after, lookups, cache="estimate_runs", result="miss") - value(
        before, lookups, cache="estimate_runs", result="miss"
    )
    assert (hits, misses) == (2, 1)


def test_pool_and_process_metrics(make_client: Any) -> None:
    client: ApiClient = make_client(db_pool_size=3)
    assert client.get("/v1/hardware").status_code == 200
    text = client.get("/metrics").text
    assert value(text, "capplan_db_pool_size") == 3
    assert value(text, "capplan_db_pool_checked_out") == 0  # every connection went back
    assert value(text, "capplan_db_slots_in_use") == 0
    assert value(text, "capplan_worker_processes") == 1
    pid = str(os.getpid())
    assert value(text, "process_resident_memory_bytes", pid=pid) > 1e6
    assert value(text, "process_cpu_seconds_total", pid=pid) > 0
    assert value(text, "process_open_fds", pid=pid) > 0


def test_checked_out_connections_are_counted_while_in_use(client: ApiClient) -> None:
    engine = client.app.state.engine
    with engine.connect():
        inside = client.get("/metrics").text
    outside = client.get("/metrics").text
    assert value(inside, "capplan_db_pool_checked_out") == 1
    assert value(outside, "capplan_db_pool_checked_out") == 0


# -- multiprocess directory ---------------------------------------------------------------------


def test_several_workers_get_a_fresh_directory_removed_at_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    assert prepare_multiprocess_dir(1)() is None  # one worker: single-process mode
    assert MULTIPROC_ENV not in os.environ
    cleanup = prepare_multiprocess_dir(2)
    directory = Path(os.environ[MULTIPROC_ENV])
    assert directory.is_dir()
    assert list(directory.iterdir()) == []
    cleanup()
    assert not directory.exists()
    assert MULTIPROC_ENV not in os.environ


def test_an_operators_directory_is_emptied_of_old_values(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_12345.db").write_bytes(b"old")
    (directory / "keep.txt").write_text("not ours")
    monkeypatch.setenv(MULTIPROC_ENV, str(directory))
    prepare_multiprocess_dir(4)()
    assert sorted(p.name for p in directory.iterdir()) == ["keep.txt"]
    assert os.environ[MULTIPROC_ENV] == str(directory)  # kept for the operator


def test_workers_that_vanished_stop_counting_in_live_gauges(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(gone.stdout)
    for pid in (os.getpid(), dead):
        (tmp_path / f"gauge_livesum_{pid}.db").write_bytes(b"")
        (tmp_path / f"counter_{pid}.db").write_bytes(b"")
    assert live_worker_pids(tmp_path) == [os.getpid()]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"counter_{dead}.db", f"counter_{os.getpid()}.db", f"gauge_livesum_{os.getpid()}.db"]
    )  # a dead worker's counters still count


# -- logs ---------------------------------------------------------------------------------------


def test_logs_are_plain_json_without_colour() -> None:
    record = logging.LogRecord(
        "uvicorn.error", logging.INFO, __file__, 1, "Uvicorn running on %s (Press CTRL+C)",
        ("\x1b[1mhttp://127.0.0.1:8000\x1b[0m",), None,
    )  # fmt: skip
    record.color_message = "Uvicorn running on \x1b[1m%s\x1b[0m (Press CTRL+C to quit)"
    record.detail = "\x1b[32mgreen\x1b[0m"
    line = JsonFormatter().format(record)
    assert "\x1b" not in line
    assert "\\u001b" not in line
    payload: dict[str, Any] = json.loads(line)
    assert "color_message" not in payload
    assert payload["msg"] == "Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C)"
    assert payload["detail"] == "green"
    assert payload["pid"] == os.getpid()
