from typing import Any

import pytest
from sqlalchemy import text

from app.db.session import make_engine
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


SLICE = "nvidia-a100-80gb-sxm/3g.40gb"


def test_a_workload_on_one_mig_slice(client: ApiClient) -> None:
    """`hardware: "slug/profile"` is stored as written, and the workload's memory fit is the
    estimate endpoint's fit on that slice (its profile's usable memory, not the GPU's)."""
    created = client.post("/v1/workloads", json=workload(hardware=SLICE))
    assert created.status_code == 201, created.text
    assert created.json()["hardware"] == SLICE
    assert client.get("/v1/workloads/chat-serving").json()["hardware"] == SLICE
    listing = client.get("/v1/workloads").json()
    assert [item["hardware"] for item in listing["items"]] == [SLICE]

    memory = client.get("/v1/workloads/chat-serving/memory")
    assert memory.status_code == 200, memory.text
    on_slice = {k: v for k, v in CHAT.items() if k not in ("slug", "name")} | {"hardware": SLICE}
    estimate = client.post("/v1/estimates/memory", json=on_slice)
    assert estimate.status_code == 200, estimate.text
    fit = memory.json()["fit"]
    assert fit == estimate.json()["fit"]
    assert fit["hardware"] == SLICE
    gpu = client.get("/v1/hardware/nvidia-a100-80gb-sxm").json()
    profile = next(p for p in gpu["mig"]["profiles"] if p["name"] == "3g.40gb")
    assert fit["memory_bytes"] == profile["memory_bytes"] < gpu["memory_bytes"]

    # PUT moves it to the whole device (the slice is dropped) and back to another slice.
    whole = client.put(
        "/v1/workloads/chat-serving",
        json=without_slug(workload()),
        headers={"If-Match": '"1"'},
    )
    assert whole.status_code == 200, whole.text
    assert whole.json()["hardware"] == "nvidia-a100-80gb-sxm"
    memory = client.get("/v1/workloads/chat-serving/memory").json()
    assert memory["fit"]["hardware"] == "nvidia-a100-80gb-sxm"
    assert memory["fit"]["memory_bytes"] == gpu["memory_bytes"]
    other = client.put(
        "/v1/workloads/chat-serving",
        json=without_slug(workload(hardware="nvidia-a100-80gb-sxm/1g.10gb")),
        headers={"If-Match": '"2"'},
    )
    assert other.status_code == 200, other.text
    assert other.json()["hardware"] == "nvidia-a100-80gb-sxm/1g.10gb"
    fit = client.get("/v1/workloads/chat-serving/memory").json()["fit"]
    assert fit["hardware"] == "nvidia-a100-80gb-sxm/1g.10gb"


def test_a_slice_workload_gets_its_admission_decisions(client: ApiClient, db_url: str) -> None:
    """The admission decisions are computed per hardware profile when a workload is written,
    for a slice workload as for a whole-device one (app.services.decision_store)."""
    assert client.post("/v1/workloads", json=workload()).status_code == 201
    sliced = client.post("/v1/workloads", json=workload(slug="on-a-slice", hardware=SLICE))
    assert sliced.status_code == 201, sliced.text
    engine = make_engine(db_url)
    try:
        with engine.connect() as connection:
            counts: dict[str, int] = dict(
                connection.execute(
                    text(
                        "SELECT w.slug, count(d.workload_id) FROM workload w"
                        " LEFT JOIN admission_decision d ON d.workload_id = w.id GROUP BY w.slug"
                    )
                ).all()
            )
            hardware = connection.execute(text("SELECT count(*) FROM hardware")).scalar_one()
    finally:
        engine.dispose()
    assert counts == {"chat-serving": hardware, "on-a-slice": hardware}


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


BAD_SLICES = {
    "unknown profile": (
        "nvidia-a100-80gb-sxm/2g.40gb",
        404,
        "'nvidia-a100-80gb-sxm' has no MIG profile '2g.40gb'; valid profiles: 1g.10gb",
    ),
    "a GPU without MIG": (
        "nvidia-l4/1g.10gb",
        404,
        "'nvidia-l4' does not support MIG, so it has no profile '1g.10gb'",
    ),
    "unknown slug with a profile": (
        "nvidia-x9/1g.10gb",
        422,
        "hardware profile 'nvidia-x9' does not exist",
    ),
    "malformed profile": ("nvidia-a100-80gb-sxm/banana", 422, "/hardware"),
    "two profiles": ("nvidia-a100-80gb-sxm/1g.10gb/2g.20gb", 422, "/hardware"),
}


@pytest.mark.parametrize("case", list(BAD_SLICES))
def test_bad_slices_are_rejected_on_post_and_put_and_nothing_is_written(
    client: ApiClient, db_url: str, case: str
) -> None:
    name, status, says = BAD_SLICES[case]
    assert client.post("/v1/workloads", json=workload(hardware=SLICE)).status_code == 201
    before = table_counts(db_url)
    posted = client.post("/v1/workloads", json=workload(slug="other", hardware=name))
    assert says in str(assert_problem(posted, status))
    put = client.put(
        "/v1/workloads/chat-serving",
        json=without_slug(workload(hardware=name)),
        headers={"If-Match": '"1"'},
    )
    assert says in str(assert_problem(put, status))
    assert table_counts(db_url) == before
    stored = client.get("/v1/workloads/chat-serving").json()
    assert (stored["hardware"], stored["version"]) == (SLICE, 1)
    assert_problem(client.get("/v1/workloads/other"), 404)


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


def test_a_stored_lora_fine_tune_is_estimated_as_the_request_would_be(client: ApiClient) -> None:
    """``options.lora`` is stored with the workload and its memory is the estimate endpoint's:
    PEFT's trainable count (Llama-2-7B, r=8 on q_proj and v_proj: 4,194,304)."""
    lora = {"r": 8, "target_modules": ["q_proj", "v_proj"]}
    body = workload(
        slug="llama-lora",
        model="llama-2-7b",
        mode="training",
        batch_size=1,
        sequence_length=512,
        precision="mixed_bf16",
        options={"lora": lora},
    )
    created = client.post("/v1/workloads", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["options"]["lora"]["target_modules"] == ["q_proj", "v_proj"]
    stored = client.get("/v1/workloads/llama-lora/memory")
    assert stored.status_code == 200, stored.text
    assert stored.json()["trainable_params"] == 4_194_304
    direct = client.post(
        "/v1/estimates/memory",
        json={
            "model": "llama-2-7b",
            "mode": "training",
            "batch_size": 1,
            "sequence_length": 512,
            "precision": "mixed_bf16",
            "hardware": "nvidia-a100-80gb-sxm",
            "lora": lora,
        },
    )
    assert direct.status_code == 200, direct.text
    assert stored.json()["peak_bytes"] == direct.json()["peak_bytes"]


@pytest.mark.parametrize(
    ("lora", "mode", "pointer"),
    [
        ({"r": 8, "target_modules": ["no_such_proj"]}, "training", "/options/lora"),
        ({"r": 8, "target_modules": ["q_proj"]}, "inference", "/options/lora"),
    ],
)
def test_a_bad_stored_lora_is_refused_naming_the_option(
    client: ApiClient, db_url: str, lora: dict[str, Any], mode: str, pointer: str
) -> None:
    before = table_counts(db_url)
    body = workload(
        slug="bad-lora", model="llama-2-7b", mode=mode, batch_size=1, options={"lora": lora}
    )
    if mode == "training":
        body["precision"] = "mixed_bf16"
    response = client.post("/v1/workloads", json=body)
    problem = assert_problem(response, 422)
    assert any(e["pointer"].startswith(pointer) for e in problem["errors"]), problem
    assert table_counts(db_url) == before
