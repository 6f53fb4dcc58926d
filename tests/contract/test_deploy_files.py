"""docker-compose.yml, Dockerfile, README, docs/configuration.md and .ci/run hold together (no
Docker engine here)."""

import re
import shlex
from typing import Any

import yaml
from sqlalchemy.engine import make_url

from app.config import PROJECT_ROOT, Settings

COMPOSE: dict[str, Any] = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (PROJECT_ROOT / "Dockerfile").read_text()
README = (PROJECT_ROOT / "README.md").read_text()
CONFIGURATION = (PROJECT_ROOT / "docs" / "configuration.md").read_text()
RUN_COMMAND = "bash scripts/run.sh"
TEST_COMMAND = "bash scripts/test.sh"


def test_compose_runs_the_api_against_postgres() -> None:
    services = COMPOSE["services"]
    assert set(services) == {"db", "api"}
    db, api = services["db"], services["api"]
    assert db["image"].startswith("postgres:")
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert api["depends_on"] == {"db": {"condition": "service_healthy"}}
    url = make_url(api["environment"]["CAPPLAN_DATABASE_URL"])
    assert (url.drivername, url.host, url.database) == ("postgresql+psycopg", "db", "capplan")
    assert url.username == db["environment"]["POSTGRES_USER"]
    assert url.password == db["environment"]["POSTGRES_PASSWORD"]
    assert url.database == db["environment"]["POSTGRES_DB"]
    assert "127.0.0.1:8000:8000" in api["ports"]
    assert api["environment"]["CAPPLAN_HOST"] == "0.0.0.0"
    assert "/readyz" in " ".join(api["healthcheck"]["test"])
    assert api["build"] == "."


def test_compose_keeps_the_database_in_a_named_volume() -> None:
    volume = COMPOSE["services"]["db"]["volumes"][0].split(":")
    assert volume == ["pgdata", "/var/lib/postgresql/data"]
    assert "pgdata" in COMPOSE["volumes"]


def test_compose_environment_names_real_settings() -> None:
    fields = {f"CAPPLAN_{name.upper()}" for name in Settings.model_fields}
    assert set(COMPOSE["services"]["api"]["environment"]) <= fields


def test_dockerfile_builds_a_non_root_image_that_migrates_then_serves() -> None:
    assert re.search(r"^FROM python:3\.11", DOCKERFILE, re.M)
    assert re.search(r"^USER (?!root)\w+", DOCKERFILE, re.M)
    assert "EXPOSE 8000" in DOCKERFILE
    cmd = DOCKERFILE.split("\nCMD ")[1]
    steps = [cmd.index(f"capplan-server {step}") for step in ("migrate", "catalog-sync", "serve")]
    assert steps == sorted(steps)
    stages = re.findall(r"^FROM \S+ AS (\w+)", DOCKERFILE, re.M)
    assert stages == ["builder"]  # multi-stage: the runtime stage installs nothing
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY "):
            words = shlex.split(line)[1:]
            flags = [w for w in words if w.startswith("--")]
            if any(flag.startswith("--from=") for flag in flags):
                assert "--from=builder" in flags, line
                continue  # copied out of the builder stage, not from the checkout
            for source in [w for w in words if not w.startswith("--")][:-1]:
                assert (PROJECT_ROOT / source).exists(), source
    assert "requirements.lock" in DOCKERFILE
    assert "--require-hashes" in DOCKERFILE


def test_readme_opens_with_the_two_commands() -> None:
    head = README[:1500]
    assert RUN_COMMAND in head
    assert TEST_COMMAND in head
    assert "http://127.0.0.1:8000/docs" in head


def test_ci_runs_the_readme_test_command() -> None:
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip().startswith("bash ")]
    assert commands == [TEST_COMMAND]
    assert "TEST_DATABASE_URL" in ci


def test_the_configuration_page_documents_every_setting_in_its_table() -> None:
    assert "](docs/configuration.md)" in README
    table = [line for line in CONFIGURATION.splitlines() if line.startswith("| `CAPPLAN_")]
    undocumented = [
        f"CAPPLAN_{name.upper()}"
        for name in Settings.model_fields
        if not any(f"`CAPPLAN_{name.upper()}`" in line.split("|")[1] for line in table)
    ]
    assert undocumented == []
