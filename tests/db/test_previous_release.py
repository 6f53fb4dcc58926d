"""The previous release's code on this release's schema (rollback: `kubectl rollout undo`; and
the old pods of a rolling upgrade once the first new pod has migrated).

The previous release is the commit before the one that added this code's head migration to
the main line (first parents: a migration written on a branch lands with its merge), the
last code that shipped the revision before it. Its tree is exported from git into a temporary
directory and run in a subprocess against a database migrated to head by this code. This needs
the git history (a shallow CI clone fails here: clone with ``fetch-depth: 0``).
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

from alembic.script import ScriptDirectory

from app.config import PROJECT_ROOT
from app.db.migrations import alembic_config, head_revisions

PROBE = Path(__file__).with_name("previous_release_probe.py")
COMPAT = PROJECT_ROOT / "app" / "db" / "schema_compat.py"
EXPORTED = ["app", "migrations", "alembic.ini", "hardware_catalog"]


def _git(*args: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, f"git {' '.join(args)} failed: {result.stderr.strip()}"
    return result.stdout.strip()


def previous_release() -> str:
    """The commit of the previous release (see the module docstring)."""
    assert shutil.which("git"), "git is needed to check out the previous release"
    assert _git("rev-parse", "--is-shallow-repository") == "false", (
        "this test needs the full git history (a shallow clone has no previous release): "
        "`git fetch --unshallow`, or clone with fetch-depth 0 in CI"
    )
    script = ScriptDirectory.from_config(alembic_config())
    (head,) = head_revisions()
    path = Path(script.get_revision(head).path).resolve()
    relative = path.relative_to(Path(_git("rev-parse", "--show-toplevel")).resolve())
    # Along the first parents (the main line: a migration written on a branch lands with its
    # merge, whose first parent is main before it, with the revision below it).
    added = _git(
        "log", "--first-parent", "--diff-filter=A", "--format=%H", "--", str(relative)
    ).splitlines()
    if not added:
        # The head migration is not committed yet: the committed tree is the previous release.
        return _git("rev-parse", "HEAD")
    return _git("rev-parse", f"{added[-1]}^1")


def _export(commit: str, into: Path) -> None:
    archive = subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), "archive", "--format=tar", commit, *EXPORTED],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def _probe(tree: Path, db_url: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("CAPPLAN_API_KEYS", None)
    result = subprocess.run(
        [sys.executable, str(PROBE), str(tree), db_url, str(COMPAT)],
        capture_output=True,
        text=True,
        cwd=tree,
        env=env,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def test_previous_release_is_ready_and_serves_on_this_schema(db_url: str, tmp_path: Path) -> None:
    commit = previous_release()
    _export(commit, tmp_path)
    answer = _probe(tmp_path, db_url)

    assert answer["code_heads"] != sorted(head_revisions()), (
        f"{commit} ships the same head; it is not the previous release"
    )
    # The expand rule: this schema has everything the previous release's code maps.
    assert answer["rule"] == {"status": "newer", "ready": True, "problems": []}
    if answer["has_schema_compat"]:
        # A release with this rule says so itself (older releases demanded their exact head).
        assert answer["answers"]["readyz"]["status"] == 200, answer["answers"]["readyz"]
        assert answer["answers"]["readyz"]["body"]["schema_status"] == "newer"
    reads = answer["answers"]
    assert reads["/v1/hardware"]["status"] == 200
    assert reads["/v1/hardware/nvidia-h100-sxm"] == {"status": 200, "memory_bytes": 80 * 2**30}
    assert reads["/v1/models/resnet-50"]["status"] == 200
    assert reads["recommendation"]["status"] == 200
    assert reads["recommendation"]["eligible_candidates"] > 0


def test_previous_release_is_found_in_history() -> None:
    """The previous release ships the revision just before this code's head."""
    commit = previous_release()
    (head,) = head_revisions()
    script = ScriptDirectory.from_config(alembic_config())
    down = script.get_revision(head).down_revision
    listed = _git("ls-tree", "-r", "--name-only", commit, "migrations/versions")
    revisions = {
        line.split("Revision ID: ")[1].strip()
        for name in listed.splitlines()
        for line in _git("show", f"{commit}:{name}").splitlines()
        if line.startswith("Revision ID: ")
    }
    assert down in revisions
    assert head not in revisions
