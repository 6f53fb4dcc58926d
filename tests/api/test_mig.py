from typing import Any

import pytest

from app.db.models import Workload
from app.db.repositories import ModelRepository
from tests.api.helpers import assert_problem
from tests.support import ApiClient, db_session, table_counts

A100_80 = "nvidia-a100-80gb-sxm"
GPT2_INFERENCE: dict[str, Any] = {
    "model": "gpt-2",
    "mode": "inference",
    "batch_size": 1,
    "sequence_length": 128,
    "precision": "bf16",
}


def _fit(client: ApiClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/mig/fit", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_mig_profiles_in_bytes_and_mib(client: ApiClient) -> None:
    body = client.get(f"/v1/hardware/{A100_80}/mig-profiles").json()
    assert body["total_compute_slices"] == 7
    assert len(body["profiles"]) == 7
    first = body["profiles"][0]
    assert first["memory_bytes"] == first["memory_mib"] * 2**20
    assert first["kubernetes_resource"] == f"nvidia.com/mig-{first['name'].replace('+', '.')}"
    slices = [p["compute_slices"] for p in body["profiles"]]
    assert slices == sorted(slices)


def test_small_workload_fits_the_smallest_profile(client: ApiClient) -> None:
    body = _fit(client, gpu=A100_80, workload=GPT2_INFERENCE)
    assert body["smallest_fitting_profile"] == "1g.10gb"
    assert body["smallest_fitting_resource"] == "nvidia.com/mig-1g.10gb"
    assert "alternatives" not in body
    lines = {line["key"]: line["bytes"] for line in body["required"]}
    assert set(lines) == {"memory_estimate", "cuda_context", "workspace", "safety_margin"}
    assert sum(lines.values()) == body["required_bytes"]
    # the CUDA context table (issue 32): A100 (sm80), CUDA 12, lazy loading: no own figure, so
    # the row for any GPU, 400 MiB (pytorch/pytorch#109888)
    assert lines["cuda_context"] == 400 * 2**20
    assert lines["workspace"] == 2 * 4096 * 1024 + 8 * 16 * 1024  # cuBLAS :4096:2:16:8 (Ampere)
    base = lines["memory_estimate"] + lines["cuda_context"] + lines["workspace"]
    assert lines["safety_margin"] == -(-base // 20)
    for profile in body["profiles"]:
        assert profile["headroom_bytes"] == profile["usable_bytes"] - body["required_bytes"]
        assert profile["fits"] == (profile["headroom_bytes"] >= 0)
        assert profile["limiting_factor"] == ("none" if profile["fits"] else "memory")


def test_overrides_are_named_lines(client: ApiClient) -> None:
    body = _fit(
        client,
        gpu=A100_80,
        workload=GPT2_INFERENCE,
        cuda_context_bytes=0,
        safety_margin_fraction=0,
        profile="3g.40gb",
    )
    lines = {line["key"]: line for line in body["required"]}
    assert lines["cuda_context"]["bytes"] == 0
    assert lines["cuda_context"]["detail"] == "0 [B CUDA context: request override] = 0 B"
    assert lines["safety_margin"]["bytes"] == 0
    assert body["required_bytes"] == (
        lines["memory_estimate"]["bytes"] + lines["workspace"]["bytes"]
    )
    assert body["requested"]["profile"] == "3g.40gb"
    assert body["requested"]["fits"] is True


def test_profile_choice_prefers_fewer_compute_slices(client: ApiClient) -> None:
    # bf16 Llama-2-7B (13.5 GB of weights) fits the 1-slice 20 GB profile ...
    bf16 = {**GPT2_INFERENCE, "model": "llama-2-7b", "sequence_length": 2048}
    assert _fit(client, gpu=A100_80, workload=bf16)["smallest_fitting_profile"] == "1g.20gb"
    # ... in fp32 (27 GB) it needs 40 GB: 3g.40gb and 4g.40gb both hold it, 3 slices win.
    fp32 = {**bf16, "precision": "fp32"}
    body = _fit(client, gpu=A100_80, workload=fp32)
    fitting = {p["profile"] for p in body["profiles"] if p["fits"]}
    assert {"3g.40gb", "4g.40gb", "7g.80gb"} <= fitting
    assert body["smallest_fitting_profile"] == "3g.40gb"


def test_nothing_fits_suggests_alternatives(client: ApiClient) -> None:
    workload = {
        "model": "llama-2-7b",
        "mode": "inference",
        "batch_size": 64,
        "sequence_length": 4096,
        "precision": "bf16",
    }
    body = _fit(client, gpu="nvidia-a30", workload=workload)
    assert body.get("smallest_fitting_profile") is None
    alt = body["alternatives"]
    assert alt["biggest_profile"] == "4g.24gb"
    assert alt["full_gpu_fits"] is False
    sizes = [gpu["memory_bytes"] for gpu in alt["larger_gpus"]]
    assert sizes == sorted(sizes)
    assert all(size >= body["required_bytes"] for size in sizes)
    # at batch 1 the model does not fit 24 GB either (13.5 GB weights + 2 GB KV at 4096)...
    batch = alt["largest_batch_on_biggest_profile"]
    assert batch is None or 1 <= batch < 64
    if batch is not None:
        smaller = {**workload, "batch_size": batch}
        check = _fit(client, gpu="nvidia-a30", workload=smaller, profile="4g.24gb")
        assert check["requested"]["fits"] is True
        bigger = {**workload, "batch_size": batch + 1}
        check = _fit(client, gpu="nvidia-a30", workload=bigger, profile="4g.24gb")
        assert check["requested"]["fits"] is False


def test_answers_do_not_depend_on_order(client: ApiClient) -> None:
    first = _fit(client, gpu=A100_80, workload=GPT2_INFERENCE)
    second = _fit(client, gpu=A100_80, workload=dict(reversed(list(GPT2_INFERENCE.items()))))
    assert first == second


def test_unknown_gpu_is_404_naming_the_choices(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    body = assert_problem(
        client.post("/v1/mig/fit", json={"gpu": "nvidia-x9", "workload": GPT2_INFERENCE}), 404
    )
    assert A100_80 in body["detail"]
    assert_problem(client.get("/v1/hardware/nvidia-x9/mig-profiles"), 404)
    assert table_counts(db_url) == before


def test_unknown_profile_is_404_naming_the_choices(client: ApiClient) -> None:
    response = client.post(
        "/v1/mig/fit", json={"gpu": A100_80, "workload": GPT2_INFERENCE, "profile": "9g.99gb"}
    )
    body = assert_problem(response, 404)
    assert "1g.10gb" in body["detail"]


def test_gpu_without_mig_is_422(client: ApiClient) -> None:
    body = assert_problem(
        client.post("/v1/mig/fit", json={"gpu": "nvidia-t4", "workload": GPT2_INFERENCE}), 422
    )
    assert "does not support MIG" in body["detail"]
    assert_problem(client.get("/v1/hardware/nvidia-t4/mig-profiles"), 422)


@pytest.mark.parametrize(
    "body",
    [
        {"gpu": A100_80},
        {"gpu": A100_80, "workload": {**GPT2_INFERENCE, "batch_size": 0}},
        {"gpu": A100_80, "workload": GPT2_INFERENCE, "safety_margin_fraction": -0.1},
        {"gpu": A100_80, "workload": GPT2_INFERENCE, "cuda_context_bytes": -1},
        {"gpu": A100_80, "workload": GPT2_INFERENCE, "extra": 1},
    ],
)
def test_bad_fit_requests_are_422(client: ApiClient, body: dict[str, Any]) -> None:
    assert_problem(client.post("/v1/mig/fit", json=body), 422, "validation-error")


A100_40 = "nvidia-a100-40gb-sxm"


def _validate(client: ApiClient, gpu: str, *instances: tuple[str, int]) -> dict[str, Any]:
    body = {"gpu": gpu, "instances": [{"profile": p, "start": s} for p, s in instances]}
    response = client.post("/v1/mig/layouts/validate", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.parametrize(
    "layout",
    [
        # NVIDIA MIG user guide examples (A100-40GB)
        (("3g.20gb", 4), ("2g.10gb", 2), ("1g.5gb", 0), ("1g.5gb", 1)),
        (("2g.10gb", 4), ("1g.5gb", 0), ("1g.5gb", 1), ("1g.5gb", 2), ("1g.5gb", 3), ("1g.5gb", 6)),
        (("7g.40gb", 0),),
    ],
)
def test_guide_layouts_are_valid(client: ApiClient, layout: tuple[tuple[str, int], ...]) -> None:
    body = _validate(client, A100_40, *layout)
    assert body == {"gpu": A100_40, "valid": True, "violations": []}


@pytest.mark.parametrize(
    ("layout", "rule"),
    [
        ((("1g.5gb", 7),), "bad_start"),
        ((("1g.5gb", 0), ("1g.5gb", 0)), "overlap"),
        ((("7g.40gb", 0), ("1g.5gb", 0)), "overlap"),
        ((("4g.20gb", 0), ("4g.20gb", 4)), "count_over_max"),
        ((("4g.20gb", 0), ("3g.20gb", 4), ("1g.5gb", 4)), "overlap"),
    ],
)
def test_invalid_layouts_name_the_rule(
    client: ApiClient, layout: tuple[tuple[str, int], ...], rule: str
) -> None:
    body = _validate(client, A100_40, *layout)
    assert body["valid"] is False
    assert rule in {v["rule"] for v in body["violations"]}
    assert all(v["message"] for v in body["violations"])


def test_unknown_profile_in_a_layout_is_404(client: ApiClient) -> None:
    body = {"gpu": A100_40, "instances": [{"profile": "1g.20gb", "start": 0}]}
    problem = assert_problem(client.post("/v1/mig/layouts/validate", json=body), 404)
    assert "1g.5gb" in problem["detail"]


def _plan(client: ApiClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/mig/plan", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_plan_packs_onto_the_fewest_gpus_with_valid_layouts(client: ApiClient) -> None:
    body = _plan(
        client,
        gpu=A100_80,
        workloads=[
            {"name": "big", "profile": "4g.40gb", "replicas": 1},
            {"name": "mid", "profile": "3g.40gb", "replicas": 1},
            {"name": "small", "profile": "1g.10gb", "replicas": 7},
        ],
    )
    assert body["gpu_count"] == 2
    assert body["optimal"] is True
    placed = [i for gpu in body["gpus"] for i in gpu["instances"]]
    assert sorted(i["workload"] for i in placed) == ["big", "mid"] + ["small"] * 7
    for gpu in body["gpus"]:
        layout = [(i["profile"], i["start"]) for i in gpu["instances"]]
        assert _validate(client, A100_80, *layout)["valid"] is True
    config = body["mig_parted"]
    assert config["version"] == "v1"
    assert "capacity-planner" in config["mig-configs"]
    assert body["mig_parted_yaml"].startswith("version: v1")


def test_plan_sizes_workloads_with_a_fit_check(client: ApiClient) -> None:
    body = _plan(
        client,
        gpu=A100_80,
        workloads=[{"name": "gpt2", "workload": GPT2_INFERENCE, "replicas": 7}],
    )
    assert body["workloads"][0]["profile"] == "1g.10gb"
    assert body["workloads"][0]["required_bytes"] > 0
    assert body["gpu_count"] == 1


def test_same_request_same_plan(client: ApiClient) -> None:
    items = [
        {"name": "a", "profile": "2g.20gb", "replicas": 3},
        {"name": "b", "profile": "1g.10gb", "replicas": 5},
        {"name": "c", "profile": "3g.40gb", "replicas": 2},
    ]
    first = _plan(client, gpu=A100_80, workloads=items)
    second = _plan(client, gpu=A100_80, workloads=list(reversed(items)))
    assert first == second


@pytest.mark.parametrize(
    ("item", "status"),
    [
        ({"name": "x", "profile": "1g.10gb", "replicas": 0}, 422),
        ({"name": "x", "profile": "1g.10gb", "replicas": 10_001}, 422),
        ({"name": "x", "profile": "9g.90gb", "replicas": 1}, 404),
        ({"name": "x", "replicas": 1}, 422),
    ],
)
def test_bad_plan_requests(client: ApiClient, item: dict[str, Any], status: int) -> None:
    assert_problem(client.post("/v1/mig/plan", json={"gpu": A100_80, "workloads": [item]}), status)


def test_plan_on_a_gpu_without_mig_is_422(client: ApiClient) -> None:
    item = {"name": "x", "profile": "1g.10gb", "replicas": 1}
    assert_problem(client.post("/v1/mig/plan", json={"gpu": "nvidia-l4", "workloads": [item]}), 422)


def test_plan_total_replicas_are_capped(client: ApiClient) -> None:
    items = [{"name": f"w{i}", "profile": "1g.10gb", "replicas": 10_000} for i in range(11)]
    body = assert_problem(
        client.post("/v1/mig/plan", json={"gpu": A100_80, "workloads": items}), 422
    )
    assert "110,000 replicas" in body["detail"]


def test_duplicate_workload_names_are_422(client: ApiClient) -> None:
    items = [{"name": "same", "profile": "1g.10gb", "replicas": 1}] * 2
    assert_problem(client.post("/v1/mig/plan", json={"gpu": A100_80, "workloads": items}), 422)


def _store_workload(db_url: str, slug: str, **options: Any) -> None:
    with db_session(db_url) as session:
        model = ModelRepository(session).get("gpt-2")
        assert model is not None
        session.add(
            Workload(
                slug=slug,
                name=slug,
                model_id=model.id,
                mode="inference",
                batch_size=1,
                sequence_length=128,
                precision="bf16",
                options=options,
            )
        )
        session.commit()


def test_fit_and_plan_accept_a_stored_workload(client: ApiClient, db_url: str) -> None:
    _store_workload(db_url, "nightly-chat", kv_cache=True)
    stored = _fit(client, gpu=A100_80, workload="nightly-chat")
    inline = _fit(client, gpu=A100_80, workload=GPT2_INFERENCE)
    assert stored["required_bytes"] == inline["required_bytes"]
    assert stored["smallest_fitting_profile"] == "1g.10gb"
    plan = _plan(
        client, gpu=A100_80, workloads=[{"name": "chat", "workload": "nightly-chat", "replicas": 2}]
    )
    assert plan["workloads"][0]["profile"] == "1g.10gb"


def test_unknown_or_broken_stored_workload(client: ApiClient, db_url: str) -> None:
    missing = client.post("/v1/mig/fit", json={"gpu": A100_80, "workload": "no-such-workload"})
    assert "no-such-workload" in assert_problem(missing, 404)["detail"]
    _store_workload(db_url, "broken", checkpointing="sometimes")
    broken = client.post("/v1/mig/fit", json={"gpu": A100_80, "workload": "broken"})
    assert "checkpointing" in assert_problem(broken, 422)["detail"]
