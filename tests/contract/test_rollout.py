"""The deploy kit follows docs/operations.md: migrate in an init container, roll one pod at a
time, readiness on /readyz; the documented commands name what the manifests define."""

import re
import shlex
from typing import Any

import yaml

from app.cli import main
from app.config import PROJECT_ROOT, Settings

KIT = PROJECT_ROOT / "deploy" / "kubernetes"
DOC = PROJECT_ROOT / "docs" / "operations.md"
DEPLOYMENT: dict[str, Any] = yaml.safe_load((KIT / "deployment.yaml").read_text())
POD: dict[str, Any] = DEPLOYMENT["spec"]["template"]["spec"]


def _container(name: str, section: str = "containers") -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in POD.get(section, []) if c["name"] == name]
    assert len(found) == 1, (section, name)
    return found[0]


def _command(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def test_the_init_container_migrates_then_syncs_with_the_servers_image_and_database() -> None:
    migrate, api = _container("migrate", "initContainers"), _container("api")
    assert migrate["image"] == api["image"]
    command = _command(migrate)
    assert command[:2] == ["sh", "-c"]
    steps = [shlex.split(step) for step in command[2].split("&&")]
    assert steps == [["capplan-server", "migrate"], ["capplan-server", "catalog-sync"]]
    env = {item["name"]: item for item in migrate["env"]}
    api_env = {item["name"]: item for item in api["env"]}
    assert env["CAPPLAN_DATABASE_URL"] == api_env["CAPPLAN_DATABASE_URL"]
    assert set(env) <= {f"CAPPLAN_{name.upper()}" for name in Settings.model_fields}
    assert migrate["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_server_container_only_serves() -> None:
    assert _command(_container("api")) == ["capplan-server", "serve"]


def test_the_rollout_replaces_one_pod_at_a_time_and_waits_for_readiness() -> None:
    strategy = DEPLOYMENT["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert DEPLOYMENT["spec"]["minReadySeconds"] > 0
    assert _container("api")["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_procedure_is_linked_and_names_what_the_kit_defines() -> None:
    text = DOC.read_text()
    assert "](docs/operations.md)" in (PROJECT_ROOT / "README.md").read_text()
    assert "](../../docs/operations.md)" in (KIT / "README.md").read_text()
    for heading in ("## Rolling upgrade, step by step", "## Rollback, step by step"):
        assert heading in text
    # `kubectl set image` names both containers of the Deployment.
    (set_image,) = re.findall(r"set image deployment/(\S+) \\\n\s+(.+)\n", text)
    assert set_image[0] == DEPLOYMENT["metadata"]["name"]
    names = {pair.split("=")[0] for pair in set_image[1].split()}
    assert names == {c["name"] for c in POD["containers"] + POD["initContainers"]}
    assert "rollout undo deployment/capacity-planner" in text
    assert "alembic -c /app/alembic.ini downgrade" in text


def test_the_documented_commands_exist() -> None:
    parser_help = []
    for command in ("migrate", "catalog-sync"):
        try:
            main([command, "--help"])
        except SystemExit as exit_:
            parser_help.append(exit_.code)
    assert parser_help == [0, 0]
