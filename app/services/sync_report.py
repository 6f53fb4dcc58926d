"""What a catalog or zoo sync did."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SyncReport:
    """What a sync did, slug by slug."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped_user_owned: list[str] = field(default_factory=list)
    not_in_catalog: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether the sync wrote anything."""
        return bool(self.created or self.updated)

    def summary(self) -> str:
        """One line for logs and the CLI."""
        return (
            f"created {len(self.created)}, updated {len(self.updated)}, "
            f"unchanged {len(self.unchanged)}, skipped (user-owned slug) "
            f"{len(self.skipped_user_owned)}, stale catalog rows kept {len(self.not_in_catalog)}"
        )
