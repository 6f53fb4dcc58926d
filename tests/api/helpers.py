"""Payload builders and assertions shared by the API tests."""

from __future__ import annotations

import copy
from typing import Any

import httpx

PROBLEM_JSON = "application/problem+json"

HARDWARE: dict[str, Any] = {
    "slug": "lab-gpu-1",
    "vendor": "Acme",
    "name": "Acme Lab GPU",
    "kind": "gpu",
    "memory_bytes": 25_769_803_776,
    "memory_bandwidth_bytes_per_s": 900_000_000_000,
    "peak_flops_per_s": {"fp32": 15.7e12, "fp16": 125e12},
    "host_link": {"type": "PCIe Gen3 x16", "pcie_generation": 3, "pcie_lanes": 16},
    "tdp_watts": 300,
    "price_usd_per_hour": 1.5,
    "price_kind": "on_demand",
    "mig": {
        "total_compute_slices": 7,
        "total_memory_slices": 8,
        "max_gpu_instances": 7,
        "profiles": [
            {
                "name": "1g.3gb",
                "memory_mib": 3072,
                "compute_slices": 1,
                "memory_slices": 1,
                "max_instances": 7,
                "placements": [0, 1, 2, 3, 4, 5, 6],
            },
            {
                "name": "7g.24gb",
                "memory_mib": 24064,
                "compute_slices": 7,
                "memory_slices": 8,
                "max_instances": 1,
                "placements": [0],
            },
        ],
    },
    "sources": ["lab measurement"],
}

MODEL: dict[str, Any] = {
    "slug": "tiny-cnn",
    "name": "Tiny CNN",
    "family": "cnn",
    "inputs": [{"name": "image", "shape": ["batch", 3, 32, 32]}],
    "layers": [
        {"name": "conv1", "op": "conv2d", "out_channels": 16, "kernel_size": 3, "padding": 1},
        {"name": "relu1", "op": "relu", "inplace": True},
        {"name": "pool", "op": "adaptive_avgpool2d", "output_size": 1},
        {"name": "flat", "op": "flatten", "start_dim": 1},
        {"name": "fc", "op": "linear", "out_features": 10},
    ],
}


# A two-layer MLP, given inline to estimates and recommendations.
TINY_MLP: dict[str, Any] = {
    "inputs": [{"name": "x", "shape": ["batch", 64]}],
    "layers": [
        {"name": "fc1", "op": "linear", "out_features": 128},
        {"name": "act", "op": "gelu"},
        {"name": "fc2", "op": "linear", "out_features": 10},
    ],
}


def hardware(**changes: Any) -> dict[str, Any]:
    """A valid hardware payload with top-level ``changes``."""
    payload = copy.deepcopy(HARDWARE)
    payload.update(changes)
    return payload


def model(**changes: Any) -> dict[str, Any]:
    """A valid model payload with top-level ``changes``."""
    payload = copy.deepcopy(MODEL)
    payload.update(changes)
    return payload


def without_slug(payload: dict[str, Any]) -> dict[str, Any]:
    """The PUT form of a create payload."""
    return {k: v for k, v in payload.items() if k != "slug"}


def assert_problem(
    response: httpx.Response, status: int, type_slug: str | None = None
) -> dict[str, Any]:
    """The response is an RFC 9457 problem with ``status``; returns the body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["title"]
    assert body["detail"]
    assert body["type"].startswith("/problems/")
    if type_slug is not None:
        assert body["type"] == f"/problems/{type_slug}"
    text = response.text
    assert "Traceback" not in text
    assert "sqlalchemy" not in text.lower()
    assert "SELECT " not in text
    return body
