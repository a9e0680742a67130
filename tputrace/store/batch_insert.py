"""Inserting a batch of rows of one table through `sqlite3` with as little binding as the rows allow.

Much of a row's insert cost is `sqlite3` binding its values, and `None` the dearest of them: only exact ints,
floats and strings are bound directly, any other value goes through an adaptation lookup, which without an
adapter fails two attribute lookups (their exceptions made and cleared) before binding NULL. So
- a column that is NULL in every row of the batch is written as `NULL` in the statement, not bound;
- `None` gets an adapter (to `None`, so still NULL) unless the process has one: a C callable, cheap to call;
- the rows go `ROWS_PER_STATEMENT` to a statement (one multi-row INSERT costs less than as many one-row ones).
What is stored is the same as one bound `INSERT` per row.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import Any

ROWS_PER_STATEMENT = 16
# Empty: its `get` maps `None` to `None`, a C callable as `None`'s adapter.
_NONE_TO_NULL: dict[None, None] = {}


def bind_none_cheaply() -> None:
    """Give `None` an adapter (to `None`), unless the process has registered one already."""
    if (type(None), sqlite3.PrepareProtocol) not in sqlite3.adapters:
        sqlite3.register_adapter(type(None), _NONE_TO_NULL.get)


class BatchInserter:
    """The INSERT statements of one table, by the set of columns written as `NULL` literals."""

    def __init__(self, table: str, column_names: Sequence[str]) -> None:
        self.table = table
        self.column_names = tuple(column_names)
        self._statements: dict[tuple[int, ...], tuple[str, str]] = {}

    def insert(self, connection: sqlite3.Connection, rows: Sequence[Sequence[Any]]) -> None:
        """Insert `rows` (each in the table's column order). Raises what `executemany` raises for a bad row (the
        caller then inserts row by row), and `sqlite3.ProgrammingError` for a row of the wrong length."""
        full_width = len(rows) >= ROWS_PER_STATEMENT and set(map(len, rows)) == {len(self.column_names)}
        nulls = self._nulls_of_full_rows(rows) if full_width else ()
        kept = [index for index in range(len(self.column_names)) if index not in nulls]
        # Each row's bound values, made as the statements need them (not a copy of the batch).
        values: Iterator[Any] = map(itemgetter(*kept), rows) if nulls else iter(rows)
        one_row_sql, many_rows_sql = self._sql(nulls)
        whole = len(rows) - len(rows) % ROWS_PER_STATEMENT
        if whole and full_width:
            # Every row as wide as the table: a statement's values are the next so many of the rows' values in a row.
            flat = itertools.chain.from_iterable(itertools.islice(values, whole))
            connection.executemany(many_rows_sql, zip(*[flat] * (ROWS_PER_STATEMENT * len(kept))))
        elif whole:
            groups = zip(*[itertools.islice(values, whole)] * ROWS_PER_STATEMENT)
            flatten = itertools.chain.from_iterable
            connection.executemany(many_rows_sql, (tuple(flatten(group)) for group in groups))
        connection.executemany(one_row_sql, values)  # the rows after the last whole statement

    def null_columns(self, rows: Sequence[Sequence[Any]]) -> tuple[int, ...]:
        """The columns that are None in every row; none where the rows are too few to gain, or not all of the
        table's width (they are then bound as they are, and the bad ones fail)."""
        if len(rows) < ROWS_PER_STATEMENT or set(map(len, rows)) != {len(self.column_names)}:
            return ()
        return self._nulls_of_full_rows(rows)

    def _nulls_of_full_rows(self, rows: Sequence[Sequence[Any]]) -> tuple[int, ...]:
        """`null_columns` of rows known to be enough and all of the table's width."""
        width = len(self.column_names)
        every_none = (None,) * len(rows)
        nulls = tuple(index for index, value in enumerate(rows[0])
                      if value is None and tuple(map(itemgetter(index), rows)) == every_none)
        return nulls if width - len(nulls) >= 2 else ()  # `itemgetter` of one index gives no tuple

    def _sql(self, nulls: tuple[int, ...]) -> tuple[str, str]:
        """The one-row and the multi-row INSERT with `nulls` written as NULL."""
        statements = self._statements.get(nulls)
        if statements is None:
            values = ", ".join("NULL" if index in nulls else "?" for index in range(len(self.column_names)))
            head = f"INSERT INTO {self.table} ({', '.join(self.column_names)}) VALUES "
            statements = self._statements[nulls] = (
                f"{head}({values})", head + ", ".join(f"({values})" for _ in range(ROWS_PER_STATEMENT)))
        return statements
