"""Load the shipped hardware catalog and sync it into the database idempotently."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml
from pydantic import ValidationError
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from app.db.models import Hardware, MigProfile, utcnow
from app.db.repositories import HardwareRepository
from app.schemas.hardware import (
    CatalogEntry,
    CatalogFile,
    HardwareSource,
)
from app.services.convert import (
    apply_hardware_fields,
)
from app.services.sync_report import SyncReport


class CatalogError(Exception):
    """A catalog file is unreadable or invalid; the message names the file and the field."""


def load_catalog(directory: Path) -> list[CatalogEntry]:
    """Read and validate every ``*.yaml`` file; slugs must be unique across files."""
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise CatalogError(f"no *.yaml files in {directory}")
    entries: list[CatalogEntry] = []
    origin: dict[str, str] = {}
    for path in files:
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
            parsed = CatalogFile.model_validate(raw)
        except yaml.YAMLError as exc:
            raise CatalogError(f"{path.name}: not valid YAML: {exc}") from exc
        except ValidationError as exc:
            raise CatalogError(f"{path.name}: {_describe(exc)}") from exc
        if parsed.family != path.stem:
            raise CatalogError(f"{path.name}: family '{parsed.family}' must equal the file stem")
        for entry in parsed.devices:
            if entry.slug in origin:
                raise CatalogError(
                    f"{path.name}: slug '{entry.slug}' also defined in {origin[entry.slug]}"
                )
            if entry.family not in (None, parsed.family):
                raise CatalogError(
                    f"{path.name}: device '{entry.slug}' has family '{entry.family}', "
                    f"expected '{parsed.family}'"
                )
            origin[entry.slug] = path.name
            entries.append(entry.model_copy(update={"family": parsed.family}))
    return entries


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    return f"{location}: {first['msg']} ({exc.error_count()} error(s))"


def entry_digest(entry: CatalogEntry) -> str:
    """Content hash of a catalog entry: a sync touches a row only when it changes."""
    canonical = json.dumps(entry.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def sync_catalog(session: Session, entries: list[CatalogEntry]) -> SyncReport:
    """Upsert catalog entries by slug in one transaction.

    User-created rows are never touched, even when a catalog slug collides with one; catalog
    rows whose entry disappeared from the files are kept (workloads may refer to them) and
    reported. An entry whose content digest is unchanged is not written, so a second sync
    changes nothing (versions and timestamps stay put), unless its row no longer holds what
    the entry says: a row whose fields a downgrade dropped (and the re-upgrade added back
    empty: price kinds, SM counts, GPU links) is rewritten from its entry and reported as
    repaired. User-owned rows are never written; those with fields a downgrade empties are
    reported as not repaired.
    """
    report = SyncReport()
    existing = HardwareRepository(session).all_by_slug()
    for entry in entries:
        digest = entry_digest(entry)
        row = existing.get(entry.slug)
        if row is None:
            row = Hardware(
                slug=entry.slug,
                source=HardwareSource.CATALOG.value,
                catalog_digest=digest,
                created_at=utcnow(),
            )
            apply_hardware_fields(row, entry)
            session.add(row)
            report.created.append(entry.slug)
        elif row.source != HardwareSource.CATALOG.value:
            report.skipped_user_owned.append(entry.slug)
        elif row.catalog_digest == digest and not (lost := drifted_fields(row, entry)):
            report.unchanged.append(entry.slug)
        elif row.catalog_digest == digest:
            # Same entry, different row: a downgrade dropped columns and the upgrade added them
            # back empty (the digest column survived), or the row was edited in the database.
            apply_hardware_fields(row, entry)
            report.repaired.append(f"{entry.slug} ({', '.join(lost)})")
        else:
            apply_hardware_fields(row, entry)
            row.catalog_digest = digest
            report.updated.append(entry.slug)
    by_slug = {entry.slug: entry for entry in entries}
    for row in existing.values():
        if row.source != HardwareSource.CATALOG.value:
            missing = _user_row_gaps(row, by_slug.get(row.slug))
            if missing:
                report.not_repaired.append(f"{row.slug} ({'; '.join(missing)})")
    catalog_slugs = set(by_slug)
    report.not_in_catalog = sorted(
        slug
        for slug, row in existing.items()
        if row.source == HardwareSource.CATALOG.value and slug not in catalog_slugs
    )
    session.commit()
    return report


# Columns that say which row it is or how it was written, not what the catalog entry says.
_BOOKKEEPING = frozenset(
    {"id", "version", "slug", "source", "catalog_digest", "created_at", "updated_at"}
)
_PROFILE_BOOKKEEPING = frozenset({"id", "hardware_id"})


def drifted_fields(row: Hardware, entry: CatalogEntry) -> list[str]:
    """The fields of a stored catalog row that differ from what ``entry`` would write."""
    expected = Hardware()
    apply_hardware_fields(expected, entry)
    drifted = [
        attribute.key
        for attribute in sa_inspect(Hardware).column_attrs
        if attribute.key not in _BOOKKEEPING
        and getattr(row, attribute.key) != getattr(expected, attribute.key)
    ]
    stored = {profile.name: profile for profile in row.mig_profiles}
    wanted = {profile.name: profile for profile in expected.mig_profiles}
    if set(stored) != set(wanted):
        drifted.append("mig_profiles")
    else:
        keys = [
            attribute.key
            for attribute in sa_inspect(MigProfile).column_attrs
            if attribute.key not in _PROFILE_BOOKKEEPING
        ]
        for key in keys:
            differ = [n for n in stored if getattr(stored[n], key) != getattr(wanted[n], key)]
            if differ:
                drifted.append(f"mig_profiles.{key} ({len(differ)} of {len(stored)})")
    return drifted


def _user_row_gaps(row: Hardware, entry: CatalogEntry | None) -> list[str]:
    """What a user-owned row lacks that a downgrade empties and a sync must not restore."""
    gaps = []
    if row.price_usd_per_hour is not None and row.price_kind is None:
        gaps.append("price without a kind: not ranked by cost until restated with its kind")
    if entry is not None:
        expected = Hardware()
        apply_hardware_fields(expected, entry)
        empty = [
            key
            for key in ("sm_count", "gpu_link_type", "price_kind", "cuda_visible_memory_bytes")
            if getattr(row, key) is None and getattr(expected, key) is not None
        ]
        if empty:
            gaps.append(f"empty where the catalog entry has a value: {', '.join(empty)}")
    return gaps
