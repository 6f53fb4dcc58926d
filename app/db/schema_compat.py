"""Which database schemas this code can serve: the rule behind `/readyz` and `migrate`.

Migrations are expand-then-contract (see ``docs/operations.md``): a release only *adds*
(tables, nullable columns, NOT NULL columns with a server default), so the previous release's
code keeps working on the new schema, and a column is dropped only in a later release, once no
running code maps it. Code therefore accepts a schema by what it finds in it, not by the
revision id alone, because a schema migrated by a *later* release has a revision this code has
never heard of:

* every table and column the code maps exists (its SELECTs name their columns, so extra
  columns do no harm), and
* no column it does not map is NOT NULL without a server default (its INSERTs leave such
  columns out, and the database would refuse them).

By revision: no revision is *unmigrated*; a revision this code ships other than its head is
*behind* (run ``capplan-server migrate``); its head is *current*; a revision it does not ship
is *newer* (a later release migrated; rolling upgrade or rollback in progress). Current and
newer schemas are served when the structure rule holds.

This module depends on SQLAlchemy and Alembic only (no ``app`` import), so a test can apply
it to another release's metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, MetaData, inspect

SchemaStatus = Literal["current", "newer", "behind", "unmigrated", "incompatible"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaCheck:
    """The verdict on one database schema for this code, with its reasons."""

    status: SchemaStatus
    database_revisions: tuple[str, ...]
    code_revisions: tuple[str, ...]
    problems: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        """Whether this code can serve the schema."""
        return self.status in ("current", "newer")

    def describe(self) -> str:
        """One sentence for `/readyz`, logs and the CLI."""
        db = ", ".join(self.database_revisions) or "no revision"
        code = ", ".join(self.code_revisions)
        if self.status == "current":
            return f"database schema is at {db}, this code's head"
        if self.status == "newer":
            return (
                f"database schema is at {db}, newer than this code's head {code}, and has every "
                "table and column this code uses (a later release migrated it; expand-only)"
            )
        if self.status == "unmigrated":
            return f"database has no schema revision; run `capplan-server migrate` (head {code})"
        if self.status == "behind":
            return (
                f"database schema is at {db}, behind this code's head {code}; "
                "run `capplan-server migrate`"
            )
        return (
            f"database schema is at {db} and this code (head {code}) cannot use it: "
            + "; ".join(self.problems)
        )


def structural_problems(connection: Connection, metadata: MetaData) -> list[str]:
    """What in the database keeps code mapping ``metadata`` from reading or writing it."""
    inspector = inspect(connection)
    tables = set(inspector.get_table_names())
    problems: list[str] = []
    for table in metadata.sorted_tables:
        if table.name not in tables:
            problems.append(f"table {table.name} is missing")
            continue
        columns = {column["name"]: column for column in inspector.get_columns(table.name)}
        mapped = {column.name for column in table.columns}
        problems.extend(
            f"column {table.name}.{name} is missing" for name in sorted(mapped - set(columns))
        )
        for name in sorted(set(columns) - mapped):
            column = columns[name]
            if not column["nullable"] and column.get("default") is None:
                problems.append(
                    f"column {table.name}.{name} is NOT NULL without a server default "
                    "(this code's inserts would fail)"
                )
    return problems


def database_revisions(connection: Connection) -> tuple[str, ...]:
    """The Alembic revision(s) the database is at, sorted (empty when never migrated)."""
    return tuple(sorted(MigrationContext.configure(connection).get_current_heads()))


def check_schema(
    connection: Connection,
    metadata: MetaData,
    *,
    code_heads: Iterable[str],
    known_revisions: Iterable[str],
) -> SchemaCheck:
    """Whether code mapping ``metadata``, shipping ``known_revisions`` up to ``code_heads``,
    can serve the database behind ``connection``."""
    heads = tuple(sorted(code_heads))
    known = frozenset(known_revisions)
    current = database_revisions(connection)
    if not current:
        return SchemaCheck(status="unmigrated", database_revisions=(), code_revisions=heads)
    status: SchemaStatus
    if set(current) == set(heads):
        status = "current"
    elif set(current) <= known:
        return SchemaCheck(status="behind", database_revisions=current, code_revisions=heads)
    else:
        status = "newer"
    problems = tuple(structural_problems(connection, metadata))
    if problems:
        status = "incompatible"
    return SchemaCheck(
        status=status, database_revisions=current, code_revisions=heads, problems=problems
    )
