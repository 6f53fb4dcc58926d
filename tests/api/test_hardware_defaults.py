"""Defaults that exist on the hardware: precision and attention by the GPU's compute capability
(no bf16 and no flash attention before Ampere), each default used with its reason; the MIG
``slug/profile`` form wherever a request names one device; GPUs that cannot run a workload's
precision are never offered for it."""

from typing import Any

import pytest

from app.domain.engines.vllm import H100_80GB_CUDA_VISIBLE_BYTES
from tests.api.helpers import assert_problem
from tests.support import ApiClient, table_counts

ESTIMATE = "/v1/estimates/memory"


def _estimate(client: ApiClient, **body: Any) -> dict[str, Any]:
    response = client.post(ESTIMATE, json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _create_body(item: dict[str, Any]) -> dict[str, Any]:
    """A catalog item as a create body (the read-only fields dropped)."""
    read_only = ("slug", "source", "created_at", "updated_at", "version", "mig")
    return {k: v for k, v in item.items() if k not in read_only}


def _used(body: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {d["option"]: (d["value"], d["reason"]) for d in body["defaults_used"]}


@pytest.mark.parametrize(
    ("hardware", "mode", "precision", "attention", "capability"),
    [
        ("nvidia-t4", "inference", "fp16", "mem_efficient", "7.5, sm75"),
        ("nvidia-t4", "training", "amp_fp16", "mem_efficient", "7.5, sm75"),
        ("nvidia-v100-32gb-sxm2", "inference", "fp16", "mem_efficient", "7.0, sm70"),
        ("nvidia-v100-32gb-pcie", "training", "amp_fp16", "mem_efficient", "7.0, sm70"),
        ("nvidia-a100-80gb-sxm", "inference", "bf16", "flash", "8.0, sm80"),
        ("nvidia-a10", "training", "amp_bf16", "flash", "8.6, sm86"),
        ("nvidia-l4", "inference", "bf16", "flash", "8.9, sm89"),
        ("nvidia-h100-sxm", "inference", "bf16", "flash", "9.0, sm90"),
        ("nvidia-h100-sxm", "training", "amp_bf16", "flash", "9.0, sm90"),
    ],
)
def test_precision_and_attention_defaults_follow_the_gpu(
    client: ApiClient, hardware: str, mode: str, precision: str, attention: str, capability: str
) -> None:
    body = _estimate(client, model="gpt-2", mode=mode, batch_size=2, sequence_length=128,
                     hardware=hardware)  # fmt: skip
    assert body["precision"] == precision
    used = _used(body)
    value, reason = used["precision"]
    assert value == precision
    assert f"{hardware} (compute capability {capability})" in reason
    if precision.endswith("fp16"):
        assert "has no bf16 (it needs compute capability 8.0+)" in reason
    value, reason = used["attention"]
    assert value == attention
    assert f"{hardware} (compute capability {capability})" in reason
    if attention == "mem_efficient":
        assert f"flash needs sm80-sm121, {hardware} is sm" in reason
    assert all(a.startswith(f"{attention}: ") for a in body["attention"])


def test_asking_for_bf16_on_a_t4_runs_sdpas_math_kernel(client: ApiClient) -> None:
    """bf16 on sm75: flash needs sm80, mem_efficient takes only fp16/fp32 below sm80."""
    t4 = _estimate(client, model="gpt-2", mode="inference", batch_size=2, sequence_length=512,
                   precision="bf16", hardware="nvidia-t4")  # fmt: skip
    value, reason = _used(t4)["attention"]
    assert value == "sdpa_math"
    assert "mem_efficient takes fp16/fp32 below sm80, not bf16: SDPA falls back to math" in reason
    a100 = _estimate(client, model="gpt-2", mode="inference", batch_size=2, sequence_length=512,
                     precision="bf16", hardware="nvidia-a100-80gb-sxm")  # fmt: skip
    # The math kernel keeps the S x S probabilities: more activation memory than flash.
    assert t4["peak_bytes"] > a100["peak_bytes"] - 10 * 2**20  # context and workspace differ
    lines_t4 = {line["key"]: line["bytes"] for line in t4["breakdown"]}
    lines_a100 = {line["key"]: line["bytes"] for line in a100["breakdown"]}
    assert lines_t4["transient"] > lines_a100["transient"]


def test_cpu_and_no_hardware_keep_their_defaults(client: ApiClient) -> None:
    cpu = _estimate(client, model="gpt-2", mode="inference", batch_size=1,
                    hardware="intel-xeon-platinum-8480plus")  # fmt: skip
    assert cpu["precision"] == "fp32"
    assert _used(cpu)["precision"] == ("fp32", "inference on pytorch_cpu")
    assert _used(cpu)["attention"] == ("flash", "CPU: SDPA runs the fused flash kernel")
    none = _estimate(client, model="gpt-2", mode="inference", batch_size=1)
    assert _used(none)["precision"] == ("bf16", "inference on pytorch_cuda")
    assert _used(none)["attention"][0] == "flash"


def test_a_gpu_profile_without_a_compute_capability_keeps_the_ampere_defaults(
    client: ApiClient,
) -> None:
    item = client.get("/v1/hardware/nvidia-t4").json()
    assert item["compute_capability"] == "7.5"
    body = _create_body(item)
    body.pop("compute_capability")
    created = client.post("/v1/hardware", json={**body, "slug": "my-t4-no-cc"})
    assert created.status_code in (200, 201), created.text
    result = _estimate(
        client, model="gpt-2", mode="inference", batch_size=1, hardware="my-t4-no-cc"
    )
    assert _used(result)["precision"] == ("bf16", "inference on pytorch_cuda")


def test_the_hardware_api_carries_the_compute_capability(client: ApiClient) -> None:
    items = client.get("/v1/hardware", params={"kind": "gpu", "limit": 100}).json()["items"]
    nvidia = [i for i in items if i["vendor"] == "NVIDIA"]
    assert nvidia
    for item in nvidia:
        assert item["compute_capability"], item["slug"]
        major = int(item["compute_capability"].split(".")[0])
        # bf16 hardware arrived with compute capability 8.0 (Ampere): the peak tables agree
        assert ("bf16" in item["peak_flops_per_s"]) == (major >= 8), item["slug"]


@pytest.mark.parametrize(
    ("field", "value", "status"),
    [
        ("compute_capability", "8", 422),
        ("compute_capability", "8.0.1", 422),
        ("compute_capability", "sm80", 422),
        ("compute_capability", 8.0, 422),
    ],
)
def test_bad_compute_capabilities_are_422(
    client: ApiClient, db_url: str, field: str, value: Any, status: int
) -> None:
    item = client.get("/v1/hardware/nvidia-t4").json()
    body = _create_body(item)
    body[field] = value
    before = table_counts(db_url)
    assert_problem(client.post("/v1/hardware", json={**body, "slug": "bad-cc"}), status)
    assert table_counts(db_url) == before


def test_a_cpu_has_no_compute_capability(client: ApiClient, db_url: str) -> None:
    item = client.get("/v1/hardware/intel-xeon-platinum-8480plus").json()
    body = _create_body(item)
    body["compute_capability"] = "8.0"
    before = table_counts(db_url)
    problem = assert_problem(client.post("/v1/hardware", json={**body, "slug": "cpu-cc"}), 422)
    assert "has no CUDA compute capability" in str(problem)
    assert table_counts(db_url) == before


# -- the MIG slug/profile form ---------------------------------------------------------------


def test_the_estimate_takes_a_mig_slice_post_get_and_svg(client: ApiClient) -> None:
    query = {"model": "gpt-2", "mode": "inference", "batch_size": 1,
             "hardware": "nvidia-a100-80gb-sxm/1g.10gb"}  # fmt: skip
    post = _estimate(client, **query)
    get = client.get(ESTIMATE, params=query)
    assert get.status_code == 200, get.text
    assert get.json()["fit"] == post["fit"]
    profiles = client.get("/v1/hardware/nvidia-a100-80gb-sxm/mig-profiles").json()["profiles"]
    usable = next(p["memory_bytes"] for p in profiles if p["name"] == "1g.10gb")
    fit = post["fit"]
    assert fit["hardware"] == "nvidia-a100-80gb-sxm/1g.10gb"
    assert fit["usable_bytes"] == fit["memory_bytes"] == usable
    assert fit["fits"] == (fit["required_bytes"] <= usable)
    # The same requirement as the MIG fit of that profile.
    mig = client.post("/v1/mig/fit", json={
        "gpu": "nvidia-a100-80gb-sxm", "profile": "1g.10gb",
        "workload": {"model": "gpt-2", "mode": "inference", "batch_size": 1},
    })  # fmt: skip
    assert mig.status_code == 200, mig.text
    assert mig.json()["requested"]["required_bytes"] == fit["required_bytes"]
    assert "compute capability 8.0" in _used(post)["precision"][1]
    svg = client.get(ESTIMATE + ".svg", params=query)
    assert svg.status_code == 200
    assert b"nvidia-a100-80gb-sxm/1g.10gb usable" in svg.content


def test_the_mig_fit_takes_the_slug_profile_form(client: ApiClient) -> None:
    workload = {"model": "gpt-2", "mode": "inference", "batch_size": 1}
    both = client.post("/v1/mig/fit", json={"gpu": "nvidia-a100-80gb-sxm", "profile": "2g.20gb",
                                            "workload": workload})  # fmt: skip
    one = client.post("/v1/mig/fit", json={"gpu": "nvidia-a100-80gb-sxm/2g.20gb",
                                           "workload": workload})  # fmt: skip
    assert one.status_code == 200, one.text
    assert one.json()["requested"] == both.json()["requested"]
    assert one.json()["requested"]["profile"] == "2g.20gb"


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        (ESTIMATE, {"hardware": "nvidia-a100-80gb-sxm/1g.99gb"}, 404,
         "'nvidia-a100-80gb-sxm' has no MIG profile '1g.99gb'; valid profiles: 1g.10gb"),
        (ESTIMATE, {"hardware": "nvidia-l4/1g.10gb"}, 404,
         "'nvidia-l4' does not support MIG, so it has no profile '1g.10gb'"),
        (ESTIMATE, {"hardware": "no-such-gpu/1g.10gb"}, 404,
         "hardware profile 'no-such-gpu' does not exist"),
        (ESTIMATE, {"hardware": "nvidia-a100-80gb-sxm/banana"}, 422, ""),
        (ESTIMATE, {"hardware": "nvidia-a100-80gb-sxm/1g.10gb/2g.20gb"}, 422, ""),
        ("/v1/mig/fit", {"gpu": "nvidia-a100-80gb-sxm/1g.99gb"}, 404,
         "has no MIG profile '1g.99gb'"),
        ("/v1/mig/fit", {"gpu": "nvidia-a100-80gb-sxm/1g.10gb", "profile": "2g.20gb"}, 422,
         "gpu names profile '1g.10gb' and profile names '2g.20gb'; give one"),
        ("/v1/mig/fit", {"gpu": "nvidia-l4/1g.10gb"}, 422, "'nvidia-l4' does not support MIG"),
    ],
)  # fmt: skip
def test_bad_slug_profile_names_are_problems(
    client: ApiClient, db_url: str, path: str, body: dict[str, Any], status: int, says: str
) -> None:
    workload = {"model": "gpt-2", "mode": "inference", "batch_size": 1}
    payload = {**workload, **body} if path == ESTIMATE else {"workload": workload, **body}
    before = table_counts(db_url)
    problem = assert_problem(client.post(path, json=payload), status)
    assert says in str(problem)
    assert table_counts(db_url) == before
    if path == ESTIMATE:  # the query form and the chart answer the same problem
        query = {**workload, "hardware": body["hardware"]}
        assert_problem(client.get(ESTIMATE, params=query), status)
        assert_problem(client.get(ESTIMATE + ".svg", params=query), status)


# -- GPUs that would fit -------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_larger_gpus_of_a_mig_fit_run_the_precision(client: ApiClient, precision: str) -> None:
    """Llama-3-8B at batch 8 x 4096 needs ~25 GiB: no A100 40GB MIG profile holds it; a 32 GiB
    V100 would, but has no bf16 (compute capability 7.0), so it is offered for fp16 only."""
    response = client.post("/v1/mig/fit", json={
        "gpu": "nvidia-a30",
        "workload": {"model": "llama-3-8b", "mode": "inference", "batch_size": 8,
                     "sequence_length": 4096, "precision": precision},
    })  # fmt: skip
    assert response.status_code == 200, response.text
    larger = [g["hardware"] for g in response.json()["alternatives"]["larger_gpus"]]
    assert larger
    v100s = [g for g in larger if g.startswith("nvidia-v100")]
    assert bool(v100s) == (precision == "fp16"), larger


# -- the memory a GPU shows to CUDA ----------------------------------------------------------


def test_the_catalog_says_which_memory_figure_is_which(client: ApiClient) -> None:
    """The H100 80GB's sold 80 GiB beside the 79.19 GiB it shows to torch (the figure vLLM's
    pool is computed from, app.domain.engines.vllm's calibration constant); a GPU that was
    never measured has no CUDA-visible figure."""
    sxm = client.get("/v1/hardware/nvidia-h100-sxm").json()
    assert sxm["memory_bytes"] == 80 * 2**30
    assert sxm["cuda_visible_memory_bytes"] == H100_80GB_CUDA_VISIBLE_BYTES
    assert "total_memory=79.19GiB" in sxm["cuda_visible_memory_source"]
    pcie = client.get("/v1/hardware/nvidia-h100-pcie").json()
    assert pcie["cuda_visible_memory_bytes"] is None
    assert pcie["cuda_visible_memory_source"] is None


@pytest.mark.parametrize(
    ("hardware", "change", "field", "words"),
    [
        ("nvidia-t4", {"cuda_visible_memory_bytes": 17 * 2**30}, "cuda_visible_memory_bytes",
         "more than the device's memory_bytes"),
        ("nvidia-t4", {"cuda_visible_memory_bytes": 15 * 2**30}, "cuda_visible_memory_source",
         "go together"),
        ("nvidia-t4", {"cuda_visible_memory_source": "a run"}, "cuda_visible_memory_bytes",
         "go together"),
        ("nvidia-t4", {"cuda_visible_memory_bytes": 0, "cuda_visible_memory_source": "a run"},
         "cuda_visible_memory_bytes", "greater than or equal to 1"),
        ("intel-xeon-platinum-8480plus",
         {"cuda_visible_memory_bytes": 2**30, "cuda_visible_memory_source": "a run"},
         "cuda_visible_memory_bytes", "shows no memory to CUDA"),
    ],
)  # fmt: skip
def test_bad_cuda_visible_memory_is_422_naming_the_field(
    client: ApiClient, db_url: str, hardware: str, change: dict[str, Any], field: str, words: str
) -> None:
    body = _create_body(client.get(f"/v1/hardware/{hardware}").json()) | change
    before = table_counts(db_url)
    problem = assert_problem(client.post("/v1/hardware", json={**body, "slug": "bad-vis"}), 422)
    assert field in str(problem)
    assert words in str(problem)
    assert table_counts(db_url) == before


def test_a_mig_engine_fit_never_shows_more_than_the_whole_gpu(client: ApiClient) -> None:
    """H100 80GB 7g.80gb is listed with 79.25 GiB (nvidia-smi mig -lgip), more than the 79.19
    GiB the whole GPU shows to torch: the engine's pool is computed from the smaller figure."""
    workload = {
        "model": "llama-3-8b",
        "mode": "inference",
        "precision": "bf16",
        "batch_size": 1,
        "engine": {"name": "vllm", "max_model_len": 4096},
    }
    response = client.post("/v1/mig/fit", json={"workload": workload, "gpu": "nvidia-h100-sxm"})
    assert response.status_code == 200, response.text
    profiles = {p["profile"]: p for p in response.json()["profiles"]}
    whole = profiles["7g.80gb"]
    assert whole["usable_bytes"] == H100_80GB_CUDA_VISIBLE_BYTES
    assert whole["engine"]["cuda_visible_bytes"] == H100_80GB_CUDA_VISIBLE_BYTES
    assert "at most what the whole GPU shows to CUDA" in whole["engine"]["cuda_visible_source"]
    half = profiles["3g.40gb"]
    assert half["usable_bytes"] == 40_192 * 2**20
    assert "usable memory in the hardware catalog" in half["engine"]["cuda_visible_source"]
