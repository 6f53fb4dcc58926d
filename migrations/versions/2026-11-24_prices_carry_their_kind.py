"""hardware: a price carries its kind (on-demand, reserved, spot), region, date and source

Prices of different kinds are never ranked together, so a price must say which kind it is.
Rows priced before this revision keep their price with a NULL kind: the kind is unknown, and a
recommendation does not rank them by cost until the price is restated with its kind (catalog
rows get theirs on the next ``capplan-server catalog-sync``; their content digest changes).
Downgrading drops the four columns (the kind, region, date and source of every price are lost;
the prices stay). Upgrading again adds them back empty; ``capplan-server catalog-sync`` then
restores catalog rows from their entries and lists user-owned rows it cannot restore. Expand-only:
code of 0003 reads and writes this schema.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 23:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.add_column(sa.Column("price_kind", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("price_region", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("price_date", sa.Date(), nullable=True))
        batch.add_column(sa.Column("price_source", sa.String(length=500), nullable=True))
        batch.create_check_constraint(
            op.f("ck_hardware_price_kind_valid"),
            "price_kind IS NULL OR price_kind IN ('on_demand', 'reserved', 'spot')",
        )


def downgrade() -> None:
    with op.batch_alter_table("hardware") as batch:
        batch.drop_constraint(op.f("ck_hardware_price_kind_valid"), type_="check")
        batch.drop_column("price_source")
        batch.drop_column("price_date")
        batch.drop_column("price_region")
        batch.drop_column("price_kind")
