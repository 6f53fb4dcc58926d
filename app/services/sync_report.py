"""What a catalog or zoo sync did."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SyncReport:
    """What a sync did, slug by slug."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    # Rows whose digest matched but whose fields did not ("slug (field, ...)"): rewritten.
    repaired: list[str] = field(default_factory=list)
    # User-owned rows missing what a downgrade drops ("slug (what)"): never written by a sync.
    not_repaired: list[str] = field(default_factory=list)
    skipped_user_owned: list[str] = field(default_factory=list)
    not_in_catalog: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether the sync wrote anything."""
        return bool(self.created or self.updated or self.repaired)

    def summary(self) -> str:
        """One line for logs and the CLI."""
        return (
            f"created {len(self.created)}, updated {len(self.updated)}, "
            f"unchanged {len(self.unchanged)}, repaired {len(self.repaired)}, "
            f"skipped (user-owned slug) {len(self.skipped_user_owned)}, "
            f"stale catalog rows kept {len(self.not_in_catalog)}"
        )
