"""The README shows the one default table exactly as the code defines it."""

from __future__ import annotations

from pathlib import Path

from app.domain.workload import DEFAULTS, defaults_table_markdown

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_default_table_matches_the_code() -> None:
    assert len(DEFAULTS) >= 10
    table = defaults_table_markdown()
    assert table in README.read_text(), (
        "README.md's defaults table drifted from app/domain/workload.py DEFAULTS; paste:\n" + table
    )
