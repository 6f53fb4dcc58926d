import copy
from typing import Any

import pytest

from tests.api.helpers import assert_problem, hardware, model, without_slug
from tests.support import ApiClient, ClientFactory, table_counts

A100_80 = "nvidia-a100-80gb-sxm"
CHAT: dict[str, Any] = {
    "slug": "chat",
    "name": "Chat",
    "model": "gpt-2",
    "mode": "inference",
    "batch_size": 1,
    "sequence_length": 128,
    "precision": "bf16",
}
BIG: dict[str, Any] = {**CHAT, "slug": "llama-chat", "model": "llama-3-8b", "batch_size": 8,
                       "sequence_length": 4096}  # fmt: skip


def _container(name: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": f"{name}:1"}
    if limits is not None:
        container["resources"] = {"limits": limits}
    return container


def review(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    uid: str = "e911857d-c318-11e8-bbad-025000000001",
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "annotations": annotations or {}},
        "spec": {"containers": list(containers)},
    }
    if init is not None:
        pod["spec"]["initContainers"] = init
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "ml",
            "object": pod,
        },
    }


NOTES = {"capacity-planner.io/workload": "chat", "capacity-planner.io/gpu": A100_80}
# Outcomes, not time: these tests give reviews a budget no loaded machine misses (the default
# 0.8 s budget is checked under the timing marker, tests/api/test_admission_review.py).
GENEROUS_S = 20.0


@pytest.fixture
def client(make_client: ClientFactory) -> ApiClient:
    """The app in open dev mode with a generous admission budget."""
    return make_client(admission_timeout_s=GENEROUS_S)


@pytest.fixture
def with_workloads(client: ApiClient) -> ApiClient:
    for body in (CHAT, BIG):
        assert client.post("/v1/workloads", json=body).status_code == 201
    return client


def _answer(client: ApiClient, body: Any) -> dict[str, Any]:
    response = client.post("/v1/admission/pods", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    assert result["apiVersion"] == "admission.k8s.io/v1"
    assert result["kind"] == "AdmissionReview"
    answer: dict[str, Any] = result["response"]
    assert all(len(w) <= 120 for w in answer.get("warnings", []))
    return answer


def test_fits(with_workloads: ApiClient) -> None:
    body = review(_container("server", {"nvidia.com/mig-1g.10gb": "1"}), annotations=NOTES)
    answer = _answer(with_workloads, body)
    assert answer["uid"] == body["request"]["uid"]
    assert answer["allowed"] is True
    assert answer["status"]["code"] == 200
    assert "nvidia.com/mig-1g.10gb gives" in answer["status"]["message"]


def test_does_not_fit_says_what_would(with_workloads: ApiClient) -> None:
    notes = {**NOTES, "capacity-planner.io/workload": "llama-chat"}
    body = review(_container("server", {"nvidia.com/mig-1g.10gb": "1"}), annotations=notes)
    answer = _answer(with_workloads, body)
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403
    message = answer["status"]["message"]
    assert message.startswith("container 'server': llama-chat inference bs 8 bf16 needs ")
    # Fused attention and last-position logits (serving defaults): the Llama chat pod at batch
    # 8 fits a 3g.40gb slice (with eager attention and every logit it needed a whole GPU).
    assert "smallest fitting: mig-3g.40gb" in message


def test_no_gpu_requested_is_allowed_without_lookup(client: ApiClient) -> None:
    answer = _answer(client, review(_container("web", {"cpu": "1"}), _container("sidecar")))
    assert answer["allowed"] is True
    assert answer["status"]["message"] == "no GPU requested"


def test_unknown_workload_follows_the_failure_policy(
    with_workloads: ApiClient, make_client: ClientFactory
) -> None:
    notes = {**NOTES, "capacity-planner.io/workload": "ghost"}
    body = review(_container("server", {"nvidia.com/mig-1g.10gb": "1"}), annotations=notes)
    denied = _answer(with_workloads, body)
    assert denied["allowed"] is False
    assert "ghost" in denied["status"]["message"]
    lenient = make_client(admission_failure_policy="allow", admission_timeout_s=GENEROUS_S)
    allowed = _answer(lenient, body)
    assert allowed["allowed"] is True
    assert allowed["warnings"]
    assert "ghost" in allowed["warnings"][0]


@pytest.mark.parametrize(
    "body",
    [
        None,
        {},
        {"request": {}},
        {"request": {"uid": "u-1"}},
        {"request": {"uid": "u-2", "object": {"kind": "Deployment", "spec": {}}}},
        {"request": {"uid": "u-3", "object": {"kind": "Pod", "spec": {"containers": "x"}}}},
        {"request": {"uid": "u-4", "object": {"kind": "Pod", "spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "many"}}}]}}}},
    ],
)  # fmt: skip
def test_malformed_reviews_get_a_well_formed_denial(client: ApiClient, body: Any) -> None:
    answer = _answer(client, body)
    assert answer["allowed"] is False
    assert answer["status"]["message"].startswith("denied: ")
    expected_uid = body["request"].get("uid", "") if body and "request" in body else ""
    assert answer["uid"] == expected_uid


def test_malformed_json_body_still_gets_an_admission_review(client: ApiClient) -> None:
    response = client.post(
        "/v1/admission/pods", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    assert response.json()["response"] == {
        "uid": "",
        "allowed": False,
        "status": {"code": 403, "message": "denied: malformed AdmissionReview: request.uid is "
                   "missing"},
    }  # fmt: skip


def test_every_container_and_init_container_is_checked(with_workloads: ApiClient) -> None:
    ok = {"nvidia.com/mig-1g.10gb": "1"}
    body = review(
        _container("a", ok),
        _container("b", ok),
        init=[_container("warmup", {"nvidia.com/mig-1g.5gb": "1"})],
        annotations=NOTES,
    )
    answer = _answer(with_workloads, body)
    # A100-80GB has no 1g.5gb profile: the init container's request is the problem.
    assert answer["allowed"] is False
    assert "1g.5gb" in answer["status"]["message"]
    both = review(_container("a", ok), _container("b", ok), annotations=NOTES)
    answer = _answer(with_workloads, both)
    assert answer["allowed"] is True
    assert "(2 GPU requests checked)" in answer["status"]["message"]


def test_inline_annotations_and_whole_gpus(client: ApiClient) -> None:
    notes = {
        "capacity-planner.io/model": "llama-2-7b",
        "capacity-planner.io/mode": "inference",
        "capacity-planner.io/batch-size": "1",
        "capacity-planner.io/precision": "bf16",
        "capacity-planner.io/sequence-length": "2048",
    }
    pod = review(_container("server", {"nvidia.com/gpu": "1"}), annotations=notes)
    pod["request"]["object"]["spec"]["nodeSelector"] = {"capacity-planner.io/gpu": "nvidia-l4"}
    answer = _answer(client, pod)
    assert answer["allowed"] is True  # 13.5 GB of weights on a 24 GB L4
    small = copy.deepcopy(pod)
    small["request"]["object"]["spec"]["nodeSelector"] = {"capacity-planner.io/gpu": "nvidia-t4"}
    small["request"]["object"]["metadata"]["annotations"]["capacity-planner.io/precision"] = "fp32"
    assert _answer(client, small)["allowed"] is False


def test_low_headroom_warns(client: ApiClient) -> None:
    estimate = client.post("/v1/mig/fit", json={"gpu": A100_80, "workload": {
        "model": "gpt-2", "mode": "inference", "batch_size": 1, "sequence_length": 128,
        "precision": "bf16"}}).json()  # fmt: skip
    assert estimate["required_bytes"] < 10 * 2**30
    # Find a batch that fills a 1g.10gb slice to over 90 %: warn but allow.
    for batch in range(8, 400, 8):
        body = {"workload": {**{k: v for k, v in CHAT.items() if k not in ("slug", "name")},
                             "batch_size": batch, "sequence_length": 1024},
                "resource": "nvidia.com/mig-1g.10gb", "gpu_model": A100_80}  # fmt: skip
        result = client.post("/v1/admission/check", json=body).json()
        if result["allowed"] and result["warnings"]:
            assert "headroom" in result["warnings"][0]
            return
    pytest.fail("no batch size produced a low-headroom warning")


def test_simple_check_form(with_workloads: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    body = {"workload": "chat", "resource": "nvidia.com/mig-1g.10gb", "gpu_model": A100_80}
    result = with_workloads.post("/v1/admission/check", json=body).json()
    assert result["allowed"] is True
    assert result["smallest_fitting_resource"] == "nvidia.com/mig-1g.10gb"
    assert result["usable_bytes"] > result["required_bytes"]
    assert table_counts(db_url) == before


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"workload": "chat", "resource": "amd.com/gpu", "gpu_model": A100_80}, 422),
        ({"workload": "chat", "resource": "nvidia.com/mig-9g.9gb", "gpu_model": A100_80}, 422),
        ({"workload": "ghost", "resource": "nvidia.com/gpu", "gpu_model": A100_80}, 404),
        ({"workload": "chat", "resource": "nvidia.com/gpu", "gpu_model": "nvidia-x9"}, 422),
        ({"workload": "chat", "resource": "nvidia.com/mig-1g.10gb", "gpu_model": "nvidia-t4"}, 422),
    ],
)
def test_bad_checks(with_workloads: ApiClient, body: dict[str, Any], status: int) -> None:
    assert_problem(with_workloads.post("/v1/admission/check", json=body), status)


# --------------------------------------------------------------------------------------------
# The decision cache is keyed by row state: a write must change the next answer.
# --------------------------------------------------------------------------------------------


def _put(client: ApiClient, path: str, body: dict[str, Any]) -> None:
    etag = client.get(path).headers["etag"]
    response = client.put(path, json=body, headers={"If-Match": etag})
    assert response.status_code == 200, response.text


def test_review_follows_workload_updates(with_workloads: ApiClient) -> None:
    body = review(_container("server", {"nvidia.com/mig-1g.10gb": "1"}), annotations=NOTES)
    first = _answer(with_workloads, body)
    assert first["allowed"] is True
    assert _answer(with_workloads, body) == first  # the same answer again (a cache hit)
    too_big = {k: v for k, v in BIG.items() if k != "slug"}
    _put(with_workloads, "/v1/workloads/chat", {**too_big, "name": "Chat"})
    after = _answer(with_workloads, body)
    assert after["allowed"] is False
    assert "chat inference bs 8 bf16" in after["status"]["message"]


def test_review_follows_hardware_and_model_updates(client: ApiClient) -> None:
    assert client.post("/v1/hardware", json=hardware()).status_code == 201
    assert client.post("/v1/models", json=model()).status_code == 201
    notes = {
        "capacity-planner.io/model": "tiny-cnn",
        "capacity-planner.io/mode": "training",
        "capacity-planner.io/batch-size": "512",
        "capacity-planner.io/precision": "fp32",
        "capacity-planner.io/gpu": "lab-gpu-1",
    }
    body = review(_container("trainer", {"nvidia.com/mig-1g.3gb": "1"}), annotations=notes)
    assert _answer(client, body)["allowed"] is True
    # The slice shrinks to 600 MiB: less than the CUDA context alone.
    smaller = hardware()
    smaller["mig"]["profiles"][0]["memory_mib"] = 600
    _put(client, "/v1/hardware/lab-gpu-1", without_slug(smaller))
    denied = _answer(client, body)
    assert denied["allowed"] is False
    assert "gives 0.6 GiB usable" in denied["status"]["message"]
    # Back to 3 GiB, then the model grows until it no longer fits.
    _put(client, "/v1/hardware/lab-gpu-1", without_slug(hardware()))
    assert _answer(client, body)["allowed"] is True
    wide = model()
    wide["layers"][0] = {**wide["layers"][0], "out_channels": 512}
    _put(client, "/v1/models/tiny-cnn", without_slug(wide))
    assert _answer(client, body)["allowed"] is False
