"""A writer that read an old version loses with 412 even when it passed the If-Match check."""

import pytest

from app.db.repositories import HardwareRepository
from app.db.session import make_engine, make_session_factory
from app.schemas.hardware import HardwareCreate, HardwareReplace
from app.services.concurrency import IfMatch
from app.services.errors import PreconditionFailed
from app.services.hardware import create_hardware, get_hardware, replace_hardware
from tests.api.helpers import hardware, without_slug


def test_concurrent_replace_is_detected_by_the_version_column(db_url: str) -> None:
    engine = make_engine(db_url)
    factory = make_session_factory(engine)
    try:
        with factory() as setup:
            create_hardware(setup, payload=HardwareCreate.model_validate(hardware()))
        with factory() as slow, factory() as fast:
            # The slow request has loaded (and checked) version 1 when the fast one commits.
            stale_row = HardwareRepository(slow).get("lab-gpu-1")
            assert stale_row is not None
            assert stale_row.version == 1
            replace_hardware(
                fast,
                slug="lab-gpu-1",
                payload=HardwareReplace.model_validate(without_slug(hardware(name="fast"))),
                if_match=IfMatch.parse('"1"'),
            )
            with pytest.raises(PreconditionFailed, match="changed by another client"):
                replace_hardware(
                    slow,
                    slug="lab-gpu-1",
                    payload=HardwareReplace.model_validate(without_slug(hardware(name="slow"))),
                    if_match=IfMatch.parse('"1"'),
                )
        with factory() as check:
            stored = get_hardware(check, slug="lab-gpu-1")
            assert (stored.name, stored.version) == ("fast", 2)
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("", None),
        ("*", IfMatch(any_version=True, tags=frozenset())),
        ('"3"', IfMatch(any_version=False, tags=frozenset({'"3"'}))),
        ('"3", "4"', IfMatch(any_version=False, tags=frozenset({'"3"', '"4"'}))),
        ('W/"3"', IfMatch(any_version=False, tags=frozenset())),
    ],
)
def test_if_match_parsing(header: str | None, expected: IfMatch | None) -> None:
    assert IfMatch.parse(header) == expected
