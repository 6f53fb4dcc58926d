"""No tracked text file keeps a merge conflict's markers (parallel branches land by merges)."""

from __future__ import annotations

import re
import subprocess

from app.config import PROJECT_ROOT

MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)


def test_no_tracked_file_holds_conflict_markers() -> None:
    listed = subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), "ls-files", "-z"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.split(b"\0")
    paths = [PROJECT_ROOT / name.decode() for name in listed if name]
    assert len(paths) > 100  # the listing worked
    marked = []
    for path in paths:
        if not path.is_file() or path.suffix in {".onnx", ".png", ".pt", ".bin"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if MARKER.search(text):
            marked.append(str(path.relative_to(PROJECT_ROOT)))
    assert marked == []
