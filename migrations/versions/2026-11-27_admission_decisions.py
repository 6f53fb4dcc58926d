"""admission_decision: stored workloads' admission inputs per hardware profile

Reviews of pods naming a stored workload read the decision computed when the workload, its
model or the hardware was written, instead of estimating in the review's path. Expand-only: a
new table, nothing else changes, so the previous release keeps serving on this schema (it never
reads the table). Rows stored before this revision do not exist: the first review of each
workload and GPU takes the bounded path and the service's refresher computes the missing rows.
Downgrading drops the table (the decisions are recomputed after the next upgrade).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "admission_decision",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("hardware_id", sa.Integer(), nullable=False),
        sa.Column("evaluator", sa.String(length=32), nullable=False),
        sa.Column("workload_version", sa.Integer(), nullable=False),
        sa.Column("model_version", sa.Integer(), nullable=False),
        sa.Column("hardware_version", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("summary", sa.String(length=300), nullable=False),
        sa.Column("required_bytes", sa.BigInteger(), nullable=True),
        sa.Column("smallest_fitting_resource", sa.String(length=64), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "outcome IN ('estimated', 'too_expensive', 'invalid')",
            name=op.f("ck_admission_decision_outcome_valid"),
        ),
        sa.ForeignKeyConstraint(
            ["hardware_id"],
            ["hardware.id"],
            name=op.f("fk_admission_decision_hardware_id_hardware"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["workload.id"],
            name=op.f("fk_admission_decision_workload_id_workload"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admission_decision")),
        sa.UniqueConstraint(
            "workload_id",
            "hardware_id",
            "evaluator",
            name=op.f("uq_admission_decision_workload_id"),
        ),
    )
    op.create_index(
        op.f("ix_admission_decision_hardware_id"), "admission_decision", ["hardware_id"]
    )
    op.create_index(
        op.f("ix_admission_decision_workload_id"), "admission_decision", ["workload_id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_admission_decision_workload_id"), table_name="admission_decision")
    op.drop_index(op.f("ix_admission_decision_hardware_id"), table_name="admission_decision")
    op.drop_table("admission_decision")
