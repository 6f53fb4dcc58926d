"""hardware and MIG profiles: streaming multiprocessor counts, for tile and wave quantization

The roofline prices a GEMM's compute time at its wave efficiency on the device's SMs (tiles /
(ceil(tiles / SMs) x SMs)). `hardware.sm_count` is the whole GPU's count; `mig_profile.sm_count`
is one instance's count from NVIDIA's profile table (not proportional to the compute slices:
14 on an A100 1g slice, 98 on its 7g). Rows stored before this revision have no counts (NULL):
their GEMMs are priced without quantization, and their MIG slices get the proportional share
of the GPU's count. Downgrading drops both columns (the counts are lost; after upgrading again
``capplan-server catalog-sync`` restores catalog rows' counts). Expand-only: code of 0005 reads
and writes this schema.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.add_column(sa.Column("sm_count", sa.Integer(), nullable=True))
    with op.batch_alter_table("mig_profile") as batch:
        batch.add_column(sa.Column("sm_count", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("mig_profile") as batch:
        batch.drop_column("sm_count")
    with op.batch_alter_table("hardware") as batch:
        batch.drop_column("sm_count")
