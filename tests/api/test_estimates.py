from typing import Any

import pytest

from tests.api.helpers import TINY_MLP, assert_problem
from tests.support import ApiClient, table_counts


def _estimate(client: ApiClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/estimates/memory", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_training_estimate_of_a_stored_model(client: ApiClient) -> None:
    body = _estimate(
        client,
        model="gpt-2",
        mode="training",
        batch_size=4,
        sequence_length=512,
        precision="amp_bf16",
        optimizer="adamw",
    )
    assert body["params"] == 124_439_808
    assert body["bindings"] == {"batch": 4, "seq": 512}
    assert body["peak_phase"] in {"forward", "backward", "optimizer_step"}
    assert sum(line["bytes"] for line in body["breakdown"]) == body["peak_bytes"]
    keys = {line["key"] for line in body["breakdown"]}
    assert {"weights", "optimizer_state", "activations", "cuda_context"} <= keys
    assert all(line["formula"] for line in body["breakdown"])
    assert any("autocast" in a for a in body["assumptions"])
    assert body["first_iteration_peak_bytes"] <= body["peak_bytes"]


def test_inline_architecture_inference(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    body = _estimate(
        client, architecture=TINY_MLP, mode="inference", batch_size=2, runtime="pytorch_cpu"
    )
    assert body["model"] == "inline"
    assert body["params"] == 64 * 128 + 128 + 128 * 10 + 10
    weights = next(line for line in body["breakdown"] if line["key"] == "weights")
    assert weights["bytes"] == body["params"] * 4
    assert body["seed_rule_bytes"] == body["params"] * 4 + 2 * 2 * 128 * 4
    assert table_counts(db_url) == before  # estimates store nothing


def test_get_form_matches_post(client: ApiClient) -> None:
    params = {
        "model": "resnet-50",
        "mode": "training",
        "batch_size": 8,
        "optimizer": "sgd_momentum",
    }
    got = client.get("/v1/estimates/memory", params=params)
    assert got.status_code == 200, got.text
    posted = _estimate(client, **params)
    assert got.json() == posted


def test_hardware_sets_runtime_and_checks_the_fit(client: ApiClient) -> None:
    gpu = _estimate(
        client, model="llama-2-7b", mode="inference", batch_size=1, sequence_length=4096,
        precision="bf16", hardware="nvidia-a100-80gb-sxm",
    )  # fmt: skip
    assert gpu["runtime"] == "pytorch_cuda"
    assert gpu["fit"]["fits"] is True
    # The one requirement: the peak (context and workspace included) + a 5 % margin.
    fit = gpu["fit"]
    assert fit["required_bytes"] == gpu["peak_bytes"] + -(-gpu["peak_bytes"] * 5 // 100)
    assert [line["key"] for line in fit["required"]] == [
        "memory_estimate", "cuda_context", "workspace", "safety_margin",
    ]  # fmt: skip
    assert sum(line["bytes"] for line in fit["required"]) == fit["required_bytes"]
    assert fit["headroom_bytes"] == 80 * 2**30 - fit["required_bytes"]
    kv = next(line for line in gpu["breakdown"] if line["key"] == "kv_cache")
    assert kv["bytes"] == 2 * 32 * 32 * 128 * 4096 * 2
    cpu = _estimate(
        client, model="resnet-50", mode="inference", batch_size=1,
        hardware="intel-xeon-platinum-8480plus",
    )  # fmt: skip
    assert cpu["runtime"] == "pytorch_cpu"
    assert "cuda_context" not in {line["key"] for line in cpu["breakdown"]}
    big = _estimate(
        client, model="llama-2-7b", mode="training", batch_size=1, sequence_length=512,
        hardware="nvidia-t4",
    )  # fmt: skip
    assert big["fit"]["fits"] is False
    assert big["fit"]["headroom_bytes"] < 0


def test_overrides_replace_framework_overhead(client: ApiClient) -> None:
    body = _estimate(
        client, model="resnet-50", mode="inference", batch_size=1,
        framework_overhead={"cuda_context_bytes": 123, "workspace_bytes": 0},
    )  # fmt: skip
    lines = {line["key"]: line["bytes"] for line in body["breakdown"]}
    assert lines["cuda_context"] == 123
    assert lines["workspace"] == 0


def test_cuda_figures_follow_pytorchs_counters(client: ApiClient) -> None:
    """allocated (max_memory_allocated) + cached segments = reserved; + context = the peak."""
    body = _estimate(client, model="gpt-2", mode="training", batch_size=4, sequence_length=512)
    cuda = body["cuda"]
    lines = {line["key"]: line["bytes"] for line in body["breakdown"]}
    assert cuda["reserved_bytes"] == cuda["allocated_bytes"] + lines["fragmentation_reserve"]
    assert cuda["device_total_bytes"] == cuda["reserved_bytes"] + lines["cuda_context"]
    assert cuda["device_total_bytes"] == body["peak_bytes"]
    assert cuda["context_bytes"] == lines["cuda_context"]
    assert cuda["expandable_segments"] is False
    assert cuda["first_iteration_allocated_bytes"] > 0
    assert "max_memory_reserved" in next(
        line["formula"] for line in body["breakdown"] if line["key"] == "fragmentation_reserve"
    )
    grown = _estimate(
        client, model="gpt-2", mode="training", batch_size=4, sequence_length=512,
        framework_overhead={"expandable_segments": True},
    )  # fmt: skip
    assert grown["cuda"]["expandable_segments"] is True
    assert grown["cuda"]["allocated_bytes"] <= cuda["allocated_bytes"]
    fixed = _estimate(
        client, model="gpt-2", mode="training", batch_size=4, sequence_length=512,
        framework_overhead={"fragmentation_fraction": 0.1},
    )  # fmt: skip
    reserve = next(x for x in fixed["breakdown"] if x["key"] == "fragmentation_reserve")
    assert "x 0.1 [fragmentation_fraction]" in reserve["formula"]
    unreplayed = _estimate(
        client, model="gpt-2", mode="training", batch_size=4, sequence_length=512,
        framework_overhead={"round_allocations": False},
    )  # fmt: skip
    skipped = {x["key"]: x["bytes"] for x in unreplayed["breakdown"]}
    assert skipped["allocator_rounding"] == skipped["fragmentation_reserve"] == 0
    cpu = _estimate(client, model="gpt-2", mode="inference", batch_size=1, runtime="pytorch_cpu")
    assert "cuda" not in cpu  # no CUDA figures on the CPU runtime


def test_per_layer_view(client: ApiClient) -> None:
    body = _estimate(
        client, model="vgg-16", mode="training", batch_size=2, precision="fp32", per_layer=True
    )
    layers = body["layers"]
    assert layers[0]["name"] == "features.conv1" or layers[0]["op"] == "conv2d"
    assert layers[0]["params"] == 1792
    assert sum(layer["params"] for layer in layers) == 138_357_544
    assert "layers" not in _estimate(client, model="vgg-16", mode="training", batch_size=2)
    pool = next(layer for layer in layers if layer["op"] == "maxpool2d")
    kinds = {(k["label"], k["source"], k["dtype"]) for k in pool["kept_for_backward"]}
    assert kinds == {("input", "input", "fp32"), ("indices", "new", "int64")}
    indices = next(k for k in pool["kept_for_backward"] if k["label"] == "indices")
    assert indices["bytes"] == indices["elements"] * 8


def test_per_layer_dtypes_follow_precision_and_runtime(client: ApiClient) -> None:
    body = _estimate(
        client, model="gpt-2", mode="training", batch_size=1, sequence_length=32,
        precision="bf16", runtime="pytorch_cuda", attention="eager", per_layer=True,
    )  # fmt: skip
    attn = next(layer for layer in body["layers"] if layer["op"] == "attention")
    dtypes = {k["label"]: k["dtype"] for k in attn["kept_for_backward"]}
    assert dtypes["q"] == "bf16"
    assert dtypes["probs"] == "fp32"  # softmax in fp32
    assert dtypes["probs_mask"] == "bool"  # CUDA keeps a 1-byte dropout mask


def test_vgg16_summary_reproduces_the_seed_walkthrough(client: ApiClient) -> None:
    response = client.get("/v1/models/vgg-16/summary", params={"batch_size": 1})
    assert response.status_code == 200, response.text
    body = response.json()
    convs = [row for row in body["layers"] if row["op"] == "conv2d"]
    assert convs[0]["params"] == 1792
    assert convs[1]["params"] == 36928
    flatten = next(row for row in body["layers"] if row["op"] == "flatten")
    assert flatten["activation_elements"] == 25088
    assert body["total_params"] == 138_357_544
    assert body["bindings"] == {"batch": 1, "image": 224}
    b32 = client.get("/v1/models/vgg-16/summary", params={"batch_size": 32}).json()
    assert b32["layers"][0]["activation_bytes"] == 411_041_792
    assert b32["total_activation_bytes"] == 1_934_357_504  # the seed's "1.88 GB" (1.93e9 B)


BAD: dict[str, dict[str, Any]] = {
    "both model and architecture": {"model": "gpt-2", "architecture": TINY_MLP},
    "neither model nor architecture": {},
    "batch 0": {"model": "gpt-2", "batch_size": 0},
    "negative batch": {"model": "gpt-2", "batch_size": -4},
    "unknown precision": {"model": "gpt-2", "precision": "fp7"},
    "unknown optimizer": {"model": "gpt-2", "optimizer": "adamax9"},
    "unknown field": {"model": "gpt-2", "colour": "red"},
    "micro batch does not divide": {"model": "gpt-2", "batch_size": 6, "micro_batch_size": 4},
    "negative input dim": {
        "architecture": {**TINY_MLP, "inputs": [{"name": "x", "shape": ["batch", -64]}]}
    },
    "zero stage 4": {"model": "gpt-2", "parallelism": {"data": 2, "zero_stage": 4}},
    "bucket view not a boolean": {
        "model": "gpt-2",
        "parallelism": {"data": 2, "gradient_as_bucket_view": "maybe"},
    },
    "expandable segments not a boolean": {
        "model": "gpt-2",
        "framework_overhead": {"expandable_segments": "maybe"},
    },
    "round allocations not a boolean": {
        "model": "gpt-2",
        "framework_overhead": {"round_allocations": 3},
    },
    "unknown overhead field": {"model": "gpt-2", "framework_overhead": {"max_split_size": 1}},
}


@pytest.mark.parametrize("case", list(BAD))
def test_schema_errors_are_422(client: ApiClient, case: str) -> None:
    body = {"mode": "training", "batch_size": 2, "sequence_length": 16, **BAD[case]}
    assert_problem(client.post("/v1/estimates/memory", json=body), 422, "validation-error")


def _inline(*layers: dict[str, Any], inputs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"inputs": inputs or TINY_MLP["inputs"], "layers": list(layers)}


GRAPH_ERRORS = {
    "unknown op": (_inline({"name": "warp", "op": "warp_drive"}), "layer 'warp': field 'op'"),
    "shape mismatch": (
        _inline({"name": "fc", "op": "linear", "out_features": 4, "in_features": 32}),
        "layer 'fc': field 'in_features': in_features 32 does not match input 64",
    ),
    "cycle": (
        _inline(
            {"name": "a", "op": "add", "inputs": ["x", "b"]},
            {"name": "b", "op": "relu", "inputs": ["a"]},
        ),
        "layer 'a': field 'inputs'",
    ),
    "conv on a 2-d input": (
        _inline({"name": "conv", "op": "conv2d", "out_channels": 8, "kernel_size": 3}),
        "layer 'conv': field 'inputs'",
    ),
    "conv3d on a 2-d input": (
        _inline(
            {"name": "c3", "op": "conv3d", "out_channels": 8, "kernel_size": 3},
            inputs=[{"name": "x", "shape": ["batch", 3, 32, 32]}],
        ),
        "layer 'c3': field 'inputs': expects a 5-d input (N, C, D, H, W)",
    ),
    "conv_transpose3d output padding": (
        _inline(
            {
                "name": "up",
                "op": "conv_transpose3d",
                "out_channels": 8,
                "kernel_size": 2,
                "stride": 2,
                "output_padding": 2,
            },
            inputs=[{"name": "x", "shape": ["batch", 4, 8, 8, 8]}],
        ),
        "layer 'up': field 'output_padding'",
    ),  # fmt: skip
    "unbound symbol": (
        _inline(
            {"name": "fc", "op": "linear", "out_features": 4},
            inputs=[{"name": "x", "shape": ["batch", "width"]}],
        ),
        "symbol 'width' is not bound",
    ),
    "parameters too large": (
        _inline(
            {"name": "huge", "op": "linear", "out_features": 2**40},
            inputs=[{"name": "x", "shape": ["batch", 2**20]}],
        ),
        "layer 'huge': field 'params'",
    ),
    "tensor too large": (
        _inline(
            {"name": "wide", "op": "linear", "out_features": 2**30},
            inputs=[{"name": "x", "shape": ["batch", 2**20, 64]}],
        ),
        "layer 'wide'",
    ),
}


@pytest.mark.parametrize("case", list(GRAPH_ERRORS))
def test_graph_errors_are_422_naming_layer_and_field(client: ApiClient, case: str) -> None:
    architecture, fragment = GRAPH_ERRORS[case]
    response = client.post(
        "/v1/estimates/memory",
        json={"architecture": architecture, "mode": "training", "batch_size": 2},
    )
    body = assert_problem(response, 422, "invalid-input")
    assert fragment in body["detail"]


def test_byte_overflow_is_422_not_500(client: ApiClient) -> None:
    response = client.post(
        "/v1/estimates/memory",
        json={
            "model": "gpt-3-175b",
            "mode": "training",
            "batch_size": 1_048_576,
            "sequence_length": 16_777_216,
        },
    )
    body = assert_problem(response, 422)
    assert "2^" in body["detail"]


def test_semantic_errors_are_422(client: ApiClient) -> None:
    quantized = client.post(
        "/v1/estimates/memory",
        json={"model": "gpt-2", "mode": "training", "batch_size": 1, "precision": "int4"},
    )
    assert "inference" in assert_problem(quantized, 422)["detail"]
    zero = client.post(
        "/v1/estimates/memory",
        json={
            "model": "gpt-2", "mode": "training", "batch_size": 1,
            "parallelism": {"zero_stage": 1, "cpu_offload": True},
        },
    )  # fmt: skip
    assert "zero_stage" in assert_problem(zero, 422)["detail"]


def test_unknown_model_and_hardware_are_404(client: ApiClient) -> None:
    missing = {"model": "gpt-9", "mode": "inference", "batch_size": 1}
    assert (
        "gpt-9" in assert_problem(client.post("/v1/estimates/memory", json=missing), 404)["detail"]
    )
    hw = {"model": "gpt-2", "mode": "inference", "batch_size": 1, "hardware": "nvidia-x9000"}
    assert_problem(client.post("/v1/estimates/memory", json=hw), 404)
    assert_problem(client.get("/v1/models/gpt-9/summary"), 404)
    get = client.get("/v1/estimates/memory", params={"model": "gpt-2", "mode": "inference"})
    assert_problem(get, 422)


def test_cached_estimates_follow_model_edits(client: ApiClient) -> None:
    model = {
        "slug": "edit-me",
        "name": "Edit me",
        "family": "mlp",
        "inputs": [{"name": "x", "shape": ["batch", 64]}],
        "layers": [{"name": "fc", "op": "linear", "out_features": 16}],
    }
    client.post("/v1/models", json=model)
    body = {"model": "edit-me", "mode": "inference", "batch_size": 1, "runtime": "pytorch_cpu"}
    first = _estimate(client, **body)
    assert _estimate(client, **body) == first  # served from the cache
    wider = {**model, "layers": [{"name": "fc", "op": "linear", "out_features": 4096}]}
    wider.pop("slug")
    assert (
        client.put("/v1/models/edit-me", json=wider, headers={"If-Match": '"1"'}).status_code == 200
    )
    assert _estimate(client, **body)["params"] == 64 * 4096 + 4096
    client.delete("/v1/models/edit-me", headers={"If-Match": "*"})
    client.post("/v1/models", json=model)  # same slug, new row
    assert _estimate(client, **body)["params"] == first["params"]


def test_defaults_are_echoed_and_follow_the_table(client: ApiClient) -> None:
    """Every option left out is named with the value the one default table gave it."""
    body = _estimate(
        client, model="llama-3-8b", mode="inference", batch_size=8,
        hardware="nvidia-a100-80gb-sxm",
    )  # fmt: skip
    used = {row["option"]: row["value"] for row in body["defaults_used"]}
    assert used == {
        "runtime": "pytorch_cuda",
        "precision": "bf16",
        "sequence_length": "8192",
        "logits": "last",
        "attention": "flash",
        # the CUDA context table (issue 32): A100 (sm80), CUDA 12 lazy, the row for any GPU
        "cuda_context_bytes": str(400 * 2**20),
    }
    (context,) = [row for row in body["defaults_used"] if row["option"] == "cuda_context_bytes"]
    assert "lazy module loading, CUDA 12, sm80" in context["reason"]
    assert body["precision"] == "bf16"
    assert body["bindings"]["seq"] == 8192
    assert body["attention"][0].startswith("flash: ")
    cpu = _estimate(
        client, model="bert-base", mode="inference", batch_size=8, runtime="pytorch_cpu"
    )
    cpu_used = {row["option"]: row["value"] for row in cpu["defaults_used"]}
    assert cpu_used["precision"] == "fp32"
    assert "cuda_context_bytes" not in cpu_used  # no CUDA context on a CPU
    assert "kv_cache" not in {line["key"] for line in cpu["breakdown"]}  # an encoder


def test_llama3_8b_serving_target(client: ApiClient) -> None:
    """Issue 12's target: Llama-3-8B bf16 inference, batch 8 x 4,096 tokens, CUDA defaults:
    under 36 GiB, and the fit on a 3g.40gb-sized budget agrees."""
    body = _estimate(
        client, model="llama-3-8b", mode="inference", batch_size=8, sequence_length=4096,
        precision="bf16", hardware="nvidia-a100-80gb-sxm",
    )  # fmt: skip
    assert body["peak_bytes"] < 36 * 2**30
    keys = {line["key"] for line in body["breakdown"]}
    assert {"weights", "kv_cache", "cuda_context", "workspace"} <= keys
    assert "gradients" not in keys


def test_a_graph_that_says_how_attention_is_computed_is_refused(
    client: ApiClient, db_url: str
) -> None:
    """'fused' was a graph attribute; the implementation is now the request's `attention`."""
    before = table_counts(db_url)
    attention: dict[str, Any] = {"name": "attn", "op": "attention", "num_heads": 4, "fused": True}
    payload: dict[str, Any] = {
        "slug": "says-fused",
        "name": "Says fused",
        "family": "transformer-encoder",
        "inputs": [{"name": "x", "shape": ["batch", 16, 64]}],
        "layers": [attention],
    }
    body = assert_problem(client.post("/v1/models", json=payload), 422)
    assert "attention=eager|sdpa_math|flash|mem_efficient" in body["detail"]
    assert table_counts(db_url) == before
    attention.pop("fused")
    assert client.post("/v1/models", json=payload).status_code == 201
    flash = _estimate(client, model="says-fused", mode="training", batch_size=2, attention="flash")
    eager = _estimate(client, model="says-fused", mode="training", batch_size=2, attention="eager")
    assert flash["attention"] == ["flash: requested"]
    assert flash["peak_bytes"] < eager["peak_bytes"]  # no S x S probabilities kept


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("attention", "fast"),
        ("logits", "first"),
        ("precision", "int3"),
        ("safety_margin_fraction", 1),
    ],
)
def test_bad_workload_options_are_422(
    client: ApiClient, db_url: str, field: str, value: Any
) -> None:
    before = table_counts(db_url)
    payload = {"model": "gpt-2", "mode": "inference", "batch_size": 1, field: value}
    body = assert_problem(client.post("/v1/estimates/memory", json=payload), 422)
    assert field in body["detail"]
    assert table_counts(db_url) == before
