"""Prices carry their kind, region, date and source; recommendations compare like with like
and keep a margin under the latency SLO."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.services.catalog import CatalogError, load_catalog
from tests.api.helpers import assert_problem, hardware
from tests.support import CATALOG_DIR, ApiClient, table_counts

URL = "/v1/recommendations/inference"
H200_SLICE = "nvidia-h200-sxm/1g.18gb"
H100_SLICE = "nvidia-h100-sxm/1g.10gb"


def _recommend(client: ApiClient, **body: Any) -> dict[str, Any]:
    response = client.post(URL, json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _pointers(body: dict[str, Any]) -> list[str]:
    return [error["pointer"] for error in body["errors"]]


# --------------------------------------------------------------------------------------------
# The catalog and the hardware API
# --------------------------------------------------------------------------------------------


def test_catalog_prices_say_their_kind_region_and_source(client: ApiClient) -> None:
    entries = {e.slug: e for e in load_catalog(CATALOG_DIR)}
    priced = {slug: e for slug, e in entries.items() if e.price_usd_per_hour is not None}
    assert set(priced) == {
        "nvidia-a10",
        "nvidia-a100-40gb-sxm",
        "nvidia-h100-sxm",
        "nvidia-h200-sxm",
    }  # the reference's figures, no more
    for entry in priced.values():
        assert entry.price_kind is not None
        assert entry.price_source
    h200 = client.get("/v1/hardware/nvidia-h200-sxm").json()
    assert (h200["price_usd_per_hour"], h200["price_kind"], h200["price_region"]) == (
        5.408,
        "reserved",
        "us-east-2",
    )
    assert h200.get("price_date") is None  # the reference records its prices undated
    assert "Capacity Blocks" in h200["price_source"]
    a10 = client.get("/v1/hardware/nvidia-a10").json()
    assert (a10["price_kind"], a10["price_region"]) == ("on_demand", "us-east-1")
    unpriced = client.get("/v1/hardware/nvidia-t4").json()
    assert unpriced["price_usd_per_hour"] is None
    assert unpriced["price_kind"] is None


def test_a_catalog_price_without_its_kind_is_rejected(tmp_path: Path) -> None:
    data = yaml.safe_load((CATALOG_DIR / "nvidia-ampere.yaml").read_text())
    del data["devices"][0]["price_kind"]
    (tmp_path / "nvidia-ampere.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(CatalogError, match=r"nvidia-ampere.yaml: devices.0.price_kind: .*kind"):
        load_catalog(tmp_path)
    data["devices"][0]["price_kind"] = "list"
    (tmp_path / "nvidia-ampere.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(CatalogError, match=r"devices.0.price_kind"):
        load_catalog(tmp_path)


def test_a_price_is_stored_and_read_with_its_kind_region_date_and_source(
    client: ApiClient,
) -> None:
    body = hardware(
        price_usd_per_hour=2.25,
        price_kind="spot",
        price_region="eu-west-1",
        price_date="2026-10-31",
        price_source="lab quote",
    )
    created = client.post("/v1/hardware", json=body)
    assert created.status_code == 201, created.text
    read = client.get("/v1/hardware/lab-gpu-1").json()
    assert {k: v for k, v in read.items() if k.startswith("price")} == {
        "price_usd_per_hour": 2.25,
        "price_kind": "spot",
        "price_region": "eu-west-1",
        "price_date": "2026-10-31",
        "price_source": "lab quote",
    }
    # a spot price is ranked by spot prices only
    spot = _recommend(
        client,
        model="resnet-50",
        devices=["lab-gpu-1", "nvidia-a10"],
        precisions=["fp16"],
        batch_sizes=[8],
        price_kind="spot",
    )
    first, second = spot["candidates"]
    assert first["device"] == "lab-gpu-1"
    assert first["inputs"]["price_kind"] == "spot"
    assert first["inputs"]["price_date"] == "2026-10-31"
    assert first["cost_usd_per_million"] == pytest.approx(
        2.25 / 3600 / first["throughput_per_s"] * 1e6
    )
    assert second.get("cost_usd_per_million") is None
    assert "its price is on_demand" in second["unpriced_reason"]


TODAY = datetime.now(UTC).date()
BAD_PRICES: list[tuple[dict[str, Any], str]] = [
    ({"price_kind": "list"}, "/price_kind"),
    ({"price_kind": "On-Demand"}, "/price_kind"),
    ({"price_kind": None}, "/price_kind"),  # a price must say its kind
    ({"price_date": "2026-13-01"}, "/price_date"),
    ({"price_date": "2026-02-30"}, "/price_date"),
    ({"price_date": "01/02/2026"}, "/price_date"),
    ({"price_date": "2026-01-01T00:00:00Z"}, "/price_date"),
    ({"price_date": 1_767_225_600}, "/price_date"),
    ({"price_date": "1999-12-31"}, "/price_date"),
    ({"price_date": (TODAY + timedelta(days=5)).isoformat()}, "/price_date"),
    ({"price_region": ""}, "/price_region"),
    ({"price_region": "r" * 65}, "/price_region"),
    ({"price_source": "s" * 501}, "/price_source"),
    # a price's description without a price
    ({"price_usd_per_hour": None}, "/price_kind"),
    ({"price_usd_per_hour": None, "price_kind": None, "price_date": "2026-01-02"}, "/price_date"),
]


@pytest.mark.parametrize(
    ("change", "pointer"), BAD_PRICES, ids=[json.dumps(c) for c, _ in BAD_PRICES]
)
def test_bad_prices_are_422_and_nothing_is_written(
    client: ApiClient, db_url: str, change: dict[str, Any], pointer: str
) -> None:
    before = table_counts(db_url)
    response = client.post("/v1/hardware", json=hardware(**change))
    body = assert_problem(response, 422, "validation-error")
    assert _pointers(body) == [pointer], body["errors"]
    assert table_counts(db_url) == before
    assert client.get("/v1/hardware/lab-gpu-1").status_code == 404


def test_a_bad_price_on_replace_changes_nothing(client: ApiClient) -> None:
    assert client.post("/v1/hardware", json=hardware()).status_code == 201
    put = {k: v for k, v in hardware(price_kind="hourly").items() if k != "slug"}
    response = client.put("/v1/hardware/lab-gpu-1", json=put, headers={"If-Match": '"1"'})
    assert _pointers(assert_problem(response, 422)) == ["/price_kind"]
    after = client.get("/v1/hardware/lab-gpu-1")
    assert after.json()["price_kind"] == "on_demand"
    assert after.headers["etag"] == '"1"'


# --------------------------------------------------------------------------------------------
# Recommendations: like with like
# --------------------------------------------------------------------------------------------


def test_costs_compare_on_demand_prices_by_default(client: ApiClient) -> None:
    body = _recommend(
        client,
        model="resnet-50",
        devices=["nvidia-a10", H100_SLICE, H200_SLICE],
        precisions=["int8"],
        batch_sizes=[8],
    )
    assert body["price_kind"] == "on_demand"
    by_device = {c["device"]: c for c in body["candidates"]}
    h200 = by_device[H200_SLICE]
    assert h200.get("cost_usd_per_million") is None
    assert not h200["eligible"]
    assert h200["unpriced_reason"] == (
        "no on_demand price: its price is reserved (0.7726 USD/h), not compared with "
        "on_demand prices (price_kind=reserved ranks by those)"
    )  # 5.408 / 7 for one of seven compute slices
    assert h200["inputs"]["price_kind"] == "reserved"
    assert h200["inputs"]["price_region"] == "us-east-2"
    assert h200["rank"] == 3  # after every device priced on demand
    a10 = by_device["nvidia-a10"]
    assert a10["eligible"]
    assert a10.get("unpriced_reason") is None
    assert a10["inputs"]["price_kind"] == "on_demand"
    assert a10["inputs"]["price_region"] == "us-east-1"
    assert a10["inputs"].get("price_date") is None
    assert a10["inputs"]["price_source"].startswith("catalog: AWS g5.xlarge")
    assert by_device[H100_SLICE]["eligible"]
    assert by_device[H100_SLICE]["cost_usd_per_million"] == pytest.approx(
        12.29 / 7 / 3600 / by_device[H100_SLICE]["throughput_per_s"] * 1e6
    )
    line = body["assumptions"][-1]
    assert line.startswith("costs use on_demand prices only, per whole device [USD/h]: ")
    assert "nvidia-a10 1.006 (us-east-1, date unknown, catalog)" in line
    assert "nvidia-h100-sxm 12.29 (us-east-1, date unknown, catalog)" in line
    assert "not ranked by cost: priced with another kind: nvidia-h200-sxm (reserved)" in line
    assert "costs compare on_demand prices only" in body["recommendation"]
    assert "1 device(s) have no on_demand price" in body["recommendation"]


def test_price_kind_reserved_ranks_the_reservations(client: ApiClient) -> None:
    body = _recommend(
        client,
        model="resnet-50",
        devices=["nvidia-a10", H200_SLICE],
        precisions=["int8"],
        batch_sizes=[8],
        price_kind="reserved",
    )
    first, second = body["candidates"]
    assert (first["device"], first["eligible"]) == (H200_SLICE, True)
    assert first["cost_usd_per_million"] == pytest.approx(
        5.408 / 7 / 3600 / first["throughput_per_s"] * 1e6
    )
    assert (second["device"], second["eligible"]) == ("nvidia-a10", False)
    assert "cost_usd_per_million" not in second  # nulls are left out
    assert "its price is on_demand" in second["unpriced_reason"]
    assert "nvidia-h200-sxm 5.408 (us-east-2, date unknown, catalog)" in body["assumptions"][-1]


def test_request_prices_are_of_the_requested_kind(client: ApiClient) -> None:
    body = _recommend(
        client,
        model="resnet-50",
        devices=["nvidia-a10", H200_SLICE],
        precisions=["int8"],
        batch_sizes=[8],
        price_kind="spot",
        prices_usd_per_hour={"nvidia-a10": 0.4},
    )
    first, second = body["candidates"]
    assert first["device"] == "nvidia-a10"
    assert first["inputs"]["price_kind"] == "spot"
    assert first["inputs"]["price_source"] == "request"
    assert first["inputs"].get("price_region") is None
    assert second.get("cost_usd_per_million") is None
    assert "nvidia-a10 0.4 (region not stated, date unknown, request)" in body["assumptions"][-1]


# --------------------------------------------------------------------------------------------
# Recommendations: the SLO margin
# --------------------------------------------------------------------------------------------


def test_a_latency_within_the_margin_does_not_meet_the_slo(client: ApiClient) -> None:
    base = {
        "model": "resnet-50",
        "devices": ["nvidia-a10"],
        "precisions": ["int8"],
        "batch_sizes": [8],
    }
    latency = _recommend(client, **base)["candidates"][0]["latency_ms"]
    slo = latency / 0.995  # the 4,976 ms against 5,000 ms
    body = _recommend(client, **base, latency_slo_ms=slo)
    assert body["slo_margin"] == 0.1
    assert body["latency_budget_ms"] == pytest.approx(slo * 0.9)
    (candidate,) = body["candidates"]
    assert not candidate["meets_latency_slo"]
    assert not candidate["eligible"]
    assert any("is within the 10% margin of the" in r for r in candidate["reasons"])
    assert body["recommendation"].startswith("No candidate meets every requirement")
    exact = _recommend(client, **base, latency_slo_ms=slo, slo_margin=0)
    assert exact["slo_margin"] == 0
    assert exact["latency_budget_ms"] == pytest.approx(slo)
    assert exact["candidates"][0]["meets_latency_slo"]
    assert exact["recommendation"].startswith("Run resnet-50 on NVIDIA A10")
    roomy = _recommend(client, **base, latency_slo_ms=latency * 2, slo_margin=0.25)
    assert roomy["candidates"][0]["eligible"]
    assert f"({latency * 2 * 0.75:.3g} ms budget with its 25% margin)" in roomy["recommendation"]
    no_slo = _recommend(client, **base)
    assert "slo_margin" not in no_slo
    assert "latency_budget_ms" not in no_slo


BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"price_kind": "list"}, "/price_kind"),
    ({"price_kind": "ON_DEMAND"}, "/price_kind"),
    ({"price_kind": None}, "/price_kind"),
    ({"latency_slo_ms": 20, "slo_margin": -0.01}, "/slo_margin"),
    ({"latency_slo_ms": 20, "slo_margin": 0.95}, "/slo_margin"),
    ({"latency_slo_ms": 20, "slo_margin": 1}, "/slo_margin"),
    ({"latency_slo_ms": 20, "slo_margin": "ten percent"}, "/slo_margin"),
    ({"latency_slo_ms": 20, "slo_margin": None}, "/slo_margin"),
    ({"slo_margin": 0.1}, "/slo_margin"),  # a margin under no SLO
]


@pytest.mark.parametrize(
    ("change", "pointer"), BAD_OPTIONS, ids=[json.dumps(c) for c, _ in BAD_OPTIONS]
)
def test_bad_price_kind_or_margin_is_422(
    client: ApiClient, db_url: str, change: dict[str, Any], pointer: str
) -> None:
    before = table_counts(db_url)
    response = client.post(URL, json={"model": "resnet-50", "devices": ["nvidia-a10"], **change})
    body = assert_problem(response, 422, "validation-error")
    assert pointer in _pointers(body), body["errors"]
    assert table_counts(db_url) == before


def test_a_margin_that_is_not_a_finite_number_is_422(client: ApiClient) -> None:
    for text in ("NaN", "Infinity"):
        response = client.post(
            URL,
            content=f'{{"model": "resnet-50", "latency_slo_ms": 20, "slo_margin": {text}}}',
            headers={"content-type": "application/json"},
        )
        assert _pointers(assert_problem(response, 422)) == ["/slo_margin"]


def test_the_new_options_are_documented(client: ApiClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    request = schemas["InferenceRecommendationRequest"]["properties"]
    assert request["slo_margin"]["default"] == 0.1
    assert "benchmarks/calibration/README.md" in request["slo_margin"]["description"]
    assert request["price_kind"]["default"] == "on_demand"
    hardware_fields = schemas["HardwareCreate"]["properties"]
    for name in ("price_kind", "price_region", "price_date", "price_source"):
        assert hardware_fields[name]["description"], name
    assert schemas["PriceKind"]["enum"] == ["on_demand", "reserved", "spot"]
