"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 06:25:49.532159
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "hardware",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=64), nullable=False),
        sa.Column("vendor", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("family", sa.String(length=64), nullable=True),
        sa.Column("architecture", sa.String(length=100), nullable=True),
        sa.Column("launch_year", sa.Integer(), nullable=True),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("memory_type", sa.String(length=64), nullable=True),
        sa.Column("memory_bandwidth_bytes_per_s", sa.BigInteger(), nullable=False),
        sa.Column("peak_flops_per_s", sa.JSON(), nullable=False),
        sa.Column("peak_sparse_flops_per_s", sa.JSON(), nullable=False),
        sa.Column("host_link_type", sa.String(length=200), nullable=False),
        sa.Column("host_link_pcie_generation", sa.Integer(), nullable=True),
        sa.Column("host_link_pcie_lanes", sa.Integer(), nullable=True),
        sa.Column("host_link_bandwidth_bytes_per_s", sa.BigInteger(), nullable=True),
        sa.Column("tdp_watts", sa.Float(), nullable=True),
        sa.Column("price_usd_per_hour", sa.Float(), nullable=True),
        sa.Column("cpu", sa.JSON(), nullable=True),
        sa.Column("mig_total_compute_slices", sa.Integer(), nullable=True),
        sa.Column("mig_total_memory_slices", sa.Integer(), nullable=True),
        sa.Column("mig_max_gpu_instances", sa.Integer(), nullable=True),
        sa.Column("framework_overhead", sa.JSON(), nullable=True),
        sa.Column("unconfirmed", sa.JSON(), nullable=False),
        sa.Column("sources", sa.JSON(), nullable=False),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("catalog_digest", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "kind IN ('gpu', 'cpu', 'tpu', 'edge')", name=op.f("ck_hardware_kind_valid")
        ),
        sa.CheckConstraint("source IN ('catalog', 'user')", name=op.f("ck_hardware_source_valid")),
        sa.CheckConstraint(
            "memory_bandwidth_bytes_per_s > 0", name=op.f("ck_hardware_bandwidth_positive")
        ),
        sa.CheckConstraint("memory_bytes > 0", name=op.f("ck_hardware_memory_bytes_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hardware")),
        sa.UniqueConstraint("slug", name=op.f("uq_hardware_slug")),
    )
    op.create_index(op.f("ix_hardware_family"), "hardware", ["family"], unique=False)
    op.create_index(op.f("ix_hardware_kind"), "hardware", ["kind"], unique=False)
    op.create_index(op.f("ix_hardware_source"), "hardware", ["source"], unique=False)
    op.create_index(op.f("ix_hardware_vendor"), "hardware", ["vendor"], unique=False)

    op.create_table(
        "model_architecture",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("family", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("provenance", sa.String(length=16), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("layers", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "provenance IN ('builtin', 'user', 'onnx', 'hf_config')",
            name=op.f("ck_model_architecture_provenance_valid"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_architecture")),
        sa.UniqueConstraint("slug", name=op.f("uq_model_architecture_slug")),
    )
    op.create_index(
        op.f("ix_model_architecture_family"), "model_architecture", ["family"], unique=False
    )
    op.create_index(
        op.f("ix_model_architecture_provenance"), "model_architecture", ["provenance"], unique=False
    )

    op.create_table(
        "mig_profile",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hardware_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("compute_slices", sa.Integer(), nullable=False),
        sa.Column("memory_slices", sa.Integer(), nullable=False),
        sa.Column("max_instances", sa.Integer(), nullable=False),
        sa.Column("placements", sa.JSON(), nullable=False),
        sa.Column("unconfirmed", sa.JSON(), nullable=False),
        sa.CheckConstraint("memory_mib > 0", name=op.f("ck_mig_profile_memory_mib_positive")),
        sa.ForeignKeyConstraint(
            ["hardware_id"],
            ["hardware.id"],
            name=op.f("fk_mig_profile_hardware_id_hardware"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mig_profile")),
        sa.UniqueConstraint("hardware_id", "name", name=op.f("uq_mig_profile_hardware_id")),
    )
    op.create_index(
        op.f("ix_mig_profile_hardware_id"), "mig_profile", ["hardware_id"], unique=False
    )

    op.create_table(
        "workload",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("hardware_id", sa.Integer(), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("sequence_length", sa.Integer(), nullable=True),
        sa.Column("image_size", sa.Integer(), nullable=True),
        sa.Column("precision", sa.String(length=32), nullable=False),
        sa.Column("optimizer", sa.String(length=32), nullable=True),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "mode IN ('training', 'inference')", name=op.f("ck_workload_mode_valid")
        ),
        sa.CheckConstraint("batch_size > 0", name=op.f("ck_workload_batch_size_positive")),
        sa.ForeignKeyConstraint(
            ["hardware_id"],
            ["hardware.id"],
            name=op.f("fk_workload_hardware_id_hardware"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["model_architecture.id"],
            name=op.f("fk_workload_model_id_model_architecture"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workload")),
        sa.UniqueConstraint("slug", name=op.f("uq_workload_slug")),
    )
    op.create_index(op.f("ix_workload_hardware_id"), "workload", ["hardware_id"], unique=False)
    op.create_index(op.f("ix_workload_model_id"), "workload", ["model_id"], unique=False)


def downgrade() -> None:
    # Dropping a table drops its indexes and constraints on SQLite and PostgreSQL alike.
    op.drop_table("workload")
    op.drop_table("mig_profile")
    op.drop_table("model_architecture")
    op.drop_table("hardware")
