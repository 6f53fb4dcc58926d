"""hardware: the CUDA compute capability of a GPU, for hardware-aware defaults

The precision and attention defaults follow what the GPU supports: below compute capability 8.0
(Volta, Turing) there is no bf16 and no flash attention (PyTorch SDPA picks mem_efficient), so
the default precision is fp16 / amp_fp16 there. Expand-only: one nullable column. Rows stored
before this revision have none (NULL: the defaults assume an Ampere-or-newer GPU, as before,
until `capplan-server catalog-sync` or a PUT fills it in). Downgrading drops the column (the
figures are lost; the previous release never reads it).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.add_column(sa.Column("compute_capability", sa.String(length=8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.drop_column("compute_capability")
