"""The container image is built from requirements.lock: every runtime dependency pinned."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.config import PROJECT_ROOT

LOCK = PROJECT_ROOT / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def _runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"]]


def _entries() -> list[list[str]]:
    """The lock's requirement entries, each its lines (continuations joined)."""
    entries: list[list[str]] = []
    for line in LOCK.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line.startswith(" ") and entries:
            entries[-1].append(stripped)
        else:
            entries.append([stripped])
    return entries


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for entry in _entries():
        match = PIN.match(entry[0])
        assert match, f"not pinned with ==: {entry[0]!r}"
        pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def test_every_entry_is_pinned_with_hashes() -> None:
    entries = _entries()
    assert len(entries) >= len(_runtime_requirements())
    for entry in entries:
        assert PIN.match(entry[0]), f"not pinned with ==: {entry[0]!r}"
        hashes = [part for part in entry[1:] if part.startswith("--hash=sha256:")]
        assert hashes, f"{entry[0]} has no sha256 hash (pip install --require-hashes needs one)"


def test_every_runtime_dependency_and_extra_is_locked_within_its_range() -> None:
    pins = _pins()
    for requirement in _runtime_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is missing from requirements.lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{requirement.name}=={pins[name]} is outside pyproject's {requirement.specifier}"
        )
        # The packages an extra adds (uvicorn[standard], psycopg[binary]) are locked too, as
        # the installed distribution's metadata names them (for Linux, what the image runs).
        for extra in requirement.extras:
            for text in requires(requirement.name) or []:
                needed = Requirement(text)
                marker = needed.marker
                if marker is None or not marker.evaluate({"extra": extra}):
                    continue
                if marker.evaluate({"extra": ""}):
                    continue  # a base dependency, checked through its own requirement
                assert canonicalize_name(needed.name) in pins, (
                    f"{needed.name} ({requirement.name}[{extra}]) is missing from the lock"
                )


def test_the_lock_pins_the_build_backend_for_the_editable_install() -> None:
    pins = _pins()
    build = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["build-system"]
    for text in build["requires"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins
        assert requirement.specifier.contains(pins[name])


def test_the_dockerfile_builds_from_the_lock_in_two_stages() -> None:
    dockerfile = (PROJECT_ROOT / "Dockerfile").read_text()
    instructions = [
        " ".join(chunk.split())
        for chunk in re.split(r"(?<!\\)\n", dockerfile)
        if chunk.strip() and not chunk.lstrip().startswith("#")
    ]
    stages = [line for line in instructions if line.startswith("FROM ")]
    assert len(stages) == 2
    assert stages[0].endswith(" AS builder")
    ignored = (PROJECT_ROOT / ".dockerignore").read_text().split()
    for line in instructions:
        if not line.startswith("COPY ") or "--from=" in line:
            continue
        *sources, _target = line.split()[1:]
        for source in sources:
            assert (PROJECT_ROOT / source).exists(), f"COPY source {source} does not exist"
            assert Path(source).parts[0] not in ignored, f"{source} is in .dockerignore"
    assert any(
        "pip install --require-hashes --no-deps -r /tmp/requirements.lock" in line
        for line in instructions
    )
    runtime = instructions[instructions.index(stages[1]) :]
    assert "COPY --from=builder /opt/venv /opt/venv" in runtime
    assert not any(line.startswith("RUN pip") for line in runtime)  # nothing resolved there
    users = [line for line in runtime if line.startswith("USER ")]
    assert users == ["USER capplan"]
    assert any(line.startswith("HEALTHCHECK ") and "/healthz" in line for line in runtime)


def test_make_lock_regenerates_it() -> None:
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    assert re.search(r"^lock:.*\n\tbash scripts/lock\.sh$", makefile, re.MULTILINE)
    script = (PROJECT_ROOT / "scripts" / "lock.sh").read_text()
    assert "--generate-hashes" in script
    assert "--output-file requirements.lock" in script
