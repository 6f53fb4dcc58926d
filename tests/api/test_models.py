from typing import Any

import pytest

from app.db.models import Workload
from app.db.repositories import ModelRepository
from tests.api.helpers import MODEL, assert_problem, model, without_slug
from tests.support import ApiClient, db_session, table_counts


def _seed_workload_using(db_url: str, slug: str) -> None:
    with db_session(db_url) as session:
        row = ModelRepository(session).get(slug)
        assert row is not None
        session.add(
            Workload(
                slug="nightly-train",
                name="Nightly training",
                model_id=row.id,
                mode="training",
                batch_size=32,
                precision="bf16",
                optimizer="adamw",
                options={},
            )
        )
        session.commit()


def test_create_get_list_replace_delete(client: ApiClient) -> None:
    created = client.post("/v1/models", json=model())
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["provenance"] == "user"
    assert body["layer_count"] == 5
    assert body["inputs"][0]["dtype"] == "float"
    assert created.headers["etag"] == '"1"'
    assert client.get("/v1/models/tiny-cnn").json() == body

    mine = client.get("/v1/models", params={"family": "cnn", "provenance": "user"}).json()
    assert [item["slug"] for item in mine["items"]] == ["tiny-cnn"]
    cnns = client.get("/v1/models", params={"family": "cnn", "limit": 500}).json()["items"]
    assert "tiny-cnn" in [item["slug"] for item in cnns]
    assert all(item["family"] == "cnn" for item in cnns)
    assert client.get("/v1/models", params={"family": "gan"}).json()["total"] == 0

    new_layers = [*MODEL["layers"][:-1], {"name": "fc", "op": "linear", "out_features": 100}]
    replaced = client.put(
        "/v1/models/tiny-cnn",
        json=without_slug(model(layers=new_layers)),
        headers={"If-Match": '"1"'},
    )
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["layers"][-1]["out_features"] == 100
    assert replaced.headers["etag"] == '"2"'

    assert_problem(client.delete("/v1/models/tiny-cnn", headers={"If-Match": '"1"'}), 412)
    assert client.delete("/v1/models/tiny-cnn", headers={"If-Match": '"2"'}).status_code == 204
    assert_problem(client.get("/v1/models/tiny-cnn"), 404)


def test_duplicate_model_slug_is_409(client: ApiClient, db_url: str) -> None:
    client.post("/v1/models", json=model())
    before = table_counts(db_url)
    assert_problem(client.post("/v1/models", json=model()), 409, "already-exists")
    assert table_counts(db_url) == before


def test_builtin_models_are_read_only(client: ApiClient, db_url: str) -> None:
    before = table_counts(db_url)
    put = client.put("/v1/models/resnet-50", json=without_slug(model()), headers={"If-Match": "*"})
    body = assert_problem(put, 409, "read-only")
    assert "built-in" in body["detail"]
    assert_problem(client.delete("/v1/models/resnet-50", headers={"If-Match": "*"}), 409)
    assert table_counts(db_url) == before
    assert client.get("/v1/models/resnet-50").json()["version"] == 1


def test_zoo_is_seeded_with_reference_parameter_counts(client: ApiClient) -> None:
    zoo = client.get("/v1/models", params={"provenance": "builtin", "limit": 500}).json()
    slugs = {item["slug"] for item in zoo["items"]}
    assert {"alexnet", "vgg-16", "googlenet", "resnet-50", "mobilenet-v2", "vit-b-16"} <= slugs
    assert {"bert-base", "gpt-2", "llama-2-7b", "llama-3-8b", "gpt-3-175b"} <= slugs
    assert "lstm-classifier" in slugs
    assert "3d-unet-kits19" in slugs
    unet = client.get("/v1/models/3d-unet-kits19/summary").json()
    assert unet["total_params"] == 31_190_243
    summary = client.get("/v1/models/llama-3-8b/summary", params={"sequence_length": 16}).json()
    assert summary["total_params"] == 8_030_261_248


def test_model_used_by_a_workload_cannot_be_deleted(client: ApiClient, db_url: str) -> None:
    client.post("/v1/models", json=model())
    _seed_workload_using(db_url, "tiny-cnn")
    before = table_counts(db_url)
    body = assert_problem(client.delete("/v1/models/tiny-cnn", headers={"If-Match": "*"}), 409)
    assert "workload" in body["detail"]
    assert table_counts(db_url) == before


def _layers(*layers: dict[str, Any]) -> list[dict[str, Any]]:
    return list(layers)


BAD_GRAPHS = {
    "unknown op": (
        _layers({"name": "c", "op": "conv9d", "out_channels": 3}),
        "layer 'c': field 'op'",
    ),
    "missing attribute": (
        _layers({"name": "fc", "op": "linear"}),
        "layer 'fc': field 'out_features': is required",
    ),
    "negative size": (
        _layers({"name": "conv1", "op": "conv2d", "out_channels": -64, "kernel_size": 3}),
        "layer 'conv1': field 'out_channels'",
    ),
    "zero size": (
        _layers({"name": "conv1", "op": "conv2d", "out_channels": 64, "kernel_size": 0}),
        "layer 'conv1': field 'kernel_size'",
    ),
    "unknown attribute": (
        _layers({"name": "fc", "op": "linear", "out_features": 3, "activation": "relu"}),
        "layer 'fc': field 'activation'",
    ),
    "duplicate name": (
        _layers({"name": "r", "op": "relu"}, {"name": "r", "op": "relu"}),
        "layer 'r': field 'name'",
    ),
    "undefined input": (
        _layers({"name": "sum", "op": "add", "inputs": ["image", "ghost"]}),
        "layer 'sum': field 'inputs'",
    ),
    "rnn nonlinearity": (
        _layers(
            {"name": "f", "op": "flatten", "start_dim": 2},
            {"name": "rnn", "op": "rnn", "hidden_size": 8, "nonlinearity": "gelu"},
        ),
        "layer 'rnn': field 'nonlinearity': must be one of: tanh, relu",
    ),  # fmt: skip
    "batchnorm_folded not a boolean": (
        _layers(
            {
                "name": "c",
                "op": "conv2d",
                "out_channels": 3,
                "kernel_size": 3,
                "batchnorm_folded": "yes",
            }
        ),
        "layer 'c': field 'batchnorm_folded': must be true or false",
    ),  # fmt: skip
    "conv3d kernel of four dims": (
        _layers({"name": "c3", "op": "conv3d", "out_channels": 8, "kernel_size": [3, 3, 3, 3]}),
        "layer 'c3': field 'kernel_size': must be a positive integer or a list of 3",
    ),
    "conv_transpose3d with 'same' padding": (
        _layers(
            {
                "name": "up",
                "op": "conv_transpose3d",
                "out_channels": 8,
                "kernel_size": 2,
                "padding": "same",
            }
        ),
        "layer 'up': field 'padding'",
    ),  # fmt: skip
    "forward reference (cycle)": (
        _layers(
            {"name": "a", "op": "add", "inputs": ["image", "b"]},
            {"name": "b", "op": "relu", "inputs": ["a"]},
        ),
        "layer 'a': field 'inputs'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_GRAPHS))
def test_bad_graphs_are_422_naming_layer_and_field(
    client: ApiClient, db_url: str, case: str
) -> None:
    layers, fragment = BAD_GRAPHS[case]
    before = table_counts(db_url)
    body = assert_problem(client.post("/v1/models", json=model(layers=layers)), 422)
    assert fragment in body["detail"]
    assert body["errors"][0]["pointer"].startswith("/layers/")
    assert table_counts(db_url) == before


BAD_MODELS = {
    "zero input dim": (model(inputs=[{"name": "x", "shape": ["batch", 0]}]), "/inputs/0/shape"),
    "negative input dim": (model(inputs=[{"name": "x", "shape": [-3]}]), "/inputs/0/shape"),
    "unknown input dtype": (
        model(inputs=[{"name": "x", "shape": [3], "dtype": "fp7"}]),
        "/inputs/0/dtype",
    ),
    "no layers": (model(layers=[]), "/layers"),
    "unknown field": (model(weights_url="http://x"), "/weights_url"),
    "bad family": (model(family="CNN!"), "/family"),
}


@pytest.mark.parametrize("case", list(BAD_MODELS))
def test_bad_model_fields_are_422(client: ApiClient, db_url: str, case: str) -> None:
    payload, pointer = BAD_MODELS[case]
    before = table_counts(db_url)
    body = assert_problem(client.post("/v1/models", json=payload), 422, "validation-error")
    assert any(e["pointer"].startswith(pointer) for e in body["errors"]), body["errors"]
    assert table_counts(db_url) == before


def test_duplicate_input_names_are_422(client: ApiClient) -> None:
    inputs = [{"name": "x", "shape": [1]}, {"name": "x", "shape": [2]}]
    body = assert_problem(client.post("/v1/models", json=model(inputs=inputs)), 422)
    assert "unique" in body["detail"]


def test_invalid_replacement_keeps_the_stored_graph(client: ApiClient, db_url: str) -> None:
    client.post("/v1/models", json=model())
    bad = without_slug(model(layers=[{"name": "x", "op": "nope"}]))
    assert_problem(client.put("/v1/models/tiny-cnn", json=bad, headers={"If-Match": '"1"'}), 422)
    stored = client.get("/v1/models/tiny-cnn").json()
    assert stored["version"] == 1
    assert stored["layers"] == MODEL["layers"]


VOLUME_NET = model(
    slug="tiny-unet-3d",
    inputs=[{"name": "volume", "shape": ["batch", 1, "image", "image", "image"]}],
    layers=[
        {"name": "down", "op": "conv3d", "out_channels": 8, "kernel_size": 3, "stride": 2,
         "padding": 1, "bias": False},
        {"name": "norm", "op": "instancenorm3d", "affine": True},
        {"name": "act", "op": "relu"},
        {"name": "up", "op": "conv_transpose3d", "out_channels": 4, "kernel_size": 2, "stride": 2},
        {"name": "head", "op": "conv3d", "out_channels": 3, "kernel_size": [1, 1, 1]},
    ],
    default_bindings={"image": 16},
)  # fmt: skip


def test_a_3d_model_is_stored_and_estimated(client: ApiClient) -> None:
    created = client.post("/v1/models", json=VOLUME_NET)
    assert created.status_code == 201, created.text
    summary = client.get("/v1/models/tiny-unet-3d/summary").json()
    # 8*1*27 + 2*8 + (8*4*8 + 4) + (3*4 + 3)
    assert summary["total_params"] == 216 + 16 + 260 + 15
    estimate = client.post(
        "/v1/estimates/memory",
        json={"model": "tiny-unet-3d", "mode": "training", "batch_size": 2, "image_size": 16},
    )
    assert estimate.status_code == 200, estimate.text
    assert estimate.json()["peak_bytes"] > 0
