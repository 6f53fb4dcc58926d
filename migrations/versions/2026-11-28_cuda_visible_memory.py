"""hardware: the memory a GPU shows to CUDA, beside the memory it is sold with

vLLM sizes its KV pool as gpu_memory_utilization x the memory the GPU shows to torch
(`torch.cuda.mem_get_info()[1]`, logged as total_memory): an H100 80GB shows 79.19 GiB, not
80 GiB. The catalog now says which figure is which: `memory_bytes` stays the sold capacity,
`cuda_visible_memory_bytes` (with its source) the measured figure. Expand-only: two nullable
columns; rows stored before this revision have none (NULL: engine answers use memory_bytes and
say so, until `capplan-server catalog-sync` or a PUT fills them in). Downgrading drops the
columns (the previous release never reads them).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.add_column(sa.Column("cuda_visible_memory_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(
            sa.Column("cuda_visible_memory_source", sa.String(length=500), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.drop_column("cuda_visible_memory_source")
        batch.drop_column("cuda_visible_memory_bytes")
