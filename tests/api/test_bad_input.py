"""Bad input is a 4xx problem naming the field, on SQLite and PostgreSQL alike, and writes nothing.

NUL and lone UTF-16 surrogates in any string of any JSON body (PostgreSQL cannot store the first,
UTF-8 cannot encode the second), non-physical hardware figures, cross-field rules checked inside
services, and errors that escape a service (pydantic, recursion, the database refusing a value).
Bodies are sent as ASCII JSON with ``\\u`` escapes, as a client would send them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import DataError

from app.db.models import Hardware
from app.domain.hardware import MAX_PRICE_USD_PER_HOUR, MAX_TDP_WATTS
from app.schemas.base import Schema
from app.schemas.estimates import WorkloadInput
from app.services.catalog import CatalogError, load_catalog
from tests.api.helpers import MODEL, PROBLEM_JSON, TINY_MLP, assert_problem, hardware, model
from tests.support import CATALOG_DIR, ApiClient, db_session, table_counts

NUL = "\x00"
SURROGATE = "\ud800"
RECOMMEND = "/v1/recommendations/inference"
ROOFLINE = "/v1/recommendations/roofline.svg"
WORKLOAD: dict[str, Any] = {
    "slug": "chat",
    "name": "Chat",
    "model": "gpt-2",
    "mode": "inference",
    "batch_size": 4,
    "sequence_length": 128,
    "precision": "bf16",
}


def send(client: ApiClient, method: str, url: str, body: Any, **kwargs: Any) -> httpx.Response:
    """``body`` as JSON text with every non-ASCII character escaped (lone surrogates included,
    which httpx's own encoder would refuse); NaN and Infinity as Python's json writes them."""
    headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
    return client.request(method, url, content=json.dumps(body), headers=headers, **kwargs)


def pointers(body: dict[str, Any]) -> list[str]:
    return [error["pointer"] for error in body["errors"]]


def with_change(payload: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``payload`` with the item at ``path`` set to ``value``."""
    changed = copy.deepcopy(payload)
    target: Any = changed
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return changed


def with_key(payload: dict[str, Any], path: tuple[str | int, ...], key: str) -> dict[str, Any]:
    """A deep copy of ``payload`` whose dict at ``path`` gains the key ``key``."""
    changed = copy.deepcopy(payload)
    target: Any = changed
    for part in path:
        target = target[part]
    target[key] = 1
    return changed


BLOCK_MODEL = model(
    slug="blocky",
    layers=[
        {
            "name": "stack",
            "op": "block",
            "layers": [
                {"name": "fc1", "op": "linear", "out_features": 8},
                {"name": "act", "op": "relu"},
            ],
        }
    ],
    inputs=[{"name": "x", "shape": ["batch", 8]}],
)
INLINE_ESTIMATE: dict[str, Any] = {"architecture": TINY_MLP, "mode": "inference", "batch_size": 1}
HF_IMPORT: dict[str, Any] = {
    "slug": "tiny-llama",
    "config": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
    },
}
MIG_FIT: dict[str, Any] = {"workload": "placeholder", "gpu": "nvidia-a100-80gb-sxm"}
INLINE_WORKLOAD: dict[str, Any] = {"architecture": TINY_MLP, "mode": "inference", "batch_size": 1}

# (method, url, body, pointer of the bad string)
TEXT_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("POST", "/v1/hardware", with_change(hardware(), ("name",), f"A{NUL}"), "/name"),
    ("POST", "/v1/hardware", with_change(hardware(), ("vendor",), NUL), "/vendor"),
    ("POST", "/v1/hardware", with_change(hardware(), ("notes",), f"x{SURROGATE}"), "/notes"),
    ("POST", "/v1/hardware", with_change(hardware(), ("sources", 0), f"a{NUL}"), "/sources/0"),
    (
        "POST",
        "/v1/hardware",
        with_change(hardware(), ("host_link", "type"), NUL),
        "/host_link/type",
    ),
    (
        "POST",
        "/v1/hardware",
        with_change(hardware(), ("mig", "profiles", 1, "unconfirmed"), ["ok", f"p{NUL}"]),
        "/mig/profiles/1/unconfirmed/1",
    ),
    (
        "POST",
        "/v1/models",
        with_change(model(), ("layers", 3, "name"), f"f{NUL}"),
        "/layers/3/name",
    ),
    (
        "POST",
        "/v1/models",
        with_change(model(), ("layers", 1, "op"), f"relu{SURROGATE}"),
        "/layers/1/op",
    ),
    (
        "POST",
        "/v1/models",
        with_key(model(), ("layers", 0), f"pad{NUL}"),
        f"/layers/0/pad{NUL}/[key]",
    ),
    (
        "POST",
        "/v1/models",
        with_change(BLOCK_MODEL, ("layers", 0, "layers", 1, "name"), f"a{NUL}"),
        "/layers/0/layers/1/name",
    ),
    ("POST", "/v1/models", with_change(model(), ("description",), SURROGATE), "/description"),
    (
        "POST",
        "/v1/models",
        model(default_bindings={f"s{NUL}": 2}),
        f"/default_bindings/s{NUL}/[key]",
    ),
    ("POST", "/v1/models", with_change(model(), ("inputs", 0, "name"), NUL), "/inputs/0/name"),
    ("POST", "/v1/workloads", with_change(WORKLOAD, ("name",), f"c{NUL}"), "/name"),
    ("POST", "/v1/workloads", with_change(WORKLOAD, ("description",), SURROGATE), "/description"),
    (
        "POST",
        "/v1/workloads",
        with_change(WORKLOAD, ("options",), {"bindings": {f"k{NUL}": 2}}),
        f"/options/bindings/k{NUL}/[key]",
    ),
    (
        "POST",
        "/v1/estimates/memory",
        with_change(INLINE_ESTIMATE, ("architecture", "layers", 0, "name"), NUL),
        "/architecture/layers/0/name",
    ),
    (
        "POST",
        "/v1/estimates/memory",
        {**INLINE_ESTIMATE, "bindings": {f"b{NUL}": 3}},
        f"/bindings/b{NUL}/[key]",
    ),
    (
        "POST",
        RECOMMEND,
        {"architecture": with_change(TINY_MLP, ("layers", 2, "name"), f"o{NUL}")},
        "/architecture/layers/2/name",
    ),
    (
        "POST",
        "/v1/models/import/hf-config",
        with_change(HF_IMPORT, ("config", "torch_dtype"), f"bf16{NUL}"),
        "/config/torch_dtype",
    ),
    (
        "POST",
        "/v1/models/import/hf-config",
        with_change(HF_IMPORT, ("name",), f"n{NUL}"),
        "/name",
    ),
    (
        "POST",
        "/v1/mig/plan",
        {
            "gpu": "nvidia-a100-80gb-sxm",
            "workloads": [{"name": "a", "replicas": 1, "profile": f"1g.10gb{NUL}"}],
        },
        "/workloads/0/profile",
    ),
    (
        "POST",
        "/v1/mig/layouts/validate",
        {"gpu": "nvidia-a100-80gb-sxm", "instances": [{"profile": f"1g{NUL}", "start": 0}]},
        "/instances/0/profile",
    ),
]


TEXT_URLS = sorted({case[1] for case in TEXT_CASES})


@pytest.mark.parametrize("url", TEXT_URLS)
def test_unstorable_text_anywhere_in_a_body_is_a_422_naming_it(
    client: ApiClient, db_url: str, url: str
) -> None:
    before = table_counts(db_url)
    cases = [case for case in TEXT_CASES if case[1] == url]
    assert cases
    for method, _, body, pointer in cases:
        problem = assert_problem(send(client, method, url, body), 422)
        assert pointer in pointers(problem), (pointer, problem["errors"])
        assert all(error["location"] == "body" for error in problem["errors"])
    assert table_counts(db_url) == before


def _schema_classes() -> dict[str, type[Schema]]:
    found: dict[str, type[Schema]] = {}
    pending: list[type[Schema]] = [Schema]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.__name__, cls)
        pending += cls.__subclasses__()
    return found


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _nested_models(arg)]


def test_every_request_body_model_checks_its_text(client: ApiClient) -> None:
    """No body (nor a model nested in one) may opt out of the storable-text check."""
    document = client.get("/openapi.json").json()
    names = {
        operation["requestBody"]["content"][media]["schema"]["$ref"].rsplit("/", 1)[-1]
        for item in document["paths"].values()
        for operation in item.values()
        if isinstance(operation, dict) and "requestBody" in operation
        for media in operation["requestBody"]["content"]
        if "$ref" in operation["requestBody"]["content"][media]["schema"]
    }
    classes = _schema_classes()
    assert {"HardwareCreate", "ModelReplace", "WorkloadCreate", "HfConfigImport"} <= names
    seen: set[type[BaseModel]] = set()
    # (multipart form bodies are FastAPI's own models, with no free text to store)
    pending: list[type[BaseModel]] = [classes[name] for name in names if name in classes]
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        assert issubclass(cls, Schema), cls
        assert cls.check_storable_text, f"{cls.__name__} is a request body and must be checked"
        for info in cls.model_fields.values():
            pending += _nested_models(info.annotation)
    assert len(seen) > 15


def test_unstorable_text_in_a_nested_inline_workload_is_named(client: ApiClient) -> None:
    spec = with_change(INLINE_WORKLOAD, ("architecture", "layers", 0, "name"), NUL)
    problem = assert_problem(
        send(client, "POST", "/v1/mig/fit", {**MIG_FIT, "workload": spec}), 422
    )
    # the workload is a union (inline spec or stored slug): the pointer names no union member
    assert "/workload/architecture/layers/0/name" in pointers(problem)
    check = {"workload": spec, "resource": "nvidia.com/gpu", "gpu_model": "nvidia-a10"}
    problem = assert_problem(send(client, "POST", "/v1/admission/check", check), 422)
    assert "/workload/architecture/layers/0/name" in pointers(problem)


def test_the_problem_names_the_character_and_the_answer_is_identical_on_both_backends(
    client: ApiClient,
) -> None:
    """The exact answer (compared across the sqlite and postgresql runs by being spelled out)."""
    nul = assert_problem(
        send(client, "POST", "/v1/models", with_change(model(), ("name",), NUL)), 422
    )
    assert nul["type"] == "/problems/validation-error"
    assert nul["errors"] == [
        {
            "pointer": "/name",
            "location": "body",
            "message": "must not contain the NUL character (U+0000)",
            "type": "unstorable_text",
        }
    ]
    key = f"act{SURROGATE}"
    bad_key = with_key(model(), ("layers", 1), key)
    surrogate = assert_problem(send(client, "POST", "/v1/models", bad_key), 422)
    [error] = surrogate["errors"]
    # UTF-8 cannot carry a lone surrogate, so the pointer shows it escaped, as text
    assert error["pointer"] == "/layers/1/act\\ud800/[key]"
    assert error["message"] == "must not contain unpaired UTF-16 surrogates (U+D800-U+DFFF)"


def test_an_unknown_field_named_with_a_lone_surrogate_is_answered(client: ApiClient) -> None:
    body = hardware()
    body[SURROGATE] = 1
    problem = assert_problem(send(client, "POST", "/v1/hardware", body), 422)
    # pydantic cannot read the key as text at all, so it names the object that holds it
    assert problem["errors"] == [
        {
            "pointer": "/",
            "location": "body",
            "message": "Input should be a valid string, unable to parse raw data as a unicode "
            "string",
            "type": "string_unicode",
        }
    ]


def test_many_bad_strings_are_reported_by_the_first_twenty(client: ApiClient) -> None:
    layers = [{"name": f"l{i}{NUL}", "op": "relu"} for i in range(500)]
    problem = assert_problem(send(client, "POST", "/v1/models", model(layers=layers)), 422)
    assert pointers(problem) == [f"/layers/{i}/name" for i in range(20)]


def test_a_replace_with_unstorable_text_changes_nothing(client: ApiClient) -> None:
    created = client.post("/v1/hardware", json=hardware())
    assert created.status_code == 201, created.text
    put = {k: v for k, v in hardware(name=f"new{NUL}").items() if k != "slug"}
    problem = assert_problem(
        send(client, "PUT", "/v1/hardware/lab-gpu-1", put, headers={"If-Match": '"1"'}), 422
    )
    assert pointers(problem) == ["/name"]
    after = client.get("/v1/hardware/lab-gpu-1")
    assert after.json()["name"] == "Acme Lab GPU"
    assert after.headers["etag"] == '"1"'


# --------------------------------------------------------------------------------------------
# Non-physical hardware figures
# --------------------------------------------------------------------------------------------

NAN = float("nan")
INF = float("inf")
SUBNORMAL = 2.2250738585072014e-308 / 2  # below sys.float_info.min
# (path in the body, values it must refuse, pointer)
PHYSICS_CASES: list[tuple[tuple[str | int, ...], list[Any], str]] = [
    (("peak_flops_per_s", "fp32"),
     [0, -1.0, 1e-308, 5e-324, SUBNORMAL, 999_999.0, 1e22, NAN, INF, -INF],
     "/peak_flops_per_s/fp32"),
    (("peak_sparse_flops_per_s",), [{"fp16": 1e-308}, {"fp16": 0}],
     "/peak_sparse_flops_per_s/fp16"),
    (("memory_bandwidth_bytes_per_s",), [0, -5, 999_999, 10**19, 1e-308, 5e-324, NAN],
     "/memory_bandwidth_bytes_per_s"),
    (("host_link", "bandwidth_bytes_per_s"), [0, 1, 5e-324, INF],
     "/host_link/bandwidth_bytes_per_s"),
    (("host_link", "pcie_lanes"), [0, -16], "/host_link/pcie_lanes"),
    (("host_link", "pcie_generation"), [0], "/host_link/pcie_generation"),
    (("tdp_watts",), [0, -300, 1e-308, 0.001, 100_000.01, 1e6, INF, NAN], "/tdp_watts"),
    (("price_usd_per_hour",), [-0.01, -1e-308, 100_000.01, 1e9, NAN, INF],
     "/price_usd_per_hour"),
    (("memory_bytes",), [0, -1, 1024, 1e-308], "/memory_bytes"),
    (("cpu",), [{"cores": 8, "threads": 16, "base_clock_hz": 1}], "/cpu/base_clock_hz"),
    (("mig", "profiles", 0, "memory_mib"), [0], "/mig/profiles/0/memory_mib"),
    (("mig", "profiles", 1, "compute_slices"), [8], "/mig/profiles/1/compute_slices"),
    (("mig", "profiles", 1, "placements"), [[1]], "/mig/profiles/1/placements/0"),
    (("kind",), ["cpu"], "/mig"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "values", "pointer"), PHYSICS_CASES, ids=[c[2] for c in PHYSICS_CASES]
)
def test_non_physical_hardware_is_rejected_on_create(
    client: ApiClient, db_url: str, path: tuple[str | int, ...], values: list[Any], pointer: str
) -> None:
    before = table_counts(db_url)
    for value in values:
        response = send(client, "POST", "/v1/hardware", with_change(hardware(), path, value))
        problem = assert_problem(response, 422)
        assert pointers(problem) == [pointer], (value, problem["errors"])
    assert table_counts(db_url) == before
    assert client.get("/v1/hardware/lab-gpu-1").status_code == 404


def test_non_physical_hardware_is_rejected_on_replace(client: ApiClient) -> None:
    assert client.post("/v1/hardware", json=hardware()).status_code == 201
    put = {k: v for k, v in hardware(peak_flops_per_s={"fp32": 1e-308}).items() if k != "slug"}
    problem = assert_problem(
        send(client, "PUT", "/v1/hardware/lab-gpu-1", put, headers={"If-Match": '"1"'}), 422
    )
    assert pointers(problem) == ["/peak_flops_per_s/fp32"]
    after = client.get("/v1/hardware/lab-gpu-1")
    assert after.json()["peak_flops_per_s"]["fp32"] == 15.7e12
    assert after.headers["etag"] == '"1"'


def test_the_bounds_admit_the_extremes_of_sane_hardware(client: ApiClient) -> None:
    extreme = hardware(
        slug="wafer",
        memory_bytes=2**20,
        memory_bandwidth_bytes_per_s=10**18,
        peak_flops_per_s={"fp32": 1e6, "fp8": 1e21},
        host_link={"type": "custom", "bandwidth_bytes_per_s": 1_000_000},
        tdp_watts=0.01,
        price_usd_per_hour=0,
        mig=None,
    )
    created = client.post("/v1/hardware", json=extreme)
    assert created.status_code == 201, created.text


def test_the_upper_power_and_price_bounds_admit_their_limit_and_predict(
    client: ApiClient,
) -> None:
    """100 kW and 100 000 USD/h are stored, and the domain (the same limits, one definition)
    prices a workload on that device instead of calling its figures non-physical."""
    top = hardware(
        slug="furnace",
        tdp_watts=MAX_TDP_WATTS,
        price_usd_per_hour=MAX_PRICE_USD_PER_HOUR,
        price_kind="on_demand",
    )
    created = client.post("/v1/hardware", json=top)
    assert created.status_code == 201, created.text
    assert (created.json()["tdp_watts"], created.json()["price_usd_per_hour"]) == (100_000, 100_000)
    body = {
        "model": "resnet-50",
        "devices": ["furnace"],
        "precisions": ["fp16"],
        "batch_sizes": [8],
    }
    response = client.post("/v1/recommendations/inference", json=body)
    assert response.status_code == 200, response.text
    (candidate,) = response.json()["candidates"]
    assert candidate["device"] == "furnace"
    assert candidate["cost_usd_per_million"] > 0
    assert "non-physical" not in response.text


def test_the_bounds_are_documented_in_openapi(client: ApiClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    fields = schemas["HardwareCreate"]["properties"]
    assert "1 MFLOP/s to 1 ZFLOP/s" in fields["peak_flops_per_s"]["description"]
    assert "1 MB/s to 1 EB/s" in fields["memory_bandwidth_bytes_per_s"]["description"]
    assert fields["memory_bandwidth_bytes_per_s"]["minimum"] == 1_000_000
    assert fields["memory_bytes"]["minimum"] == 2**20
    assert "0.01 W to 100 kW" in fields["tdp_watts"]["description"]
    peak = fields["peak_flops_per_s"]["additionalProperties"]
    assert (peak["minimum"], peak["maximum"]) == (1e6, 1e21)


def test_the_catalog_rejects_non_physical_entries(tmp_path: Path) -> None:
    source = (CATALOG_DIR / "nvidia-ampere.yaml").read_text(encoding="utf-8")
    assert "memory_bandwidth_bytes_per_s: " in source
    lines = source.splitlines()
    first = next(i for i, line in enumerate(lines) if "memory_bandwidth_bytes_per_s:" in line)
    indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
    lines[first] = f"{indent}memory_bandwidth_bytes_per_s: 0"
    (tmp_path / "nvidia-ampere.yaml").write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(
        CatalogError, match=r"memory_bandwidth_bytes_per_s: Input should be greater"
    ):
        load_catalog(tmp_path)


# --------------------------------------------------------------------------------------------
# Profiles stored before these checks: the domain guards them
# --------------------------------------------------------------------------------------------


def _corrupt(db_url: str, slug: str, **values: Any) -> None:
    """Write figures the schema would refuse straight into the row, as an old version could."""
    with db_session(db_url) as session:
        row = session.scalars(select(Hardware).where(Hardware.slug == slug)).one()
        for key, value in values.items():
            setattr(row, key, value)
        session.commit()


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"peak_flops_per_s": {"fp32": 1e-308, "fp16": 1e-308}}, "peak_flops_per_s[fp32] 1e-308"),
        ({"peak_flops_per_s": {"fp32": 5e-324, "fp16": 5e-324}}, "peak_flops_per_s[fp32] 5e-324"),
        ({"memory_bandwidth_bytes_per_s": 1}, "memory_bandwidth_bytes_per_s 1.0"),
        ({"host_link_bandwidth_bytes_per_s": 1}, "host_link.bandwidth_bytes_per_s 1.0"),
    ],
)
def test_a_stored_non_physical_profile_is_excluded_not_a_500(
    client: ApiClient, db_url: str, values: dict[str, Any], reason: str
) -> None:
    assert client.post("/v1/hardware", json=hardware()).status_code == 201
    _corrupt(db_url, "lab-gpu-1", **values)
    request = {"model": "resnet-50", "precisions": ["fp32"], "batch_sizes": [1]}
    response = client.post(RECOMMEND, json={**request, "devices": ["lab-gpu-1", "nvidia-a10"]})
    assert response.status_code == 200, response.text
    excluded = {e["device"]: e["reason"] for e in response.json()["excluded"]}
    assert excluded["lab-gpu-1"].startswith("non-physical figures in the hardware profile: ")
    assert reason in excluded["lab-gpu-1"]
    assert {c["device"] for c in response.json()["candidates"]} == {"nvidia-a10"}
    # the default request (every device and slice) still answers
    everything = client.post(RECOMMEND, json=request)
    assert everything.status_code == 200, everything.text
    excluded = {e["device"]: e["reason"] for e in everything.json()["excluded"]}
    assert reason in excluded["lab-gpu-1"]
    assert reason in excluded["lab-gpu-1/1g.3gb"]  # its MIG slices too
    # the roofline chart leaves it out, and says why; alone, it is a 422
    params = {"model": "resnet-50", "precision": "fp32", "batch_size": 1}
    chart = client.get(ROOFLINE, params={**params, "devices": "lab-gpu-1,nvidia-a10"})
    assert chart.status_code == 200, chart.text
    assert "lab-gpu-1 (non-physical figures" in chart.text
    problem = assert_problem(client.get(ROOFLINE, params={**params, "devices": "lab-gpu-1"}), 422)
    assert "non-physical figures" in problem["detail"]


def test_a_request_that_takes_no_time_is_a_422(client: ApiClient) -> None:
    """A model of views only on a CPU with zero overheads would divide by a zero latency."""
    views = {"inputs": [{"name": "x", "shape": ["batch", 4, 4]}], "layers": [
        {"name": "flat", "op": "flatten", "start_dim": 1}]}  # fmt: skip
    zero = {"kernel_launch_overhead_us": 0, "request_overhead_us": 0}
    body = {"architecture": views, "devices": ["intel-xeon-platinum-8480plus"],
            "precisions": ["fp32"], "batch_sizes": [1], "calibration": {"cpu": zero}}  # fmt: skip
    problem = assert_problem(client.post(RECOMMEND, json=body), 422)
    assert "would be 0 s" in problem["detail"]


@pytest.mark.parametrize(
    ("override", "pointer"),
    [
        ({"compute_efficiency": 5e-324}, "/calibration/cpu/compute_efficiency"),
        ({"memory_efficiency": 0}, "/calibration/cpu/memory_efficiency"),
        ({"host_link_efficiency": NAN}, "/calibration/cpu/host_link_efficiency"),
        ({"request_overhead_us": INF}, "/calibration/cpu/request_overhead_us"),
        ({"host_dispatch_us": -1}, "/calibration/cpu/host_dispatch_us"),
        ({"host_dispatch_us": 2e6}, "/calibration/cpu/host_dispatch_us"),
        ({"activation_cache_share": 1}, "/calibration/cpu/activation_cache_share"),
    ],
)
def test_non_physical_calibration_overrides_are_422(
    client: ApiClient, override: dict[str, float], pointer: str
) -> None:
    body = {"model": "resnet-50", "calibration": {"cpu": override}}
    problem = assert_problem(send(client, "POST", RECOMMEND, body), 422)
    assert pointers(problem) == [pointer]


@pytest.mark.parametrize(
    ("change", "pointer"),
    [
        ({"prices_usd_per_hour": {"nvidia-a10": -1e-308}}, "/prices_usd_per_hour/nvidia-a10"),
        ({"prices_usd_per_hour": {"nvidia-a10": INF}}, "/prices_usd_per_hour/nvidia-a10"),
        ({"latency_slo_ms": 5e-324}, "/latency_slo_ms"),
        ({"throughput_target_per_s": 1e-308}, "/throughput_target_per_s"),
        ({"throughput_target_per_s": NAN}, "/throughput_target_per_s"),
    ],
)
def test_non_physical_requirements_are_422(
    client: ApiClient, change: dict[str, Any], pointer: str
) -> None:
    problem = assert_problem(send(client, "POST", RECOMMEND, {"model": "resnet-50", **change}), 422)
    assert pointers(problem) == [pointer]


@pytest.mark.parametrize(
    ("change", "pointer", "message"),
    [
        ({"batch_sizes": [1, 8]}, "/batch_sizes", "batch_sizes must be [1] or left out"),
        ({"max_batch_size": 64}, "/max_batch_size", "max_batch_size would not be used"),
    ],
)
def test_a_single_stream_with_batches_is_a_422(
    client: ApiClient, change: dict[str, Any], pointer: str, message: str
) -> None:
    body = {"model": "resnet-50", "scenario": "single_stream", **change}
    problem = assert_problem(send(client, "POST", RECOMMEND, body), 422)
    assert pointers(problem) == [pointer]
    assert message in problem["detail"]


# --------------------------------------------------------------------------------------------
# Rules checked inside services
# --------------------------------------------------------------------------------------------


def test_a_micro_batch_that_does_not_divide_the_batch_is_a_422(
    client: ApiClient, db_url: str
) -> None:
    before = table_counts(db_url)
    body = {**WORKLOAD, "batch_size": 3, "options": {"micro_batch_size": 2}}
    problem = assert_problem(client.post("/v1/workloads", json=body), 422)
    assert pointers(problem) == ["/options/micro_batch_size"]
    assert "micro_batch_size 2 must divide batch_size 3" in problem["detail"]
    assert table_counts(db_url) == before
    assert client.post("/v1/workloads", json=WORKLOAD).status_code == 201
    put = {k: v for k, v in body.items() if k != "slug"}
    problem = assert_problem(
        client.put("/v1/workloads/chat", json=put, headers={"If-Match": '"1"'}), 422
    )
    assert pointers(problem) == ["/options/micro_batch_size"]
    assert client.get("/v1/workloads/chat").json()["batch_size"] == 4


@pytest.mark.parametrize(
    ("url", "body", "pointer"),
    [
        ("/v1/estimates/memory", {"mode": "inference", "batch_size": 1}, "/model"),
        ("/v1/estimates/memory", {**INLINE_ESTIMATE, "model": "gpt-2"}, "/architecture"),
        (
            "/v1/estimates/memory",
            {**INLINE_ESTIMATE, "batch_size": 6, "micro_batch_size": 4},
            "/micro_batch_size",
        ),
        (RECOMMEND, {}, "/model"),
    ],
)
def test_cross_field_rules_name_the_field(
    client: ApiClient, url: str, body: dict[str, Any], pointer: str
) -> None:
    problem = assert_problem(client.post(url, json=body), 422)
    assert pointers(problem) == [pointer]


# --------------------------------------------------------------------------------------------
# Errors that escape a service
# --------------------------------------------------------------------------------------------


def _route(app: FastAPI, path: str, raise_: Callable[[], None]) -> None:
    async def endpoint() -> None:
        raise_()

    app.add_api_route(path, endpoint, methods=["POST"])


def _pydantic_error() -> None:
    WorkloadInput.model_validate(
        {"model": "gpt-2", "mode": "inference", "batch_size": 0, "parallelism": {"tensor": 0}}
    )


def _recursion() -> None:
    def deeper(depth: int) -> int:
        return deeper(depth + 1) + 1

    deeper(0)


def _data_error() -> None:
    raise DataError("INSERT ...", {}, ValueError("A string literal cannot contain NUL (0x00)"))


def test_a_pydantic_error_escaping_a_service_is_a_422_with_pointers(client: ApiClient) -> None:
    _route(client.app, "/test/escape/pydantic", _pydantic_error)
    problem = assert_problem(client.post("/test/escape/pydantic"), 422, "invalid-input")
    assert sorted(pointers(problem)) == ["/batch_size", "/parallelism/tensor"]
    assert {e["location"] for e in problem["errors"]} == {"body"}


def test_recursion_escaping_a_service_is_a_422(client: ApiClient) -> None:
    _route(client.app, "/test/escape/recursion", _recursion)
    problem = assert_problem(client.post("/test/escape/recursion"), 422, "invalid-input")
    assert "nested too deeply" in problem["detail"]


def test_a_database_data_error_is_a_422_that_hides_the_sql(client: ApiClient) -> None:
    _route(client.app, "/test/escape/data", _data_error)
    problem = assert_problem(client.post("/test/escape/data"), 422, "invalid-input")
    assert "INSERT" not in problem["detail"]
    assert "nothing was written" in problem["detail"]


@pytest.mark.parametrize("depth", [100_000, 10_000, 900])
def test_deeply_nested_bodies_are_4xx(client: ApiClient, db_url: str, depth: int) -> None:
    before = table_counts(db_url)
    nested = "[" * depth + "]" * depth
    layers = '[{"name": "a", "op": "relu", "extra": ' + nested + "}]"
    text = json.dumps(model()).replace(json.dumps(MODEL["layers"]), layers)
    assert nested in text
    response = client.post("/v1/models", content=text, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text[:500]
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    assert table_counts(db_url) == before


@pytest.mark.parametrize("value", [NAN, INF, 1e308, -1e-5])
def test_non_finite_numbers_in_a_hugging_face_config_are_422(
    client: ApiClient, db_url: str, value: float
) -> None:
    before = table_counts(db_url)
    body = with_change(HF_IMPORT, ("config", "rms_norm_eps"), value)
    problem = assert_problem(send(client, "POST", "/v1/models/import/hf-config", body), 422)
    assert pointers(problem) == ["/config/rms_norm_eps"]
    assert table_counts(db_url) == before
