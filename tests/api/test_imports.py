"""POST /v1/models/import/{hf-config,onnx} against the real app and database."""

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from app.api.errors import import_memory_detail
from app.config import PROJECT_ROOT
from app.services import imports as import_service
from tests.api.helpers import assert_problem
from tests.importers import onnx_models
from tests.support import ApiClient, ClientFactory, table_counts

HF_CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs"


def _config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((HF_CONFIGS / f"{name}.json").read_text())
    return loaded


def _upload(client: ApiClient, data: bytes, **fields: Any) -> Any:
    form = {"slug": "uploaded", **{k: str(v).lower() if isinstance(v, bool) else str(v)
                                   for k, v in fields.items()}}  # fmt: skip
    return client.post(
        "/v1/models/import/onnx",
        files={"file": ("model.onnx", data, "application/octet-stream")},
        data=form,
    )


def test_hf_import_stores_an_editable_model_with_the_transformers_count(
    client: ApiClient,
) -> None:
    response = client.post(
        "/v1/models/import/hf-config", json={"slug": "my-llama", "config": _config("llama-3-8b")}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert response.headers["etag"] == '"1"'
    assert response.headers["location"] == "/v1/models/my-llama"
    assert body["model"]["provenance"] == "hf_config"
    assert body["model"]["family"] == "transformer-decoder"
    assert body["model"]["default_bindings"] == {"seq": 4096}
    report = body["report"]
    assert report["source"] == "hf_config"
    assert report["parameter_count"] == 8_030_261_248
    assert report["source_parameter_count"] is None
    assert report["reference"] == "transformers LlamaForCausalLM (LM head untied)"
    assert {"source_op": "layers", "count": 32,
            "mapped_to": ["rmsnorm", "attention", "add", "rmsnorm", "mlp", "add"]} in report[
        "op_mapping"]  # fmt: skip
    assert report["unsupported_ops"] == []
    assert any("default sequence length 4096" in a for a in report["assumptions"])

    summary = client.get("/v1/models/my-llama/summary", params={"sequence_length": 128}).json()
    assert summary["total_params"] == 8_030_261_248
    estimate = client.post(
        "/v1/estimates/memory",
        json={"model": "my-llama", "mode": "inference", "batch_size": 1, "precision": "bf16"},
    )
    assert estimate.status_code == 200, estimate.text

    stored = client.get("/v1/models/my-llama").json()
    stored.pop("slug")
    for key in ("provenance", "layer_count", "version", "created_at", "updated_at"):
        stored.pop(key)
    stored["name"] = "renamed"
    replaced = client.put("/v1/models/my-llama", json=stored, headers={"If-Match": '"1"'})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["provenance"] == "hf_config"
    assert client.delete("/v1/models/my-llama", headers={"If-Match": '"2"'}).status_code == 204


def test_hf_import_moe_and_overrides(client: ApiClient) -> None:
    response = client.post(
        "/v1/models/import/hf-config",
        json={
            "slug": "mixtral",
            "name": "Mixtral",
            "family": "moe",
            "sequence_length": 2048,
            "config": _config("mixtral-8x7b-v0.1"),
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["report"]["parameter_count"] == 46_702_792_704
    assert body["model"]["name"] == "Mixtral"
    assert body["model"]["family"] == "moe"
    assert body["model"]["default_bindings"] == {"seq": 2048}
    ops = {op for entry in body["report"]["op_mapping"] for op in entry["mapped_to"]}
    assert "moe" in ops


@pytest.mark.parametrize(
    ("config", "status", "kind", "pointer"),
    [
        ({"model_type": "falcon"}, 422, "unsupported-model-type", "/config/model_type"),
        ({"model_type": "llama"}, 422, "invalid-import", "/config/hidden_size"),
        ({**_config("gpt2"), "n_layer": -3}, 422, "invalid-import", "/config/n_layer"),
        ({**_config("bert-base-uncased"), "position_embedding_type": "relative_key"}, 422,
         "invalid-import", "/config/position_embedding_type"),
        # issue 31: fields that contradict each other name the one at fault
        ({**_config("gpt-bigcode-santacoder"), "n_head": 15}, 422, "invalid-import",
         "/config/n_head"),
        ({**_config("gpt-bigcode-santacoder"), "num_key_value_heads": 4}, 422, "invalid-import",
         "/config/num_key_value_heads"),
        ({**_config("qwen3-0.6b"), "num_key_value_heads": 3}, 422, "invalid-import",
         "/config/num_key_value_heads"),
        ({**_config("opt-125m"), "num_attention_heads": 7}, 422, "invalid-import",
         "/config/num_attention_heads"),
        # served families (app/importers/hf_families.py)
        ({"model_type": "gemma3"}, 422, "unsupported-model-type", "/config/model_type"),
        ({**_config("deepseek-v2-lite-chat"), "kv_lora_rank": None}, 422, "invalid-import",
         "/config/kv_lora_rank"),
        ({**_config("gemma-2-9b-it"), "layer_types": ["full_attention"] * 41}, 422,
         "invalid-import", "/config/layer_types"),
        ({**_config("gpt-oss-20b"), "num_experts_per_tok": 33}, 422, "invalid-import",
         "/config/num_experts_per_tok"),
    ],
)  # fmt: skip
def test_hf_import_rejects_bad_configs(
    client: ApiClient,
    db_url: str,
    config: dict[str, Any],
    status: int,
    kind: str,
    pointer: str,
) -> None:
    before = table_counts(db_url)
    response = client.post("/v1/models/import/hf-config", json={"slug": "x", "config": config})
    body = assert_problem(response, status, kind)
    assert body["errors"][0]["pointer"] == pointer
    if kind == "unsupported-model-type":
        assert "llama, mistral, mixtral, qwen2, gemma" in body["detail"] or "gpt_neox" in body[
            "detail"]  # fmt: skip
    assert table_counts(db_url) == before


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("gpt-bigcode-santacoder", 1_124_886_528),
        ("phi-3-mini-4k-instruct", 3_821_079_552),
        ("qwen3-0.6b", 596_049_920),
        ("opt-350m", 331_196_416),
        ("phi-2", 2_779_683_840),
        ("bloomz-560m", 559_214_592),
        ("granite-3.3-8b-instruct", 8_170_864_640),
        ("gemma-2-9b-it", 9_241_705_984),
        ("gemma-3-1b-it", 999_885_952),
        ("gpt-oss-20b", 20_914_757_184),
        ("deepseek-v2-lite-chat", 15_706_484_224),
        ("qwen1.5-moe-a2.7b", 14_315_784_192),
        ("qwen3-30b-a3b", 30_532_122_624),
        ("llama-4-scout-17b-16e-text", 107_769_861_120),
    ],
)
def test_hf_import_of_served_families_estimates(client: ApiClient, name: str, params: int) -> None:
    """Issue 31: each family imports with transformers' count (pinned in
    tests/importers/test_hf_config.py, checked by benchmarks/hf_params) and estimates."""
    response = client.post(
        "/v1/models/import/hf-config",
        json={"slug": "served", "sequence_length": 512, "config": _config(name)},
    )
    assert response.status_code == 201, response.text
    assert response.json()["report"]["parameter_count"] == params
    estimate = client.post(
        "/v1/estimates/memory",
        json={"model": "served", "mode": "inference", "batch_size": 1, "precision": "bf16"},
    )
    assert estimate.status_code == 200, estimate.text


def test_multi_query_import_caches_one_kv_head(client: ApiClient) -> None:
    """SantaCoder keeps K and V of one head (head_dim 2048 / 16 = 128) per layer and token."""
    for slug, config in (
        ("mqa", _config("gpt-bigcode-santacoder")),
        ("mha", {**_config("gpt-bigcode-santacoder"), "multi_query": False}),
    ):
        response = client.post("/v1/models/import/hf-config", json={"slug": slug, "config": config})
        assert response.status_code == 201, response.text
    kv = {}
    for slug in ("mqa", "mha"):
        estimate = client.post("/v1/estimates/memory", json={
            "model": slug, "mode": "inference", "batch_size": 1, "sequence_length": 2048,
            "precision": "bf16", "hardware": "nvidia-a100-80gb-sxm"})  # fmt: skip
        assert estimate.status_code == 200, estimate.text
        breakdown = estimate.json()["breakdown"]
        kv[slug] = next(line["bytes"] for line in breakdown if line["key"] == "kv_cache")
    assert kv["mqa"] == 2 * 24 * 1 * 128 * 2048 * 2  # K and V x layers x head x dim x tokens x bf16
    assert kv["mha"] == 16 * kv["mqa"]


def test_hf_import_schema_errors_and_duplicates(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    assert_problem(client.post("/v1/models/import/hf-config", json={"slug": "x"}), 422)
    assert_problem(
        client.post("/v1/models/import/hf-config", json={"slug": "Bad Slug", "config": {}}), 422
    )
    assert table_counts(db_url) == before
    payload = {"slug": "resnet-50", "config": _config("gpt2")}
    assert_problem(client.post("/v1/models/import/hf-config", json=payload), 409, "already-exists")
    assert table_counts(db_url) == before


def test_onnx_import_maps_ops_and_counts_initializers(client: ApiClient) -> None:
    response = _upload(client, onnx_models.small_cnn(), slug="small-cnn", family="cnn")
    assert response.status_code == 201, response.text
    body = response.json()
    report = body["report"]
    assert body["model"]["provenance"] == "onnx"
    assert body["model"]["family"] == "cnn"
    assert body["model"]["inputs"] == [
        {"name": "image", "shape": ["batch", 3, 32, 32], "dtype": "float"}
    ]
    assert report["parameter_count"] == report["source_parameter_count"] == 2_970
    mapping = {entry["source_op"]: entry["mapped_to"] for entry in report["op_mapping"]}
    assert mapping["Conv"] == ["conv2d"]
    assert mapping["Gemm"] == ["linear"]
    assert mapping["BatchNormalization"] == ["batchnorm2d"]
    assert mapping["GlobalAveragePool"] == ["adaptive_avgpool2d"]
    summary = client.get("/v1/models/small-cnn/summary", params={"batch_size": 4}).json()
    assert summary["total_params"] == 2_970
    assert summary["layers"][-1]["output_shape"] == [4, 10]
    estimate = client.get(
        "/v1/estimates/memory",
        params={"model": "small-cnn", "mode": "training", "batch_size": 8},
    )
    assert estimate.status_code == 200, estimate.text


@pytest.mark.parametrize("external", [False, True], ids=["stripped", "external data"])
def test_onnx_import_of_a_graph_without_weights(client: ApiClient, external: bool) -> None:
    """Shapes, not weights: a graph-only file (or one whose weights live in a data file that
    is not uploaded) is stored with the same parameters and gives the same estimate."""
    full = _upload(client, onnx_models.small_cnn(), slug="full-cnn")
    assert full.status_code == 201, full.text
    bare_bytes = onnx_models.without_weights(onnx_models.small_cnn(), external=external)
    bare = _upload(client, bare_bytes, slug="bare-cnn")
    assert bare.status_code == 201, bare.text
    report = bare.json()["report"]
    assert report["parameter_count"] == report["source_parameter_count"] == 2_970
    assert any(a.startswith("shapes without weights") for a in report["assumptions"])
    estimates = [
        client.get(
            "/v1/estimates/memory",
            params={"model": slug, "mode": "training", "batch_size": 8},
        ).json()["peak_bytes"]
        for slug in ("full-cnn", "bare-cnn")
    ]
    assert estimates[0] == estimates[1]


def test_onnx_import_fuses_matmul_attention_with_a_tied_head(client: ApiClient) -> None:
    response = _upload(client, onnx_models.tiny_attention(), slug="tiny-lm", sequence_length=32)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["report"]["parameter_count"] == body["report"]["source_parameter_count"] == 3_024
    assert body["model"]["inputs"][0] == {
        "name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64",
    }  # fmt: skip
    assert body["model"]["default_bindings"] == {"seq": 32}
    layers = {layer["name"]: layer for layer in body["model"]["layers"]}
    assert layers["head/MatMul"]["tied_to"] == "wte/Gather"
    ops = [layer["op"] for layer in body["model"]["layers"]]
    assert ops.count("matmul") == ops.count("softmax") == ops.count("reshape") == 0
    assert layers["attn/Softmax_attention"] == {
        "name": "attn/Softmax_attention", "op": "attention", "num_heads": 2, "num_kv_heads": 2,
        "head_dim": 8, "causal": False, "qkv_bias": True, "out_bias": True,
        "inputs": ["ln/LayerNormalization"],
    }  # fmt: skip
    assert (
        "fused 1 exporter subgraph(s): multi-head attention written out -> attention"
        in (body["report"]["assumptions"])
    )
    summary = client.get(
        "/v1/models/tiny-lm/summary", params={"batch_size": 2, "sequence_length": 24}
    ).json()
    assert summary["layers"][-1]["output_shape"] == [2, 24, 50]


def test_onnx_unsupported_ops_are_listed_then_lenient(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    body = assert_problem(_upload(client, onnx_models.with_unsupported()), 422,
                          "unsupported-onnx-ops")  # fmt: skip
    assert "Hardmax (x1)" in body["detail"]
    assert "LpNormalization (x1)" in body["detail"]
    assert [e["pointer"] for e in body["errors"]] == ["/graph/node/1", "/graph/node/2"]
    assert table_counts(db_url) == before

    response = _upload(client, onnx_models.with_unsupported(), lenient=True)
    assert response.status_code == 201, response.text
    report = response.json()["report"]
    assert [u["source_op"] for u in report["unsupported_ops"]] == ["Hardmax", "LpNormalization"]
    assert report["parameter_count"] == 20
    assert any("lower bound" in note for note in report["assumptions"])


BAD_FILES: dict[str, tuple[Callable[[], bytes], str, str]] = {
    "huge declared dims": (onnx_models.with_huge_dims, "invalid-onnx", "at most 2^40"),
    "dims that lie": (onnx_models.with_lying_dims, "invalid-onnx", "but holds 10"),
    "garbage": (lambda: b"\x00\xffnot an onnx file\xff" * 20, "invalid-onnx", "protobuf"),
    "truncated": (lambda: onnx_models.small_cnn()[:400], "invalid-onnx", "protobuf"),
    "empty": (lambda: b"", "invalid-onnx", "empty"),
    "old opset": (lambda: onnx_models.small_cnn_at_opset(6), "invalid-onnx", "opset 6"),
    # Under the 50,000-node cap, but no stored model holds 49,000 layers: refused up front.
    "49,000 layers": (lambda: onnx_models.chain(49_000), "invalid-onnx", "at most 10000 layers"),
    "a cycle": (
        onnx_models.with_cycle,
        "cyclic-onnx-graph",
        "the graph has a cycle: 'in' (Add) -> 's' -> 'mm' (MatMul) -> 'h' -> 'act' (Relu) -> "
        "'back' -> back to 'in' (Add)",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_onnx_import_rejects_bad_files(client: ApiClient, db_url: str, case: str) -> None:
    build, kind, words = BAD_FILES[case]
    before = table_counts(db_url)
    body = assert_problem(_upload(client, build()), 422, kind)
    assert words in body["detail"]
    assert "etc/passwd" not in body["detail"]
    assert table_counts(db_url) == before


def test_onnx_upload_limit_is_413(make_client: ClientFactory, db_url: str) -> None:
    client = make_client(max_import_bytes=2_000)
    before = table_counts(db_url)
    body = assert_problem(_upload(client, onnx_models.small_cnn()), 413, "payload-too-large")
    assert "CAPPLAN_MAX_IMPORT_BYTES" in body["detail"]
    assert table_counts(db_url) == before


def test_onnx_import_form_errors(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    missing_file = client.post("/v1/models/import/onnx", data={"slug": "x"})
    assert assert_problem(missing_file, 422)["errors"][0]["pointer"] == "/file"
    bad_slug = _upload(client, onnx_models.small_cnn(), slug="Not A Slug")
    assert assert_problem(bad_slug, 422)["errors"][0]["pointer"] == "/slug"
    assert_problem(client.post("/v1/models/import/onnx", json={"slug": "x"}), 422)
    assert_problem(_upload(client, onnx_models.small_cnn(), slug="vgg-16"), 409)
    assert table_counts(db_url) == before


def test_imports_need_a_write_key(make_client: ClientFactory, db_url: str) -> None:
    client = make_client(api_keys="secret")
    before = table_counts(db_url)
    assert_problem(_upload(client, onnx_models.small_cnn()), 401)
    payload = {"slug": "x", "config": _config("gpt2")}
    assert_problem(client.post("/v1/models/import/hf-config", json=payload), 401)
    assert table_counts(db_url) == before
    ok = client.post("/v1/models/import/hf-config", json=payload, headers={"X-API-Key": "secret"})
    assert ok.status_code == 201, ok.text


# -- the import gate: memory and concurrency of ONNX imports ------------------------------------


def _multipart(data: bytes, slug: str) -> dict[str, Any]:
    return {"files": {"file": ("model.onnx", data, "application/octet-stream")},
            "data": {"slug": slug}}  # fmt: skip


def test_an_upload_whose_import_needs_more_memory_than_allowed_is_a_413(
    make_client: ClientFactory, db_url: str
) -> None:
    client = make_client(import_memory_bytes=1_048_576)
    before = table_counts(db_url)
    padded = onnx_models.small_cnn() + b"\0" * 400_000  # ~0.4 MB x 2.75 > 1 MiB
    response = client.post("/v1/models/import/onnx", **_multipart(padded, "padded"))
    body = assert_problem(response, 413, "payload-too-large")
    declared = int(response.request.headers["content-length"])
    assert body["detail"] == import_memory_detail(declared, 1_048_576)
    assert "CAPPLAN_IMPORT_MEMORY_BYTES" in body["detail"]
    assert table_counts(db_url) == before
    # A small file fits the same budget.
    ok = client.post("/v1/models/import/onnx", **_multipart(onnx_models.small_cnn(), "small"))
    assert ok.status_code == 201, ok.text


@pytest.fixture
def blocked_import(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """ONNX imports hang in their mapping until released."""
    release = threading.Event()
    original = import_service.map_onnx_upload

    def blocked(*args: Any, **kwargs: Any) -> Any:
        release.wait(10)
        return original(*args, **kwargs)

    monkeypatch.setattr(import_service, "map_onnx_upload", blocked)
    yield release
    release.set()


@pytest.mark.parametrize(
    "overrides",
    [{"max_concurrent_imports": 1}, {"import_memory_bytes": 40_000}],
    ids=["one at a time", "memory for one"],
)
def test_an_import_waits_for_its_turn_then_gets_503(
    make_client: ClientFactory, db_url: str, blocked_import: threading.Event, overrides: Any
) -> None:
    client = make_client(import_queue_timeout_s=0.3, **overrides)
    data = onnx_models.small_cnn()  # ~6 KB: 2.75 x 6 KB twice is over 40,000 bytes
    assert 2 * 2.75 * (len(data) + 300) > 40_000 > 2.75 * (len(data) + 300)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        first = asyncio.create_task(
            client.async_client.post("/v1/models/import/onnx", **_multipart(data, "first"))
        )
        await asyncio.sleep(0.1)
        try:
            second = await client.async_client.post(
                "/v1/models/import/onnx", **_multipart(data, "second")
            )
        finally:
            blocked_import.set()
        return await first, second

    first, second = client.run(scenario())
    assert first.status_code == 201, first.text
    body = assert_problem(second, 503, "overloaded")
    assert second.headers["retry-after"] == "5"
    assert "CAPPLAN_MAX_CONCURRENT_IMPORTS" in body["detail"]
    assert "within 0.3 s" in body["detail"]
    assert client.get("/v1/models/second").status_code == 404
    # The place and the memory are given back: the next import goes through.
    again = client.post("/v1/models/import/onnx", **_multipart(data, "second"))
    assert again.status_code == 201, again.text


def test_imports_that_fit_together_run_together(
    make_client: ClientFactory, blocked_import: threading.Event
) -> None:
    client = make_client(max_concurrent_imports=2, import_queue_timeout_s=5)
    data = onnx_models.small_cnn()

    async def scenario() -> list[httpx.Response]:
        tasks = [asyncio.create_task(client.async_client.post(
            "/v1/models/import/onnx", **_multipart(data, f"m{i}"))) for i in range(2)]  # fmt: skip
        await asyncio.sleep(0.2)
        assert not any(task.done() for task in tasks)  # both inside, neither answered
        blocked_import.set()
        return [await task for task in tasks]

    assert [r.status_code for r in client.run(scenario())] == [201, 201]


def test_served_families_cache_what_they_attend_to(client: ApiClient) -> None:
    """Gemma-2's sliding layers keep at most 4096 tokens; DeepSeek-V2-Lite keeps one latent of
    kv_lora_rank + qk_rope_head_dim (512 + 64) a token and layer (bf16, batch 1, 8192 tokens)."""
    for slug, name in (("gemma2", "gemma-2-9b-it"), ("dsv2", "deepseek-v2-lite-chat")):
        response = client.post(
            "/v1/models/import/hf-config",
            json={"slug": slug, "sequence_length": 8192, "config": _config(name)},
        )
        assert response.status_code == 201, response.text
    kv = {}
    for slug in ("gemma2", "dsv2"):
        estimate = client.post("/v1/estimates/memory", json={
            "model": slug, "mode": "inference", "batch_size": 1, "sequence_length": 8192,
            "precision": "bf16", "hardware": "nvidia-a100-80gb-sxm"})  # fmt: skip
        assert estimate.status_code == 200, estimate.text
        breakdown = estimate.json()["breakdown"]
        kv[slug] = next(line["bytes"] for line in breakdown if line["key"] == "kv_cache")
    kv_dim = 8 * 256  # 8 KV heads of 256
    assert kv["gemma2"] == 21 * 2 * (4096 + 8192) * kv_dim * 2
    assert kv["dsv2"] == 27 * 8192 * 576 * 2


@pytest.mark.parametrize(
    ("name", "kv_bytes_per_token"),
    [
        ("deepseek-v2-lite-chat", 27 * 576 * 2),  # one latent of 512 + 64 a layer, bf16
        ("gemma-3-1b-it", 26 * 2 * 256 * 2),  # 1 KV head of 256; the windows hold 512 > 300
    ],
)
def test_served_families_price_decoder_serving(
    client: ApiClient, name: str, kv_bytes_per_token: int
) -> None:
    """The speed side reads the same layers: KV bytes per token of a latent (MLA) cache and of
    sliding layers shorter than their window."""
    payload = {"slug": "served", "config": _config(name)}
    created = client.post("/v1/models/import/hf-config", json=payload)
    assert created.status_code == 201, created.text
    response = client.post("/v1/recommendations/inference", json={
        "model": "served", "devices": ["nvidia-h100-sxm"], "precisions": ["bf16"],
        "prompt_tokens": 256, "generated_tokens": 44, "batch_sizes": [4]})  # fmt: skip
    assert response.status_code == 200, response.text
    (candidate,) = response.json()["candidates"]
    assert candidate["decoder_serving"]["kv_bytes_per_token"] == kv_bytes_per_token


def test_t5_imports_the_encoder_decoder_and_trains_on_both(client: ApiClient) -> None:
    """T5ForConditionalGeneration imports whole (transformers' 60,506,624 for t5-small); its
    training estimate holds the decoder's activations too, so it exceeds the encoder alone's."""
    peaks = {}
    for slug, name, params in (
        ("t5-full", "t5-small", 60_506_624),
        ("t5-encoder", "t5-small-encoder", 35_330_816),
    ):
        response = client.post(
            "/v1/models/import/hf-config",
            json={"slug": slug, "sequence_length": 128, "config": _config(name)},
        )
        assert response.status_code == 201, response.text
        assert response.json()["report"]["parameter_count"] == params
        estimate = client.post("/v1/estimates/memory", json={
            "model": slug, "mode": "training", "batch_size": 4, "precision": "fp32"})  # fmt: skip
        assert estimate.status_code == 200, estimate.text
        peaks[slug] = estimate.json()["peak_bytes"]
    # weights, gradients and AdamW state alone differ by 4 x 4 B x 25,175,808 parameters
    assert peaks["t5-full"] - peaks["t5-encoder"] > 16 * (60_506_624 - 35_330_816)
