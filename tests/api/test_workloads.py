from typing import Any

import pytest

from tests.api.helpers import assert_problem, without_slug
from tests.support import ApiClient, ClientFactory, table_counts

CHAT: dict[str, Any] = {
    "slug": "chat-serving",
    "name": "Chat serving",
    "model": "gpt-2",
    "mode": "inference",
    "batch_size": 4,
    "sequence_length": 256,
    "precision": "bf16",
    "hardware": "nvidia-a100-80gb-sxm",
}


def workload(**changes: Any) -> dict[str, Any]:
    return {**CHAT, **changes}


def test_create_read_replace_delete(client: ApiClient) -> None:
    created = client.post("/v1/workloads", json=workload())
    assert created.status_code == 201, created.text
    assert created.headers["etag"] == '"1"'
    assert created.headers["location"] == "/v1/workloads/chat-serving"
    body = created.json()
    assert body["options"]["checkpointing"] == "none"
    assert client.get("/v1/workloads/chat-serving").json() == body
    listing = client.get("/v1/workloads", params={"model": "gpt-2", "mode": "inference"}).json()
    assert [item["slug"] for item in listing["items"]] == ["chat-serving"]
    assert client.get("/v1/workloads", params={"model": "bert-base"}).json()["total"] == 0

    bigger = without_slug(workload(batch_size=16))
    assert_problem(client.put("/v1/workloads/chat-serving", json=bigger), 428)
    replaced = client.put("/v1/workloads/chat-serving", json=bigger, headers={"If-Match": '"1"'})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["batch_size"] == 16
    assert_problem(
        client.put("/v1/workloads/chat-serving", json=bigger, headers={"If-Match": '"1"'}), 412
    )
    assert (
        client.delete("/v1/workloads/chat-serving", headers={"If-Match": '"2"'}).status_code == 204
    )
    assert_problem(client.get("/v1/workloads/chat-serving"), 404)


def test_workload_memory_matches_the_estimate(client: ApiClient) -> None:
    client.post("/v1/workloads", json=workload())
    memory = client.get("/v1/workloads/chat-serving/memory")
    assert memory.status_code == 200, memory.text
    estimate = client.post(
        "/v1/estimates/memory",
        json={k: v for k, v in CHAT.items() if k not in ("slug", "name")},
    ).json()
    assert memory.json()["peak_bytes"] == estimate["peak_bytes"]
    assert memory.json()["fit"]["hardware"] == "nvidia-a100-80gb-sxm"


def test_models_and_hardware_in_use_cannot_be_deleted(client: ApiClient) -> None:
    client.post(
        "/v1/models",
        json={
            "slug": "tiny",
            "name": "Tiny",
            "family": "mlp",
            "inputs": [{"name": "x", "shape": ["batch", 8]}],
            "layers": [{"name": "fc", "op": "linear", "out_features": 2}],
        },
    )
    created = client.post("/v1/workloads", json=workload(model="tiny", hardware=None))
    assert created.status_code == 201, created.text
    assert_problem(client.delete("/v1/models/tiny", headers={"If-Match": "*"}), 409, "in-use")


BAD = {
    "unknown model": (workload(model="gpt-9"), 422, "/model"),
    "unknown hardware": (workload(hardware="nvidia-x9"), 422, "/hardware"),
    "batch 0": (workload(batch_size=0), 422, "/batch_size"),
    "unknown precision": (workload(precision="fp7"), 422, "/precision"),
    "unknown option": (workload(options={"turbo": True}), 422, "/options/turbo"),
    "quantized training": (workload(mode="training", precision="int4"), 422, None),
    "bad slug": (workload(slug="Chat Serving"), 422, "/slug"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_workloads_are_rejected_and_nothing_is_written(
    client: ApiClient, db_url: str, case: str
) -> None:
    payload, status, pointer = BAD[case]
    before = table_counts(db_url)
    body = assert_problem(client.post("/v1/workloads", json=payload), status)
    if pointer is not None:
        assert any(e["pointer"].startswith(pointer) for e in body["errors"]), body
    assert table_counts(db_url) == before


def test_duplicate_workload_is_409(client: ApiClient, db_url: str) -> None:
    client.post("/v1/workloads", json=workload())
    before = table_counts(db_url)
    assert_problem(client.post("/v1/workloads", json=workload()), 409, "already-exists")
    assert table_counts(db_url) == before


def test_writes_need_a_key_when_configured(make_client: ClientFactory) -> None:
    client = make_client(api_keys="k-123456")
    assert_problem(client.post("/v1/workloads", json=workload()), 401)
    ok = client.post("/v1/workloads", json=workload(), headers={"X-API-Key": "k-123456"})
    assert ok.status_code == 201
