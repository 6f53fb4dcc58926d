"""model_architecture: a pre-quantized checkpoint's quantization_config, and its torch_dtype

A model imported from a config.json with a `quantization_config` (GPTQ/AWQ W4A16,
compressed-tensors W8A8 / FP8 / WNA16, FP8, MXFP4) now keeps it, as given, with the config's
`torch_dtype`: the memory estimate prices its weights as the checkpoint stores them, and the
engine endpoint reads the config from the stored model. Expand-only: two nullable columns; rows
stored before this revision have none (NULL: an unquantized model, priced at the request's
precision, as before). Downgrading drops the columns (the previous release never reads them).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 01:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("model_architecture") as batch:
        batch.add_column(sa.Column("quantization_config", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("torch_dtype", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_architecture") as batch:
        batch.drop_column("torch_dtype")
        batch.drop_column("quantization_config")
