"""Optimistic concurrency: ETags derived from row versions and If-Match evaluation."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from app.services.errors import PreconditionFailed, PreconditionRequired


def etag_for(version: int) -> str:
    """Strong entity tag of a resource version."""
    return f'"{version}"'


@dataclass(frozen=True, slots=True)
class IfMatch:
    """A parsed If-Match header: ``any_version`` for ``*``, else the listed strong tags."""

    any_version: bool
    tags: frozenset[str]

    @classmethod
    def parse(cls, header: str | None) -> IfMatch | None:
        """Parse the header value; None when the header is absent or blank."""
        if header is None or not header.strip():
            return None
        if header.strip() == "*":
            return cls(any_version=True, tags=frozenset())
        # Weak tags never match under If-Match (RFC 9110 13.1.1: strong comparison).
        tags = frozenset(
            part.strip() for part in header.split(",") if not part.strip().startswith("W/")
        )
        return cls(any_version=False, tags=tags)


def require_match(if_match: IfMatch | None, *, current_version: int, what: str) -> None:
    """Raise unless ``if_match`` names the current version."""
    current = etag_for(current_version)
    if if_match is None:
        raise PreconditionRequired(
            f"{what} can only be changed with an If-Match header; GET it and send its ETag "
            f"(currently {current}) to prove you are editing the latest version"
        )
    if not if_match.any_version and current not in if_match.tags:
        sent = ", ".join(sorted(if_match.tags)) or "(no strong tag)"
        raise PreconditionFailed(
            f"{what} changed since you read it: If-Match {sent} does not match the current "
            f"ETag {current}; GET it again and re-apply your change"
        )


def commit_versioned(session: Session, *, what: str) -> None:
    """Commit; a concurrent writer detected by the version column becomes a 412."""
    try:
        session.commit()
    except StaleDataError as exc:  # another writer committed between our read and write
        session.rollback()
        raise PreconditionFailed(f"{what} was changed by another client; GET it again") from exc
