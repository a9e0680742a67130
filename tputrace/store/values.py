"""Values a trace's writer never stores: text where the format has integers, NULL where it needs a value.

SQLite keeps whatever a file holds, whatever its columns declare, so a damaged or hand-made trace can
hold `'abc'` in `ops.start_ns`, NULL in `strings.text` or `inf` in `programs.flops`, and every view
computes with those values as the format describes them. `bad_value` finds the first such value with one
scan per table; the CLI looks for one when a command fails on a trace, to name it in one sentence
instead of a traceback.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tputrace.schema import RECORD_KINDS, Column, RecordKind
from tputrace.store.errors import TputraceError

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

# SQLite storage classes each declared type holds in a trace (NULL aside).
_STORAGE_CLASSES: dict[str, tuple[str, ...]] = {"INTEGER": ("integer",), "REAL": ("integer", "real"), "TEXT": ("text",)}
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {"INTEGER": (int,), "REAL": (int, float), "TEXT": (str,)}
# Columns every row of their table has a value in (besides each table's `rank` and primary key).
_REQUIRED: frozenset[tuple[str, str]] = frozenset({
    ("strings", "text"), ("frames", "line"), ("steps", "step"), ("steps", "start_ns"), ("steps", "end_ns"),
})
_DURATIONS: frozenset[str] = frozenset({"dur_ns", "wait_ns"})
_LARGEST_FLOAT = sys.float_info.max
# Times and durations past 2**62 ns (146 years) are no run's: sums of two would overflow 64-bit integers.
_LARGEST_NS = 2**62


def bad_value(trace: Trace) -> str | None:
    """The first value of `trace` that its format never stores, as the end of a sentence
    (`ops.start_ns holds 'abc' (text) where the format has integers`), or None if there is none."""
    for kind in RECORD_KINDS:
        if not trace.has_table(kind.table):
            continue
        stored = {row[1] for row in trace.sql(f"PRAGMA table_info({kind.table})")}
        columns = [column for column in kind.columns if column.name in stored]
        if not columns:
            continue
        conditions = " OR ".join(_sql_condition(kind, column) for column in columns)
        names = ", ".join(column.name for column in columns)
        rows = trace.sql(f"SELECT {names} FROM {kind.table} WHERE {conditions} LIMIT 1")
        if rows:
            return _describe(kind, columns, rows[0])
    return None


def _required(kind: RecordKind, column: Column) -> bool:
    return column.name == "rank" or column.name == kind.primary_key or (kind.table, column.name) in _REQUIRED


def _sql_condition(kind: RecordKind, column: Column) -> str:
    """SQL that is true where `column` holds a value the format never stores."""
    classes = _STORAGE_CLASSES.get(column.kind, ("integer", "real", "text"))
    allowed = classes if _required(kind, column) else (*classes, "null")
    condition = f"typeof({column.name}) NOT IN ({', '.join(repr(name) for name in allowed)})"
    if column.name in _DURATIONS:
        condition += f" OR {column.name} < 0"
    if column.kind == "REAL":
        condition += f" OR abs({column.name}) > {_LARGEST_FLOAT!r}"
    if _is_run_time(column):
        condition += f" OR abs({column.name}) > {_LARGEST_NS}"
    return condition


def _is_run_time(column: Column) -> bool:
    """Whether `column` holds ns counted within a run (a time since its start, or a duration)."""
    return column.kind == "INTEGER" and column.name.endswith("_ns") and column.name != "start_unix_ns"


def _describe(kind: RecordKind, columns: list[Column], row: tuple[Any, ...]) -> str:
    for column, value in zip(columns, row):
        where = f"{kind.table}.{column.name}"
        if value is None:
            if _required(kind, column):
                return f"{where} holds NULL where the format needs a value"
            continue
        types = _PYTHON_TYPES.get(column.kind, (int, float, str))
        if not isinstance(value, types) or isinstance(value, bool):
            noun = "integers" if column.kind == "INTEGER" else "numbers" if column.kind == "REAL" else "text"
            return f"{where} holds {_shown(value)} ({_storage_class(value)}) where the format has {noun}"
        if not isinstance(value, (int, float)):  # text: the checks below are of numbers
            continue
        if column.name in _DURATIONS and value < 0:
            return f"{where} holds {value}, a negative duration"
        if column.kind == "REAL" and not math.isfinite(value):
            return f"{where} holds {value}, not a finite number"
        if _is_run_time(column) and abs(value) > _LARGEST_NS:
            return f"{where} holds {value}, more nanoseconds than any run lasts"
    return f"{kind.table} holds a value its format never stores"


def _storage_class(value: Any) -> str:
    return {int: "integer", float: "real", str: "text", bytes: "blob"}.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """The value as the sentence shows it: short, and one line."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def damaged_trace(paths: Iterable[str | Path]) -> str | None:
    """A sentence naming the first of `paths` that opens but holds a value its format never stores
    (`t.tptrace is damaged: ...`), or None; files that do not open are left to the command's own error."""
    from tputrace.store.reader import open_trace

    for path in paths:
        try:
            with open_trace(path) as trace:
                problem = bad_value(trace)
        except TputraceError:
            continue
        if problem is not None:
            return f"{path} is damaged: {problem}"
    return None
