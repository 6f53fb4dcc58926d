"""admission_decision: a workload served by an engine keeps the engine's verdict per resource

A stored workload may name a serving engine (`options.engine`, e.g. vLLM); its requirement
then differs per resource (the engine claims a share of the memory each GPU or MIG slice shows
and its defaults follow that memory), so its decision stores, per Kubernetes resource, the
engine's requirement, the memory shown, KV tokens, concurrency and reason, in a new nullable
JSON column. Expand-only: rows without an engine keep NULL; the previous release neither reads
nor writes it (and reads only the rows it computed itself: `evaluator`). Downgrading drops it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("admission_decision") as batch:
        batch.add_column(sa.Column("engine", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("admission_decision") as batch:
        batch.drop_column("engine")
