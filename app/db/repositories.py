"""Every database query lives here."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import Hardware, ModelArchitecture, Workload


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
