"""Admission of engine pods: a container running `vllm serve` (or vLLM's OpenAI API server
module), or a pod annotated `capacity-planner.io/engine: vllm` with its `engine-args`, is checked
against vLLM's start-up memory on the GPU or MIG resource it asks for."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select

from app.db.models import AdmissionDecision
from app.domain.engines.vllm import (
    H100_80GB_CUDA_VISIBLE_BYTES,
    ServingModel,
    VllmOptions,
    decoder_stage_weights_bytes,
    engine_memory,
)
from tests.api.test_admission import GENEROUS_S, review
from tests.support import ApiClient, ClientFactory, db_session

H100 = "nvidia-h100-sxm"
GPU = {"capacity-planner.io/gpu": H100}
LLAMA_3_8B = ServingModel(
    layers=32, hidden_size=4096, attention_heads=32, kv_heads=8, head_dim=128,
    intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
)  # fmt: skip


@pytest.fixture
def client(make_client: ClientFactory) -> ApiClient:
    return make_client(admission_timeout_s=GENEROUS_S)


def _vllm(resource: str, count: str, *args: str, command: list[str] | None = None) -> Any:
    return {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.19.0",
        "command": command if command is not None else ["vllm", "serve"],
        "args": list(args),
        "resources": {"limits": {resource: count}},
    }


def _answer(client: ApiClient, body: Any) -> dict[str, Any]:
    response = client.post("/v1/admission/pods", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()["response"]
    assert all(len(w) <= 120 for w in answer.get("warnings", []))
    return answer


def test_vllm_serve_is_admitted_with_its_kv_tokens_and_concurrency(client: ApiClient) -> None:
    pod = _vllm("nvidia.com/gpu", "1", "/models/llama-3-8b", "--max-model-len", "4096",
                "--port", "8000")  # fmt: skip
    answer = _answer(client, review(pod, annotations=GPU))
    weights = decoder_stage_weights_bytes(LLAMA_3_8B, 1, 1, 2)
    expected = engine_memory(
        LLAMA_3_8B, VllmOptions(max_model_len=4096), H100_80GB_CUDA_VISIBLE_BYTES, weights
    )
    assert answer["allowed"] is True, answer
    notes = answer["auditAnnotations"]
    assert notes["engine"] == "vllm 0.19.0"
    assert notes["engine-kv-tokens"] == str(expected.kv_tokens)
    assert notes["engine-max-concurrency"] == f"{expected.kv_tokens / 4096:.2f}"
    assert notes["engine-max-model-len"] == "4096"
    assert any(f"{expected.kv_tokens:,} KV tokens" in w for w in answer["warnings"])
    assert any("--port" in w for w in answer["warnings"])  # ignored flags are listed


def test_a_slice_it_cannot_start_on_is_denied_with_vllms_reason(client: ApiClient) -> None:
    pod = _vllm("nvidia.com/mig-1g.10gb", "1", "/models/llama-3-8b")
    answer = _answer(client, review(pod, annotations=GPU))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403
    message = answer["status"]["message"]
    assert message.startswith("container 'vllm': llama-3-8b on vllm 0.19.0")
    assert "No available memory for the cache blocks" in message
    assert "smallest fitting: mig-1g.20gb" in message


def test_the_api_server_module_and_a_served_name_annotated(client: ApiClient) -> None:
    command = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    pod = _vllm("nvidia.com/mig-3g.40gb", "1", "--model", "meta-llama/Meta-Llama-3-8B",
                command=command)  # fmt: skip
    unknown = _answer(client, review(pod, annotations=GPU))
    assert unknown["allowed"] is False  # the failure policy (deny): no stored model of that name
    assert "capacity-planner.io/model" in unknown["status"]["message"]
    notes = {**GPU, "capacity-planner.io/model": "llama-3-8b"}
    answer = _answer(client, review(pod, annotations=notes))
    assert answer["allowed"] is True, answer
    assert "nvidia.com/mig-3g.40gb" in answer["status"]["message"]


def test_min_concurrency_policy_annotation_denies_below_it(client: ApiClient) -> None:
    pod = _vllm("nvidia.com/gpu", "1", "/models/llama-3-8b")
    notes = {**GPU, "capacity-planner.io/min-concurrency": "60"}
    answer = _answer(client, review(pod, annotations=notes))
    assert answer["allowed"] is False
    assert (
        "concurrency 54.17 at max_model_len 8,192, below the 60 sequences asked"
        in (answer["status"]["message"])
    )
    notes["capacity-planner.io/min-concurrency"] = "50"
    assert _answer(client, review(pod, annotations=notes))["allowed"] is True


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--gpu-memory-utilization=0"], "--gpu-memory-utilization"),
        (["-tp", "3"], "-tp"),
        (["--tensor-parallel-size", "two"], "--tensor-parallel-size"),
        (["--max-model-len", "100000"], "--max-model-len"),
        (["--dtype", "int3"], "--dtype"),
    ],
)
def test_a_flag_vllm_refuses_is_a_denial_naming_it(
    client: ApiClient, args: list[str], flag: str
) -> None:
    pod = _vllm("nvidia.com/gpu", "4", "/models/llama-3-8b", *args)
    answer = _answer(client, review(pod, annotations=GPU))
    assert answer["allowed"] is False
    assert f"vLLM would refuse {flag}" in answer["status"]["message"]


def test_a_tensor_group_needs_its_gpus_and_never_slices(client: ApiClient) -> None:
    one = _answer(client, review(_vllm("nvidia.com/gpu", "1", "llama-3-8b", "-tp", "2"),
                                 annotations=GPU))  # fmt: skip
    assert one["allowed"] is False
    assert (
        "tensor x pipeline = 2 GPUs, the container gets 1 nvidia.com/gpu"
        in (one["status"]["message"])
    )
    two = _answer(client, review(_vllm("nvidia.com/gpu", "2", "llama-3-8b", "-tp", "2"),
                                 annotations=GPU))  # fmt: skip
    assert two["allowed"] is True
    sliced = _answer(client, review(_vllm("nvidia.com/mig-7g.80gb", "1", "llama-3-8b", "-tp", "2"),
                                    annotations=GPU))  # fmt: skip
    assert sliced["allowed"] is False
    assert "cannot be MIG slices" in sliced["status"]["message"]


def test_another_launcher_annotated(client: ApiClient) -> None:
    pod = {"name": "server", "image": "custom:1", "command": ["python", "launch.py"],
           "resources": {"limits": {"nvidia.com/mig-2g.20gb": "1"}}}  # fmt: skip
    notes = {
        **GPU,
        "capacity-planner.io/engine": "vllm",
        "capacity-planner.io/engine-args": "--max-model-len 4096 --max-num-seqs 64",
        "capacity-planner.io/model": "llama-3-8b",
    }
    answer = _answer(client, review(pod, annotations=notes))
    assert answer["allowed"] is True, answer
    assert answer["auditAnnotations"]["engine-max-model-len"] == "4096"
    notes["capacity-planner.io/engine"] = "sglang"
    other = _answer(client, review(pod, annotations=notes))
    assert other["allowed"] is False
    assert "not a modelled engine" in other["status"]["message"]


def _endpoint_kv_tokens(client: ApiClient, **options: Any) -> int:
    body = {"model": "llama-3-8b", "hardware": H100, **options}
    response = client.post("/v1/engines/vllm/memory", json=body)
    assert response.status_code == 200, response.text
    tokens: int = response.json()["kv_tokens"]
    return tokens


def test_runtime_fp8_is_read_from_q_and_sized_as_the_endpoint(client: ApiClient) -> None:
    pod = _vllm("nvidia.com/gpu", "1", "/models/llama-3-8b", "--max-model-len", "4096",
                "-q", "fp8")  # fmt: skip
    answer = _answer(client, review(pod, annotations=GPU))
    assert answer["allowed"] is True, answer
    tokens = int(answer["auditAnnotations"]["engine-kv-tokens"])
    assert tokens == _endpoint_kv_tokens(client, max_model_len=4096, quantization="fp8")
    # fp8 linears free about half of the decoder's 13.0 GiB of bf16 linears for KV blocks
    unquantized = _endpoint_kv_tokens(client, max_model_len=4096)
    assert (tokens - unquantized) * 131_072 > 6 * 2**30


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def test_a_prequantized_checkpoint_takes_its_config_from_an_annotation(
    client: ApiClient, make_client: ClientFactory
) -> None:
    pod = _vllm("nvidia.com/gpu", "1", "/models/llama-3-8b", "--quantization", "gptq_marlin")
    body = review(pod, annotations=GPU)
    denied = _answer(client, body)  # the webhook cannot read the checkpoint's config
    assert denied["allowed"] is False
    assert "annotate capacity-planner.io/quantization-config" in denied["status"]["message"]
    lenient = make_client(admission_failure_policy="allow", admission_timeout_s=GENEROUS_S)
    assert _answer(lenient, body)["allowed"] is True
    notes = {**GPU, "capacity-planner.io/quantization-config": json.dumps(GPTQ)}
    answer = _answer(client, review(pod, annotations=notes))
    assert answer["allowed"] is True, answer
    assert int(answer["auditAnnotations"]["engine-kv-tokens"]) == _endpoint_kv_tokens(
        client, quantization="gptq_marlin", quantization_config=GPTQ
    )


def test_a_quantization_the_config_contradicts_is_denied_naming_the_flag(
    client: ApiClient,
) -> None:
    pod = _vllm("nvidia.com/gpu", "1", "/models/llama-3-8b", "-q", "awq")
    notes = {**GPU, "capacity-planner.io/quantization-config": json.dumps(GPTQ)}
    answer = _answer(client, review(pod, annotations=notes))
    assert answer["allowed"] is False
    assert answer["status"]["message"].startswith("vLLM would refuse -q:"), answer


def test_a_stored_engine_workload_is_decided_from_its_stored_decision(
    client: ApiClient, db_url: str
) -> None:
    body = {"slug": "llama-vllm", "name": "Llama on vLLM", "model": "llama-3-8b",
            "mode": "inference", "batch_size": 1, "precision": "bf16",
            "options": {"engine": {"name": "vllm", "max_model_len": 4096}}}  # fmt: skip
    assert client.post("/v1/workloads", json=body).status_code == 201
    with db_session(db_url) as session:
        rows = session.scalars(select(AdmissionDecision)).all()
        engines = [row.engine for row in rows if row.engine is not None]
    assert engines, "the stored decisions keep the engine's verdict per resource"
    assert all(e["name"] == "vllm 0.19.0" for e in engines)
    pod = {"name": "server", "image": "any:1",
           "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}  # fmt: skip
    notes = {**GPU, "capacity-planner.io/workload": "llama-vllm"}
    denied = _answer(client, review(pod, annotations=notes))
    assert denied["allowed"] is False
    assert "No available memory for the cache blocks" in denied["status"]["message"]
    pod["resources"] = {"limits": {"nvidia.com/mig-1g.20gb": "1"}}
    allowed = _answer(client, review(pod, annotations=notes))
    assert allowed["allowed"] is True
    assert allowed["auditAnnotations"]["engine-max-model-len"] == "4096"


def test_the_check_form_shows_the_engine(client: ApiClient) -> None:
    workload = {"model": "llama-3-8b", "mode": "inference", "batch_size": 1,
                "engine": {"name": "vllm", "max_model_len": 4096}}  # fmt: skip
    response = client.post(
        "/v1/admission/check",
        json={"workload": workload, "resource": "nvidia.com/mig-1g.20gb", "gpu_model": H100},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["allowed"] is True
    engine = answer["engine"]
    assert engine["engine"] == "vllm 0.19.0"
    assert answer["required_bytes"] == engine["required_bytes"] <= engine["cuda_visible_bytes"]
    assert engine["kv_tokens"] > 4096
