"""`capplan recommend` passes the price kind and the SLO margin and says what it used."""

import io
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.client.cli import main
from app.main import create_app
from tests.support import settings_for


@pytest.fixture
def http(db_url: str) -> Iterator[TestClient]:
    app = create_app(settings_for(db_url, api_keys="key-1"))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    app.state.engine.dispose()


def run(http: TestClient, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*argv, "--api-key", "key-1"], http=http, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_recommend_states_the_price_kind_and_the_margin(http: TestClient) -> None:
    base = ("recommend", "resnet-50", "--batch", "8", "--precision", "int8",
            "--devices", "nvidia-a10,nvidia-h200-sxm/1g.18gb")  # fmt: skip
    code, out, err = run(http, *base)
    assert code == 0, err
    assert "$/M: on_demand prices only\n" in out
    code, out, err = run(http, *base, "--price-kind", "reserved", "--slo-ms", "100",
                         "--slo-margin", "0.2")  # fmt: skip
    assert code == 0, err
    assert "$/M: reserved prices only; SLO met at <= 80 ms (20% margin)" in out
    assert out.startswith("Run resnet-50 on NVIDIA H200")
    assert run(http, *base, "--price-kind", "list")[0] == 2  # argparse refuses it
    code, _, err = run(http, *base, "--slo-margin", "0.2")  # a margin without an SLO
    assert code == 3  # the server's 422 (exit codes: capplan --help)
    assert "422" in err
