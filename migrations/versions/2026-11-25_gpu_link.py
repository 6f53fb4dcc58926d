"""hardware: the GPU-to-GPU link of a node (NVLink), for tensor parallelism

Tensor parallelism all-reduces activations between the GPUs of a node; their direct link
(NVLink) is much faster than the host link. Rows without it (every row stored before this
revision, and GPUs without NVLink) reach their peers over the host link. Downgrading drops the
two columns (the links are lost; after upgrading again ``capplan-server catalog-sync`` restores
catalog rows' links). Expand-only: code of 0004 reads and writes this schema.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 00:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.add_column(sa.Column("gpu_link_type", sa.String(length=200), nullable=True))
        batch.add_column(
            sa.Column("gpu_link_bandwidth_bytes_per_s", sa.BigInteger(), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.drop_column("gpu_link_bandwidth_bytes_per_s")
        batch.drop_column("gpu_link_type")
