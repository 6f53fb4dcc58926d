"""workload: a stored workload may target one MIG slice (`hardware: "slug/profile"`)

The memory estimate, the MIG fit, recommendations and the CLI take a GPU as `slug` or
`slug/profile`; a stored workload now does too. Its slice is kept as written (`slug/profile`)
in a new nullable column next to the hardware foreign key, which still names the whole device
(so "hardware in use" and the admission decisions are unchanged). Expand-only: the previous
release neither reads nor writes the column; a workload it rewrites with another hardware
slug no longer matches its slice, which is then ignored. Rows stored before this revision have
none (NULL: the whole device, as before). Downgrading drops the column: those workloads
target their whole GPU again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 19:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workload") as batch:
        batch.add_column(sa.Column("hardware_slice", sa.String(length=100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workload") as batch:
        batch.drop_column("hardware_slice")
