"""The suite's split between wall-clock tests and the rest (tests/support.py, tests/conftest.py)."""

from __future__ import annotations

import pytest

from app.config import Settings
from tests.support import LOADED_MACHINE_LIMITS, settings_for

SHIPPED = Settings(_env_file=None)


def test_untimed_tests_get_the_loaded_machine_limits() -> None:
    settings = settings_for("sqlite://")
    for name, value in LOADED_MACHINE_LIMITS.items():
        assert getattr(settings, name) == value
        assert value > getattr(SHIPPED, name)


def test_a_test_that_sets_a_limit_keeps_it() -> None:
    assert settings_for("sqlite://", admission_timeout_s=0.3).admission_timeout_s == 0.3


@pytest.mark.timing
def test_timing_tests_get_the_shipped_limits() -> None:
    settings = settings_for("sqlite://")
    for name in LOADED_MACHINE_LIMITS:
        assert getattr(settings, name) == getattr(SHIPPED, name)
