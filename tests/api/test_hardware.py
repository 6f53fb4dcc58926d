from collections.abc import Callable
from typing import Any

import pytest

from tests.api.helpers import assert_problem, hardware, without_slug
from tests.support import ApiClient, table_counts

A100_80GB = "nvidia-a100-80gb-sxm"
A100_80GB_PROFILES = [
    "1g.10gb",
    "1g.10gb+me",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
]


def test_catalog_is_listed_with_at_least_25_devices(client: ApiClient) -> None:
    response = client.get("/v1/hardware", params={"limit": 500})
    assert response.status_code == 200
    body = response.json()
    assert body["total"] >= 25
    assert len(body["items"]) == body["total"]
    slugs = [item["slug"] for item in body["items"]]
    assert slugs == sorted(slugs)
    assert all(item["source"] == "catalog" for item in body["items"])


def test_a100_80gb_shows_its_seven_mig_profiles(client: ApiClient) -> None:
    response = client.get(f"/v1/hardware/{A100_80GB}")
    assert response.status_code == 200
    assert response.headers["etag"] == '"1"'
    body = response.json()
    assert body["memory_bytes"] == 80 * 2**30
    assert body["mig"]["total_compute_slices"] == 7
    profiles = body["mig"]["profiles"]
    assert [p["name"] for p in profiles] == A100_80GB_PROFILES
    one_g = profiles[0]
    assert one_g["memory_bytes"] == one_g["memory_mib"] * 2**20
    assert one_g["kubernetes_resource"] == "nvidia.com/mig-1g.10gb"
    assert profiles[1]["kubernetes_resource"] == "nvidia.com/mig-1g.10gb.me"


def test_a100_40gb_1g_profile_uses_the_driver_reported_size(client: ApiClient) -> None:
    body = client.get("/v1/hardware/nvidia-a100-40gb-sxm").json()
    one_g = next(p for p in body["mig"]["profiles"] if p["name"] == "1g.5gb")
    assert one_g["memory_mib"] == 4864  # DESIGN.md: not 5 GB


@pytest.mark.parametrize(
    ("params", "check"),
    [
        ({"kind": "cpu"}, lambda item: item["kind"] == "cpu"),
        ({"vendor": "nvidia"}, lambda item: item["vendor"] == "NVIDIA"),
        ({"family": "nvidia-hopper"}, lambda item: item["family"] == "nvidia-hopper"),
        ({"mig_capable": "true"}, lambda item: item["mig"] is not None),
        ({"mig_capable": "false"}, lambda item: item["mig"] is None),
        ({"source": "catalog"}, lambda item: item["source"] == "catalog"),
    ],
)
def test_list_filters(
    client: ApiClient, params: dict[str, str], check: Callable[[dict[str, Any]], bool]
) -> None:
    body = client.get("/v1/hardware", params={**params, "limit": 500}).json()
    assert body["total"] > 0
    assert all(check(item) for item in body["items"])


def test_pagination_is_stable(client: ApiClient) -> None:
    everything = client.get("/v1/hardware", params={"limit": 500}).json()["items"]
    page = client.get("/v1/hardware", params={"limit": 5, "offset": 5}).json()
    assert page["limit"] == 5
    assert page["offset"] == 5
    assert [i["slug"] for i in page["items"]] == [i["slug"] for i in everything[5:10]]


def test_create_read_replace_delete_with_etags(client: ApiClient) -> None:
    created = client.post("/v1/hardware", json=hardware())
    assert created.status_code == 201, created.text
    assert created.headers["location"] == "/v1/hardware/lab-gpu-1"
    assert created.headers["etag"] == '"1"'
    assert created.json()["source"] == "user"
    assert created.json()["mig"]["profiles"][0]["memory_bytes"] == 3072 * 2**20

    fetched = client.get("/v1/hardware/lab-gpu-1")
    assert fetched.json() == created.json()

    changed = without_slug(hardware(tdp_watts=250))
    changed["mig"]["profiles"] = changed["mig"]["profiles"][:1]
    replaced = client.put("/v1/hardware/lab-gpu-1", json=changed, headers={"If-Match": '"1"'})
    assert replaced.status_code == 200, replaced.text
    assert replaced.headers["etag"] == '"2"'
    assert replaced.json()["tdp_watts"] == 250
    assert [p["name"] for p in replaced.json()["mig"]["profiles"]] == ["1g.3gb"]

    deleted = client.delete("/v1/hardware/lab-gpu-1", headers={"If-Match": '"2"'})
    assert deleted.status_code == 204
    assert_problem(client.get("/v1/hardware/lab-gpu-1"), 404, "not-found")


def test_if_match_star_matches_any_version(client: ApiClient) -> None:
    client.post("/v1/hardware", json=hardware())
    response = client.put(
        "/v1/hardware/lab-gpu-1", json=without_slug(hardware()), headers={"If-Match": "*"}
    )
    assert response.status_code == 200


def test_stale_etag_is_412_and_writes_nothing(client: ApiClient, db_url: str) -> None:
    client.post("/v1/hardware", json=hardware())
    first = client.put(
        "/v1/hardware/lab-gpu-1",
        json=without_slug(hardware(name="v2")),
        headers={"If-Match": '"1"'},
    )
    assert first.status_code == 200
    before = table_counts(db_url)
    stale = client.put(
        "/v1/hardware/lab-gpu-1",
        json=without_slug(hardware(name="v3")),
        headers={"If-Match": '"1"'},
    )
    body = assert_problem(stale, 412, "stale-version")
    assert '"2"' in body["detail"]
    assert client.get("/v1/hardware/lab-gpu-1").json()["name"] == "v2"
    assert_problem(client.delete("/v1/hardware/lab-gpu-1", headers={"If-Match": '"1"'}), 412)
    assert table_counts(db_url) == before


def test_weak_etag_does_not_satisfy_if_match(client: ApiClient) -> None:
    client.post("/v1/hardware", json=hardware())
    response = client.put(
        "/v1/hardware/lab-gpu-1", json=without_slug(hardware()), headers={"If-Match": 'W/"1"'}
    )
    assert_problem(response, 412)


def test_missing_if_match_is_428(client: ApiClient) -> None:
    client.post("/v1/hardware", json=hardware())
    assert_problem(
        client.put("/v1/hardware/lab-gpu-1", json=without_slug(hardware())),
        428,
        "if-match-required",
    )
    assert_problem(client.delete("/v1/hardware/lab-gpu-1"), 428)
    assert client.get("/v1/hardware/lab-gpu-1").status_code == 200


def test_duplicate_slug_is_409_and_writes_nothing(client: ApiClient, db_url: str) -> None:
    client.post("/v1/hardware", json=hardware())
    before = table_counts(db_url)
    body = assert_problem(client.post("/v1/hardware", json=hardware()), 409, "already-exists")
    assert "lab-gpu-1" in body["detail"]
    assert table_counts(db_url) == before


def test_catalog_slug_cannot_be_taken(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    assert_problem(client.post("/v1/hardware", json=hardware(slug=A100_80GB)), 409)
    assert table_counts(db_url) == before


def test_catalog_entries_are_read_only(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    put = client.put(
        f"/v1/hardware/{A100_80GB}", json=without_slug(hardware()), headers={"If-Match": '"1"'}
    )
    body = assert_problem(put, 409, "read-only")
    assert "catalog" in body["detail"]
    assert_problem(
        client.delete(f"/v1/hardware/{A100_80GB}", headers={"If-Match": '"1"'}), 409, "read-only"
    )
    assert table_counts(db_url) == before
    assert client.get(f"/v1/hardware/{A100_80GB}").json()["version"] == 1


def test_unknown_slug_is_404_for_every_method(client: ApiClient) -> None:
    for method, kwargs in [
        ("GET", {}),
        ("PUT", {"json": without_slug(hardware()), "headers": {"If-Match": "*"}}),
        ("DELETE", {"headers": {"If-Match": "*"}}),
    ]:
        response = client.request(method, "/v1/hardware/no-such-gpu", **kwargs)
        body = assert_problem(response, 404, "not-found")
        assert "no-such-gpu" in body["detail"]


def _mig(**changes: Any) -> dict[str, Any]:
    mig: dict[str, Any] = hardware()["mig"]
    mig.update(changes)
    return mig


def _profile(**changes: Any) -> dict[str, Any]:
    profile: dict[str, Any] = dict(hardware()["mig"]["profiles"][0])
    profile.update(changes)
    return profile


BAD_HARDWARE = {
    "negative memory": (hardware(memory_bytes=-1), "/memory_bytes"),
    "zero memory": (hardware(memory_bytes=0), "/memory_bytes"),
    "zero bandwidth": (hardware(memory_bandwidth_bytes_per_s=0), "/memory_bandwidth_bytes_per_s"),
    "memory as text": (hardware(memory_bytes="lots"), "/memory_bytes"),
    "memory as float": (hardware(memory_bytes=1.5), "/memory_bytes"),
    "memory overflows bigint": (hardware(memory_bytes=2**64), "/memory_bytes"),
    "unknown dtype": (hardware(peak_flops_per_s={"fp7": 1e12}), "/peak_flops_per_s/fp7"),
    "zero peak": (hardware(peak_flops_per_s={"fp32": 0}), "/peak_flops_per_s/fp32"),
    "empty peaks": (hardware(peak_flops_per_s={}), "/peak_flops_per_s"),
    "unknown field": (hardware(colour="green"), "/colour"),
    "unknown nested field": (
        hardware(host_link={"type": "PCIe", "speed": "fast"}),
        "/host_link/speed",
    ),
    "unknown kind": (hardware(kind="fpga"), "/kind"),
    "zero gpu link": (
        hardware(gpu_link={"type": "NVLink", "bandwidth_bytes_per_s": 0}),
        "/gpu_link/bandwidth_bytes_per_s",
    ),
    "gpu link without bandwidth": (hardware(gpu_link={"type": "NVLink"}), "/gpu_link"),
    "bad slug": (hardware(slug="Not A Slug"), "/slug"),
    "missing field": ({k: v for k, v in hardware().items() if k != "vendor"}, "/vendor"),
    "negative tdp": (hardware(tdp_watts=-5), "/tdp_watts"),
    "mig on a cpu": (hardware(kind="cpu"), "/"),
    "mig placement past the end": (
        hardware(mig=_mig(profiles=[_profile(memory_slices=2, placements=[7])])),
        "/mig",
    ),
    "duplicate mig profile": (hardware(mig=_mig(profiles=[_profile(), _profile()])), "/mig"),
    "bad mig profile name": (hardware(mig=_mig(profiles=[_profile(name="tiny")])), "/mig"),
    "zero mig memory": (hardware(mig=_mig(profiles=[_profile(memory_mib=0)])), "/mig"),
    "zero sm count": (hardware(sm_count=0), "/sm_count"),
    "negative sm count": (hardware(sm_count=-108), "/sm_count"),
    "fractional sm count": (hardware(sm_count=107.5), "/sm_count"),
    "sm count as text": (hardware(sm_count="108"), "/sm_count"),
    "sm count as bool": (hardware(sm_count=True), "/sm_count"),
    "absurd sm count": (hardware(sm_count=10**9), "/sm_count"),
    "sm count on a cpu": (hardware(kind="cpu", mig=None, sm_count=64), "/sm_count"),
    "mig profile with more sms than its gpu": (
        hardware(sm_count=108, mig=_mig(profiles=[_profile(sm_count=109)])),
        "/mig/profiles/0/sm_count",
    ),
    "zero mig profile sm count": (
        hardware(mig=_mig(profiles=[_profile(sm_count=0)])),
        "/mig/profiles/0/sm_count",
    ),
    "fractional mig profile sm count": (
        hardware(mig=_mig(profiles=[_profile(sm_count=14.5)])),
        "/mig/profiles/0/sm_count",
    ),
    "mig profile sm count as text": (
        hardware(mig=_mig(profiles=[_profile(sm_count="14")])),
        "/mig/profiles/0/sm_count",
    ),
    "mig profile sm count as bool": (
        hardware(mig=_mig(profiles=[_profile(sm_count=True)])),
        "/mig/profiles/0/sm_count",
    ),
}


@pytest.mark.parametrize("case", list(BAD_HARDWARE))
def test_bad_hardware_is_422_naming_the_field_and_writes_nothing(
    client: ApiClient, db_url: str, case: str
) -> None:
    payload, pointer = BAD_HARDWARE[case]
    before = table_counts(db_url)
    body = assert_problem(client.post("/v1/hardware", json=payload), 422, "validation-error")
    pointers = [error["pointer"] for error in body["errors"]]
    assert any(p.startswith(pointer) for p in pointers), pointers
    assert table_counts(db_url) == before


def test_bad_replacement_is_422_and_keeps_the_old_version(client: ApiClient, db_url: str) -> None:
    client.post("/v1/hardware", json=hardware())
    before = table_counts(db_url)
    response = client.put(
        "/v1/hardware/lab-gpu-1",
        json=without_slug(hardware(memory_bytes=-1)),
        headers={"If-Match": '"1"'},
    )
    assert_problem(response, 422)
    assert table_counts(db_url) == before
    assert client.get("/v1/hardware/lab-gpu-1").json()["version"] == 1


def test_slug_in_put_body_is_rejected(client: ApiClient) -> None:
    client.post("/v1/hardware", json=hardware())
    response = client.put("/v1/hardware/lab-gpu-1", json=hardware(), headers={"If-Match": "*"})
    assert_problem(response, 422)


def test_malformed_json_is_400(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    response = client.post(
        "/v1/hardware", content=b'{"slug": "x",', headers={"content-type": "application/json"}
    )
    body = assert_problem(response, 400, "malformed-json")
    assert "character" in body["detail"]
    assert table_counts(db_url) == before


def test_bad_query_parameters_are_422(client: ApiClient) -> None:
    for params in ({"limit": 0}, {"limit": 501}, {"offset": -1}, {"kind": "fpga"}):
        body = assert_problem(client.get("/v1/hardware", params=params), 422)
        assert body["errors"][0]["location"] == "query"


def test_the_gpu_link_round_trips_and_the_catalog_has_nvlink(client: ApiClient) -> None:
    link = {"type": "NVLink 4 (18 links)", "bandwidth_bytes_per_s": 450_000_000_000}
    created = client.post("/v1/hardware", json=hardware(gpu_link=link))
    assert created.status_code == 201, created.text
    assert client.get("/v1/hardware/lab-gpu-1").json()["gpu_link"] == link
    h100 = client.get("/v1/hardware/nvidia-h100-sxm").json()
    assert h100["gpu_link"]["bandwidth_bytes_per_s"] == 450_000_000_000  # 900 GB/s both ways
    assert client.get("/v1/hardware/nvidia-l4").json()["gpu_link"] is None  # PCIe only


def test_sm_count_is_created_replaced_and_cleared(client: ApiClient) -> None:
    created = client.post("/v1/hardware", json=hardware(sm_count=108))
    assert created.status_code == 201
    assert created.json()["sm_count"] == 108
    assert client.get("/v1/hardware/lab-gpu-1").json()["sm_count"] == 108
    replaced = client.put(
        "/v1/hardware/lab-gpu-1",
        json=without_slug(hardware(sm_count=132)),
        headers={"If-Match": '"1"'},
    )
    assert replaced.status_code == 200
    assert replaced.json()["sm_count"] == 132
    cleared = client.put(
        "/v1/hardware/lab-gpu-1", json=without_slug(hardware()), headers={"If-Match": '"2"'}
    )
    assert cleared.json()["sm_count"] is None


def test_catalog_gpus_carry_their_sm_count(client: ApiClient) -> None:
    assert client.get(f"/v1/hardware/{A100_80GB}").json()["sm_count"] == 108
    assert client.get("/v1/hardware/nvidia-h100-pcie").json()["sm_count"] == 114
    assert client.get("/v1/hardware/intel-xeon-platinum-8480plus").json()["sm_count"] is None


def test_mig_profile_sm_counts_are_created_read_replaced_and_cleared(client: ApiClient) -> None:
    small, whole = hardware()["mig"]["profiles"]
    payload = hardware(
        sm_count=108,
        mig=_mig(profiles=[{**small, "sm_count": 14}, {**whole, "sm_count": 98}]),
    )
    created = client.post("/v1/hardware", json=payload)
    assert created.status_code == 201, created.text
    assert [p["sm_count"] for p in created.json()["mig"]["profiles"]] == [14, 98]
    read = client.get("/v1/hardware/lab-gpu-1").json()
    assert [p["sm_count"] for p in read["mig"]["profiles"]] == [14, 98]
    listed = client.get("/v1/hardware/lab-gpu-1/mig-profiles").json()
    assert {p["name"]: p["sm_count"] for p in listed["profiles"]} == {"1g.3gb": 14, "7g.24gb": 98}
    replaced = client.put(
        "/v1/hardware/lab-gpu-1",
        json=without_slug(hardware(sm_count=108, mig=_mig(profiles=[{**small, "sm_count": 15}]))),
        headers={"If-Match": '"1"'},
    )
    assert replaced.status_code == 200, replaced.text
    assert [p["sm_count"] for p in replaced.json()["mig"]["profiles"]] == [15]
    cleared = client.put(
        "/v1/hardware/lab-gpu-1", json=without_slug(hardware()), headers={"If-Match": '"2"'}
    )
    assert [p["sm_count"] for p in cleared.json()["mig"]["profiles"]] == [None, None]


def test_a_profile_sm_count_needs_no_gpu_count_and_may_equal_it(client: ApiClient) -> None:
    small, whole = hardware()["mig"]["profiles"]
    alone = hardware(mig=_mig(profiles=[{**small, "sm_count": 14}]))
    assert client.post("/v1/hardware", json=alone).status_code == 201
    equal = hardware(slug="lab-gpu-2", sm_count=98, mig=_mig(profiles=[{**whole, "sm_count": 98}]))
    assert client.post("/v1/hardware", json=equal).status_code == 201


def test_a_bad_profile_sm_count_in_a_replacement_keeps_the_old_version(
    client: ApiClient, db_url: str
) -> None:
    small = hardware()["mig"]["profiles"][0]
    client.post("/v1/hardware", json=hardware(sm_count=108))
    before = table_counts(db_url)
    response = client.put(
        "/v1/hardware/lab-gpu-1",
        json=without_slug(hardware(sm_count=108, mig=_mig(profiles=[{**small, "sm_count": 200}]))),
        headers={"If-Match": '"1"'},
    )
    body = assert_problem(response, 422, "validation-error")
    assert [e["pointer"] for e in body["errors"]] == ["/mig/profiles/0/sm_count"]
    assert "sm_count 200 exceeds the GPU's sm_count 108" in response.text
    assert table_counts(db_url) == before
    stored = client.get("/v1/hardware/lab-gpu-1").json()
    assert stored["version"] == 1
    assert [p["sm_count"] for p in stored["mig"]["profiles"]] == [None, None]


def test_catalog_mig_profiles_carry_nvidias_sm_counts(client: ApiClient) -> None:
    a100 = client.get(f"/v1/hardware/{A100_80GB}").json()
    assert {p["name"]: p["sm_count"] for p in a100["mig"]["profiles"]} == {
        "1g.10gb": 14, "1g.10gb+me": 14, "1g.20gb": 14, "2g.20gb": 28, "3g.40gb": 42,
        "4g.40gb": 56, "7g.80gb": 98,
    }  # fmt: skip
    h100 = client.get("/v1/hardware/nvidia-h100-sxm").json()
    assert next(p for p in h100["mig"]["profiles"] if p["name"] == "1g.20gb")["sm_count"] == 26
    pcie = client.get("/v1/hardware/nvidia-h100-pcie").json()
    assert all(p["sm_count"] is None for p in pcie["mig"]["profiles"])  # SXM5 counts only
