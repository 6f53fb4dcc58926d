"""ORM tables: hardware profiles (with MIG profiles), model architectures, workloads."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.db.base import Base


def utcnow() -> datetime:
    """Current time, timezone-aware UTC."""
    return datetime.now(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime; use timezone-aware UTC")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Timestamped:
    """Creation and update times."""

    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False, default=utcnow)


class Hardware(Timestamped, Base):
    """A device profile."""

    __tablename__ = "hardware"
    __table_args__ = (
        CheckConstraint("memory_bytes > 0", name="memory_bytes_positive"),
        CheckConstraint("memory_bandwidth_bytes_per_s > 0", name="bandwidth_positive"),
        CheckConstraint("source IN ('catalog', 'user')", name="source_valid"),
        CheckConstraint("kind IN ('gpu', 'cpu', 'tpu', 'edge')", name="kind_valid"),
        CheckConstraint(
            "price_kind IS NULL OR price_kind IN ('on_demand', 'reserved', 'spot')",
            name="price_kind_valid",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Optimistic concurrency: SQLAlchemy bumps it and checks it in every UPDATE/DELETE.
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    __mapper_args__ = {"version_id_col": version}
    slug: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    vendor: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    kind: Mapped[str] = mapped_column(String(8), nullable=False, index=True)
    family: Mapped[str | None] = mapped_column(String(64), index=True)
    architecture: Mapped[str | None] = mapped_column(String(100))
    launch_year: Mapped[int | None] = mapped_column(Integer)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    memory_type: Mapped[str | None] = mapped_column(String(64))
    memory_bandwidth_bytes_per_s: Mapped[int] = mapped_column(BigInteger, nullable=False)
    peak_flops_per_s: Mapped[dict[str, float]] = mapped_column(JSON, nullable=False)
    peak_sparse_flops_per_s: Mapped[dict[str, float]] = mapped_column(JSON, nullable=False)
    host_link_type: Mapped[str] = mapped_column(String(200), nullable=False)
    host_link_pcie_generation: Mapped[int | None] = mapped_column(Integer)
    host_link_pcie_lanes: Mapped[int | None] = mapped_column(Integer)
    host_link_bandwidth_bytes_per_s: Mapped[int | None] = mapped_column(BigInteger)
    # GPU-to-GPU link (NVLink); NULL: the GPUs of a node talk over the host link
    gpu_link_type: Mapped[str | None] = mapped_column(String(200))
    gpu_link_bandwidth_bytes_per_s: Mapped[int | None] = mapped_column(BigInteger)
    # GPU/SoC streaming multiprocessors; NULL: unknown (no tile and wave quantization)
    sm_count: Mapped[int | None] = mapped_column(Integer)
    # CUDA compute capability "major.minor" (NULL: not a CUDA device, or unknown)
    compute_capability: Mapped[str | None] = mapped_column(String(8))
    # What the GPU shows to CUDA (torch.cuda.mem_get_info's total) and where the figure comes
    # from; NULL: not measured (the memory_bytes figure is used, and answers say so)
    cuda_visible_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    cuda_visible_memory_source: Mapped[str | None] = mapped_column(String(500))
    tdp_watts: Mapped[float | None] = mapped_column(Float)
    price_usd_per_hour: Mapped[float | None] = mapped_column(Float)
    # NULL with a price: stored before prices carried their kind (never ranked by cost)
    price_kind: Mapped[str | None] = mapped_column(String(16))
    price_region: Mapped[str | None] = mapped_column(String(64))
    price_date: Mapped[date | None] = mapped_column(Date)
    price_source: Mapped[str | None] = mapped_column(String(500))
    cpu: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    mig_total_compute_slices: Mapped[int | None] = mapped_column(Integer)
    mig_total_memory_slices: Mapped[int | None] = mapped_column(Integer)
    mig_max_gpu_instances: Mapped[int | None] = mapped_column(Integer)
    framework_overhead: Mapped[dict[str, int] | None] = mapped_column(JSON)
    unconfirmed: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    sources: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    notes: Mapped[str | None] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    catalog_digest: Mapped[str | None] = mapped_column(String(64))

    mig_profiles: Mapped[list[MigProfile]] = relationship(
        back_populates="hardware",
        cascade="all, delete-orphan",
        order_by="MigProfile.position",
        lazy="selectin",
    )


class MigProfile(Base):
    """One MIG GPU-instance profile of a hardware profile (child row)."""

    __tablename__ = "mig_profile"
    __table_args__ = (
        UniqueConstraint("hardware_id", "name"),
        CheckConstraint("memory_mib > 0", name="memory_mib_positive"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hardware_id: Mapped[int] = mapped_column(
        ForeignKey("hardware.id", ondelete="CASCADE"), nullable=False, index=True
    )
    position: Mapped[int] = mapped_column(Integer, nullable=False)
    name: Mapped[str] = mapped_column(String(32), nullable=False)
    memory_mib: Mapped[int] = mapped_column(Integer, nullable=False)
    compute_slices: Mapped[int] = mapped_column(Integer, nullable=False)
    # SMs of one instance from NVIDIA's profile table; NULL: not published (proportional share)
    sm_count: Mapped[int | None] = mapped_column(Integer)
    memory_slices: Mapped[int] = mapped_column(Integer, nullable=False)
    max_instances: Mapped[int] = mapped_column(Integer, nullable=False)
    placements: Mapped[list[int]] = mapped_column(JSON, nullable=False)
    unconfirmed: Mapped[list[str]] = mapped_column(JSON, nullable=False)

    hardware: Mapped[Hardware] = relationship(back_populates="mig_profiles")


class ModelArchitecture(Timestamped, Base):
    """A stored model architecture: a layer graph with its input spec."""

    __tablename__ = "model_architecture"
    __table_args__ = (
        CheckConstraint(
            "provenance IN ('builtin', 'user', 'onnx', 'hf_config')", name="provenance_valid"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Optimistic concurrency: SQLAlchemy bumps it and checks it in every UPDATE/DELETE.
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    __mapper_args__ = {"version_id_col": version}
    slug: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    family: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    description: Mapped[str | None] = mapped_column(Text)
    provenance: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    inputs: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)
    layers: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)
    default_bindings: Mapped[dict[str, int]] = mapped_column(JSON, nullable=False)
    catalog_digest: Mapped[str | None] = mapped_column(String(64))
    # A pre-quantized checkpoint's quantization_config (its config.json object, as given) and
    # the config's torch_dtype (revision 0012); NULL: unquantized / not stated
    quantization_config: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    torch_dtype: Mapped[str | None] = mapped_column(String(16))


class Workload(Timestamped, Base):
    """A named, saved question: a model plus how it is run."""

    __tablename__ = "workload"
    __table_args__ = (
        CheckConstraint("batch_size > 0", name="batch_size_positive"),
        CheckConstraint("mode IN ('training', 'inference')", name="mode_valid"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Optimistic concurrency: SQLAlchemy bumps it and checks it in every UPDATE/DELETE.
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    __mapper_args__ = {"version_id_col": version}
    slug: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    description: Mapped[str | None] = mapped_column(Text)
    model_id: Mapped[int] = mapped_column(
        ForeignKey("model_architecture.id", ondelete="RESTRICT"), nullable=False, index=True
    )
    hardware_id: Mapped[int | None] = mapped_column(
        ForeignKey("hardware.id", ondelete="RESTRICT"), index=True
    )
    # One MIG slice of that hardware, as written: ``slug/profile`` (revision 0009). It counts
    # only while its slug is the hardware's: the previous release rewrites ``hardware_id`` but
    # never this column, so a slice it did not write is ignored (app.services.convert).
    hardware_slice: Mapped[str | None] = mapped_column(String(100))
    mode: Mapped[str] = mapped_column(String(16), nullable=False)
    batch_size: Mapped[int] = mapped_column(Integer, nullable=False)
    sequence_length: Mapped[int | None] = mapped_column(Integer)
    image_size: Mapped[int | None] = mapped_column(Integer)
    precision: Mapped[str] = mapped_column(String(32), nullable=False)
    optimizer: Mapped[str | None] = mapped_column(String(32))
    options: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)

    model: Mapped[ModelArchitecture] = relationship(lazy="joined")
    hardware: Mapped[Hardware | None] = relationship(lazy="joined")


class AdmissionDecision(Base):
    """A stored workload's admission inputs on one hardware profile, computed when the
    workload, its model or the hardware was written (app.services.decision_store).

    One row per workload, hardware profile and ``evaluator`` (a fingerprint of the code that
    computed it: during a rolling upgrade each release keeps its own rows). It is fresh while
    the three versions it was computed from are the rows' current versions; a review reads it
    and applies the policy without estimating anything."""

    __tablename__ = "admission_decision"
    __table_args__ = (
        UniqueConstraint("workload_id", "hardware_id", "evaluator"),
        CheckConstraint(
            "outcome IN ('estimated', 'too_expensive', 'invalid')", name="outcome_valid"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(
        ForeignKey("workload.id", ondelete="CASCADE"), nullable=False, index=True
    )
    hardware_id: Mapped[int] = mapped_column(
        ForeignKey("hardware.id", ondelete="CASCADE"), nullable=False, index=True
    )
    evaluator: Mapped[str] = mapped_column(String(32), nullable=False)
    workload_version: Mapped[int] = mapped_column(Integer, nullable=False)
    model_version: Mapped[int] = mapped_column(Integer, nullable=False)
    hardware_version: Mapped[int] = mapped_column(Integer, nullable=False)
    # estimated: required_bytes and resources hold the verdict's inputs; too_expensive: the
    # estimate exceeded the work budget; invalid: the workload cannot be estimated on this
    # hardware (detail says why). The review applies the failure policy to the last two.
    outcome: Mapped[str] = mapped_column(String(16), nullable=False)
    detail: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[str] = mapped_column(String(300), nullable=False)
    required_bytes: Mapped[int | None] = mapped_column(BigInteger)
    smallest_fitting_resource: Mapped[str | None] = mapped_column(String(64))
    # Kubernetes resource name -> usable bytes (nvidia.com/gpu and each MIG profile)
    resources: Mapped[dict[str, int]] = mapped_column(JSON, nullable=False)
    # a workload served by an engine: {"name", "gpus", "resources": {resource: {required_bytes,
    # usable_bytes, kv_tokens, max_concurrency, max_model_len, reason}}} (NULL: no engine)
    engine: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    computed_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False, default=utcnow)
