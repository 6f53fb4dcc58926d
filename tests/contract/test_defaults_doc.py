"""docs/defaults.md shows the one default table exactly as the code defines it, and the README
links it."""

from __future__ import annotations

from pathlib import Path

from app.domain.workload import DEFAULTS, defaults_table_markdown

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "defaults.md"


def test_documented_default_table_matches_the_code() -> None:
    assert len(DEFAULTS) >= 10
    table = defaults_table_markdown()
    assert "](docs/defaults.md)" in (ROOT / "README.md").read_text()
    assert table in PAGE.read_text(), (
        "docs/defaults.md's defaults table drifted from app/domain/workload.py DEFAULTS; paste:\n"
        + table
    )
