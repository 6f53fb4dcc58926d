"""model architectures: default symbol bindings and a digest for the built-in zoo sync

Not expand-only (it predates the rule in docs/operations.md): ``default_bindings`` loses its
server default, so code of revision 0001 cannot insert a model into this schema.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 07:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Read by tests/db/test_schema_compat.py: a revision that contracts the schema says what it
# removes and why no running release needs it; every other revision only expands.
contracts = (
    "model_architecture.default_bindings loses its server default: code of 0001 cannot insert "
    "models (written before the expand-then-contract rule)"
)


def upgrade() -> None:
    with op.batch_alter_table("model_architecture") as batch:
        batch.add_column(
            sa.Column("default_bindings", sa.JSON(), nullable=False, server_default="{}")
        )
        batch.add_column(sa.Column("catalog_digest", sa.String(length=64), nullable=True))
    # The server default only fills existing rows; the application always sets the column.
    with op.batch_alter_table("model_architecture") as batch:
        batch.alter_column("default_bindings", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("model_architecture") as batch:
        batch.drop_column("catalog_digest")
        batch.drop_column("default_bindings")
