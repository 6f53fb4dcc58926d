"""model architectures: attention layers no longer say how attention is computed

The ``fused`` attribute of ``attention`` layers is removed from stored graphs: the attention
implementation (eager, sdpa_math, flash, mem_efficient) is now a request option. A graph that
was stored with ``fused: true`` gets the same figures by asking for ``attention=flash``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 01:10:00
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def strip_fused(layers: list[Any]) -> tuple[list[Any], bool]:
    """The layers without ``fused`` on attention layers (nested blocks too), and whether any
    was removed."""
    changed = False
    result = []
    for layer in layers:
        if isinstance(layer, dict):
            if layer.get("op") == "attention" and "fused" in layer:
                layer = {k: v for k, v in layer.items() if k != "fused"}
                changed = True
            if isinstance(layer.get("layers"), list):
                inner, inner_changed = strip_fused(layer["layers"])
                if inner_changed:
                    layer = {**layer, "layers": inner}
                    changed = True
        result.append(layer)
    return result, changed


def upgrade() -> None:
    table = sa.table(
        "model_architecture",
        sa.column("id", sa.Integer),
        sa.column("layers", sa.JSON),
        sa.column("version", sa.Integer),
    )
    connection = op.get_bind()
    rows = connection.execute(sa.select(table.c.id, table.c.layers, table.c.version)).all()
    for row_id, layers, version in rows:
        stripped, changed = strip_fused(layers or [])
        if changed:
            connection.execute(
                table.update()
                .where(table.c.id == row_id)
                .values(layers=stripped, version=version + 1)
            )


def downgrade() -> None:
    # Nothing to restore: graphs without ``fused`` are valid in the previous schema too (the
    # attribute was optional and meant eager when absent).
    pass
