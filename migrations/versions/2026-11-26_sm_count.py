"""hardware: streaming multiprocessor count, for tile and wave quantization of GEMMs

The roofline prices a GEMM's compute time at its wave efficiency on the device's SMs (tiles /
(ceil(tiles / SMs) x SMs)). Rows stored before this revision have no count (NULL): their GEMMs
are priced without quantization, as before. Downgrading drops the column (the counts are lost).

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


def downgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.drop_column("sm_count")
