"""Seed the built-in model zoo into the database idempotently (upsert by slug)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy.orm import Session

from app.db.models import ModelArchitecture, utcnow
from app.db.repositories import ModelRepository
from app.domain.graph.ops import TensorKind
from app.domain.zoo import ZOO, ZooModel
from app.schemas.models import (
    Provenance,
)
from app.services.sync_report import SyncReport


def zoo_fields(model: ZooModel) -> dict[str, Any]:
    """The stored form of a zoo model (what the API returns for it)."""
    return {
        "name": model.name,
        "family": model.family,
        "description": model.description,
        "inputs": [
            {
                "name": decl.name,
                "shape": list(decl.shape),
                "dtype": "int64" if decl.kind is TensorKind.INDEX else "float",
            }
            for decl in model.inputs
        ],
        "layers": json.loads(json.dumps(list(model.layers))),
        "default_bindings": dict(model.default_bindings),
    }


def _digest(fields: dict[str, Any]) -> str:
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def sync_zoo(session: Session, models: dict[str, ZooModel] | None = None) -> SyncReport:
    """Upsert built-in models; user-owned slugs are never touched; a rerun writes nothing; a
    row whose digest matches but whose fields do not (emptied by a downgrade) is rewritten and
    reported as repaired."""
    report = SyncReport()
    catalog = dict(ZOO) if models is None else models
    existing = ModelRepository(session).all_by_slug()
    for slug, model in catalog.items():
        fields = zoo_fields(model)
        digest = _digest(fields)
        row = existing.get(slug)
        if row is None:
            row = ModelArchitecture(
                slug=slug, provenance=Provenance.BUILTIN.value, created_at=utcnow()
            )
            session.add(row)
            report.created.append(slug)
        elif row.provenance != Provenance.BUILTIN.value:
            report.skipped_user_owned.append(slug)
            continue
        elif row.catalog_digest == digest and not (
            lost := [key for key, value in fields.items() if getattr(row, key) != value]
        ):
            report.unchanged.append(slug)
            continue
        elif row.catalog_digest == digest:
            # Same model, different row (a downgrade emptied a column the digest outlived).
            report.repaired.append(f"{slug} ({', '.join(lost)})")
        else:
            report.updated.append(slug)
        for key, value in fields.items():
            setattr(row, key, value)
        row.catalog_digest = digest
        row.updated_at = utcnow()
    report.not_in_catalog = sorted(
        slug
        for slug, row in existing.items()
        if row.provenance == Provenance.BUILTIN.value and slug not in catalog
    )
    session.commit()
    return report
