"""Every database query lives here: one repository per aggregate (hardware profiles, model
architectures, workloads, admission decisions) and the planning-data digest. Services call
these; ``tests/services/test_one_home.py`` fails when a service builds a query itself."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, func, literal, or_, select, true, union_all
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.db.models import AdmissionDecision, Hardware, ModelArchitecture, Workload

Digest = tuple[tuple[Any, ...], ...]


class HardwareRepository:
    """Queries over hardware profiles."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, slug: str) -> Hardware | None:
        """The profile with ``slug``, or None."""
        return self.session.scalars(select(Hardware).where(Hardware.slug == slug)).one_or_none()

    def list(
        self,
        *,
        kind: str | None,
        vendor: str | None,
        family: str | None,
        source: str | None,
        mig_capable: bool | None,
        limit: int,
        offset: int,
    ) -> tuple[Sequence[Hardware], int]:
        """A page of profiles ordered by slug, and the number matching."""
        query = select(Hardware)
        if kind is not None:
            query = query.where(Hardware.kind == kind)
        if vendor is not None:
            query = query.where(func.lower(Hardware.vendor) == vendor.lower())
        if family is not None:
            query = query.where(Hardware.family == family)
        if source is not None:
            query = query.where(Hardware.source == source)
        if mig_capable is not None:
            has_mig = Hardware.mig_total_compute_slices.is_not(None)
            query = query.where(has_mig if mig_capable else ~has_mig)
        total = self.session.scalar(select(func.count()).select_from(query.subquery())) or 0
        items = self.session.scalars(query.order_by(Hardware.slug).limit(limit).offset(offset))
        return items.all(), total

    def all_by_slug(self) -> dict[str, Hardware]:
        """Every profile keyed by slug (for catalog sync)."""
        return {hw.slug: hw for hw in self.session.scalars(select(Hardware))}

    def all_by_id(self) -> Sequence[Hardware]:
        """Every profile in id order."""
        return self.session.scalars(select(Hardware).order_by(Hardware.id)).all()

    def by_ids(self, ids: Iterable[int]) -> dict[int, Hardware]:
        """The profiles with these ids, keyed by id (missing ids are left out)."""
        query = select(Hardware).where(Hardware.id.in_(set(ids)))
        return {hw.id: hw for hw in self.session.scalars(query)}

    def gpus_by_memory(self) -> builtins.list[Hardware]:
        """Every GPU profile, smallest memory first (then by slug)."""
        query = (
            select(Hardware)
            .where(Hardware.kind == "gpu")
            .order_by(Hardware.memory_bytes, Hardware.slug)
        )
        return list(self.session.scalars(query))

    def mig_capable_slugs(self) -> builtins.list[str]:
        """The slugs of the MIG-capable profiles, sorted."""
        query = select(Hardware.slug).where(Hardware.mig_total_compute_slices.is_not(None))
        return sorted(self.session.scalars(query))

    def is_referenced(self, hardware: Hardware) -> bool:
        """Whether a workload points at this profile."""
        query = select(func.count()).where(Workload.hardware_id == hardware.id)
        return bool(self.session.scalar(query))


class ModelRepository:
    """Queries over model architectures."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, slug: str) -> ModelArchitecture | None:
        """The architecture with ``slug``, or None."""
        query = select(ModelArchitecture).where(ModelArchitecture.slug == slug)
        return self.session.scalars(query).one_or_none()

    def list(
        self,
        *,
        family: str | None,
        provenance: str | None,
        limit: int,
        offset: int,
    ) -> tuple[Sequence[ModelArchitecture], int]:
        """A page of architectures ordered by slug, and the number matching."""
        query = select(ModelArchitecture)
        if family is not None:
            query = query.where(ModelArchitecture.family == family)
        if provenance is not None:
            query = query.where(ModelArchitecture.provenance == provenance)
        total = self.session.scalar(select(func.count()).select_from(query.subquery())) or 0
        items = self.session.scalars(
            query.order_by(ModelArchitecture.slug).limit(limit).offset(offset)
        )
        return items.all(), total

    def is_referenced(self, model: ModelArchitecture) -> bool:
        """Whether a workload points at this architecture."""
        query = select(func.count()).where(Workload.model_id == model.id)
        return bool(self.session.scalar(query))

    def all_by_slug(self) -> dict[str, ModelArchitecture]:
        """Every architecture keyed by slug (for the zoo sync)."""
        return {row.slug: row for row in self.session.scalars(select(ModelArchitecture))}


class WorkloadRepository:
    """Queries over stored workloads."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, slug: str) -> Workload | None:
        """The workload with ``slug``, or None."""
        return self.session.scalars(select(Workload).where(Workload.slug == slug)).one_or_none()

    def exists(self, slug: str) -> bool:
        """Whether a workload with ``slug`` is stored."""
        query = select(Workload.id).where(Workload.slug == slug)
        return self.session.scalars(query).first() is not None

    def list(
        self,
        *,
        model_id: int | None,
        mode: str | None,
        limit: int,
        offset: int,
    ) -> tuple[Sequence[Workload], int]:
        """A page of workloads ordered by slug, and the number matching."""
        query = select(Workload)
        if model_id is not None:
            query = query.where(Workload.model_id == model_id)
        if mode is not None:
            query = query.where(Workload.mode == mode)
        total = self.session.scalar(select(func.count()).select_from(query.subquery())) or 0
        items = self.session.scalars(query.order_by(Workload.slug).limit(limit).offset(offset))
        return items.all(), total

    def all_by_id(self) -> Sequence[Workload]:
        """Every workload in id order."""
        return self.session.scalars(select(Workload).order_by(Workload.id)).all()

    def by_ids(self, ids: Iterable[int]) -> dict[int, Workload]:
        """The workloads with these ids, keyed by id (missing ids are left out)."""
        query = select(Workload).where(Workload.id.in_(set(ids)))
        return {row.id: row for row in self.session.scalars(query)}

    def of_model(self, model_id: int) -> Sequence[Workload]:
        """The workloads that use a model."""
        return self.session.scalars(select(Workload).where(Workload.model_id == model_id)).all()


@dataclass(frozen=True, slots=True)
class DecisionLookup:
    """A stored workload and a hardware profile by slug, with their stored decision (None:
    none computed by ``evaluator``) and whether it was computed from the rows as they are."""

    workload_id: int
    hardware_id: int
    decision: AdmissionDecision | None
    fresh: bool


class DecisionRepository:
    """Queries over stored admission decisions."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def lookup(self, workload: str, hardware: str, evaluator: str) -> DecisionLookup | None:
        """One query: the decision of ``workload`` on ``hardware`` (slugs) by ``evaluator``;
        None when the workload or the hardware profile does not exist."""
        query = (
            select(
                Workload.id,
                Workload.version,
                ModelArchitecture.version,
                Hardware.id,
                Hardware.version,
                AdmissionDecision,
            )
            .select_from(Workload)
            .join(ModelArchitecture, ModelArchitecture.id == Workload.model_id)
            .join(Hardware, Hardware.slug == hardware)
            .outerjoin(
                AdmissionDecision,
                and_(
                    AdmissionDecision.workload_id == Workload.id,
                    AdmissionDecision.hardware_id == Hardware.id,
                    AdmissionDecision.evaluator == evaluator,
                ),
            )
            .where(Workload.slug == workload)
        )
        row = self.session.execute(query).one_or_none()
        if row is None:
            return None
        workload_id, workload_version, model_version, hardware_id, hardware_version, found = row
        fresh = found is not None and (
            found.workload_version,
            found.model_version,
            found.hardware_version,
        ) == (workload_version, model_version, hardware_version)
        return DecisionLookup(workload_id, hardware_id, found, fresh)

    def fresh_on(self, hardware: str, evaluator: str) -> list[tuple[str, AdmissionDecision]]:
        """Every workload's fresh decision on ``hardware`` (slug) by ``evaluator``, with the
        workload's slug: one query (the webhook loads a GPU's table at once)."""
        decision = AdmissionDecision
        query = (
            select(Workload.slug, decision)
            .join(Workload, Workload.id == decision.workload_id)
            .join(ModelArchitecture, ModelArchitecture.id == Workload.model_id)
            .join(Hardware, Hardware.id == decision.hardware_id)
            .where(
                Hardware.slug == hardware,
                decision.evaluator == evaluator,
                decision.workload_version == Workload.version,
                decision.model_version == ModelArchitecture.version,
                decision.hardware_version == Hardware.version,
            )
        )
        return [(slug, found) for slug, found in self.session.execute(query).all()]

    def upsert(self, rows: Sequence[dict[str, Any]]) -> None:
        """Insert or replace decisions (one per workload, hardware and evaluator): a replica
        storing the same pair at the same time is not an error, the later write wins."""
        if not rows:
            return
        dialect = self.session.get_bind().dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        statement = insert(AdmissionDecision)
        keys = ("workload_id", "hardware_id", "evaluator")
        statement = statement.on_conflict_do_update(
            index_elements=list(keys),
            set_={name: statement.excluded[name] for name in rows[0] if name not in keys},
        )
        self.session.execute(statement, list(rows))

    def stale_pairs(self, evaluator: str, *, limit: int) -> list[tuple[int, int]]:
        """Up to ``limit`` (workload id, hardware id) pairs whose decision by ``evaluator`` is
        missing or was computed from older rows (another release's rows do not count)."""
        decision = AdmissionDecision
        query = (
            select(Workload.id, Hardware.id)
            .select_from(Workload)
            .join(ModelArchitecture, ModelArchitecture.id == Workload.model_id)
            .join(Hardware, true())  # every pair
            .outerjoin(
                decision,
                and_(
                    decision.workload_id == Workload.id,
                    decision.hardware_id == Hardware.id,
                    decision.evaluator == evaluator,
                ),
            )
            .where(
                or_(
                    decision.id.is_(None),
                    decision.workload_version != Workload.version,
                    decision.model_version != ModelArchitecture.version,
                    decision.hardware_version != Hardware.version,
                )
            )
            .order_by(Workload.id, Hardware.id)
            .limit(limit)
        )
        return [(w, h) for w, h in self.session.execute(query).all()]

    def prune(self, evaluator: str, *, computed_before: datetime) -> int:
        """Delete other evaluators' (releases') decisions computed before ``computed_before``;
        returns how many."""
        query = delete(AdmissionDecision).where(
            AdmissionDecision.evaluator != evaluator,
            AdmissionDecision.computed_at < computed_before,
        )
        result = self.session.execute(query)
        return int(getattr(result, "rowcount", 0) or 0)


def planning_data_digest(session: Session) -> Digest:
    """One query: (table, rows, sum of ids, sum of versions, latest update) per table of the
    planning data (hardware, models, workloads)."""
    parts = [
        select(
            literal(index),
            func.count(),
            func.coalesce(func.sum(ident), 0),
            func.coalesce(func.sum(version), 0),
            func.max(updated_at),
        )
        for index, (ident, version, updated_at) in enumerate(
            (
                (Hardware.id, Hardware.version, Hardware.updated_at),
                (ModelArchitecture.id, ModelArchitecture.version, ModelArchitecture.updated_at),
                (Workload.id, Workload.version, Workload.updated_at),
            )
        )
    ]
    rows = session.execute(union_all(*parts)).all()
    return tuple(sorted(tuple(row) for row in rows))
