"""Columns of a rank's `ops` rows as numpy arrays, in file order, read inside SQLite.

numpy is not a core dependency: `op_ranking` imports this only where numpy is installed (with the
views), and ranks row by row without it.

Fetching a million rows as Python tuples costs seconds; `group_concat` builds a column's text in
SQLite's C code and numpy parses it, several times faster, so that views can aggregate millions of
ops with array operations (`bincount`, `searchsorted`) instead of a Python loop per row. The rows
are read in slices of rowids, which bounds the text held at once and lets several cores read.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tputrace.store.errors import QueryError, TputraceError
from tputrace.store.opening import connect_read_only

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

NULL_VALUE = -(2**62)
"""What a NULL reads as (no recorded id, time or duration is this)."""
SLICE_ROWS = 1 << 19
"""Rowids read per query."""
MAX_READERS = 4
"""Connections reading slices at once."""
EXACT_FLOAT_SUM = 2**53
"""Integer sums below this are exact in float64 (`np.bincount`'s weights)."""


def read_op_columns(trace: Trace, rank: int, expressions: Mapping[str, str]) -> dict[str, np.ndarray] | None:
    """For each name in `expressions`, the SQL expression over `ops` columns evaluated on every row of
    `rank`, as an int64 array in file (rowid) order, NULL as `NULL_VALUE`. None when a value is not an
    integer (a damaged or hand-made file): callers then read the rows one by one.

    Slices of rowids are read on connections of their own, in parallel where the machine has cores to
    spare: SQLite runs a query without holding the GIL."""
    (low,), = trace.sql("SELECT MIN(rowid) FROM ops")  # one query for both would scan the table
    (high,), = trace.sql("SELECT MAX(rowid) FROM ops")
    if low is None:
        return {name: np.zeros(0, dtype=np.int64) for name in expressions}
    selected = ", ".join(f"group_concat(COALESCE({expression}, {NULL_VALUE}))" for expression in expressions.values())
    query = f"SELECT COUNT(*), {selected} FROM ops WHERE rowid >= ? AND rowid < ? AND rank = ?"
    firsts = range(low, high + 1, SLICE_ROWS)
    workers = min(len(firsts), MAX_READERS, os.cpu_count() or 1)
    if workers > 1:
        slices = _read_in_parallel(Path(trace.path), query, rank, list(firsts), workers)
    else:
        try:
            slices = [trace.sql(query, (first, first + SLICE_ROWS, rank))[0] for first in firsts]
        except QueryError:
            return None
    if slices is None:
        return None
    parts: dict[str, list[np.ndarray]] = {name: [] for name in expressions}
    for count, *texts in slices:
        if not count:
            continue
        for name, text in zip(expressions, texts):
            values = _parse(text, count)
            if values is None:
                return None
            parts[name].append(values)
    return {name: np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64) for name, arrays in parts.items()}


def _read_in_parallel(path: Path, query: str, rank: int, firsts: list[int], workers: int) -> list[tuple[Any, ...]] | None:
    local = threading.local()
    connections: list[sqlite3.Connection] = []
    lock = threading.Lock()

    def read(first: int) -> tuple[Any, ...]:
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = connect_read_only(path)
            with lock:
                connections.append(connection)
        row: tuple[Any, ...] = connection.execute(query, (first, first + SLICE_ROWS, rank)).fetchone()
        return row

    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tputrace-columns") as pool:
            return list(pool.map(read, firsts))
    except (sqlite3.Error, TputraceError):
        return None
    finally:
        for connection in connections:
            connection.close()


def _parse(text: object, count: int) -> np.ndarray | None:
    if not isinstance(text, str):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            values = np.fromstring(text, dtype=np.int64, sep=",")
        except (ValueError, DeprecationWarning):
            return None
    return values if len(values) == count else None


def sums_by(keys: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Exact int64 sums of `values` per key (keys in 0..size-1)."""
    if not len(values) or int(np.abs(values).max()) * len(values) < EXACT_FLOAT_SUM:
        return np.bincount(keys, weights=values, minlength=size).astype(np.int64)
    totals = np.zeros(size, dtype=np.int64)
    np.add.at(totals, keys, values)
    return totals


def dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)`, in one pass over a table of the values' range when
    that range is not much bigger than `values` (ids, mostly), instead of a sort."""
    if not len(values):
        return values[:0], np.zeros(0, dtype=np.int64)
    low, high = int(values.min()), int(values.max())
    if high - low > 8 * len(values) + (1 << 20):
        return np.unique(values, return_inverse=True)
    present = np.zeros(high - low + 1, dtype=bool)
    shifted = values - low
    present[shifted] = True
    codes = np.cumsum(present) - 1
    return np.flatnonzero(present) + low, codes[shifted]


def pair_codes(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """One dense code per distinct (first, second) pair of two arrays of dense codes."""
    return dense_codes(first * (int(second.max()) + 1 if len(second) else 1) + second)[1]


def packed_ids_sql(columns: Sequence[str], width: int) -> str:
    """SQL packing the ids in `columns` (string or frame ids) into one number, `width` per id and
    `width - 1` for NULL (`packed // width ** k % width` unpacks); NULL (read as `NULL_VALUE`) where an id
    is outside 0..width-2 (a dangling id in a damaged file), which callers take as columns they cannot read."""
    in_range = " AND ".join(f"({column} IS NULL OR {column} BETWEEN 0 AND {width - 2})" for column in columns)
    packed = f"COALESCE({columns[0]}, {width - 1})"
    for column in columns[1:]:
        packed = f"({packed}) * {width} + COALESCE({column}, {width - 1})"
    return f"CASE WHEN {in_range} THEN {packed} END"
