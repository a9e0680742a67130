"""What writing a replayed flush's `ops` rows costs through the writer's bound rows, against the compact forms that
let SQLite expand them: the flush's template (each position's op, inputs and outputs) kept in a table once, and per
flush only the values that differ (seq, start, duration, line, module, step) handed over in one parameter.

The rows are a real trace's: the model's step is recorded (DEFER_AND_FUSE, replay on), and the `ops` rows of its
flushes that replayed their template are written again, `--repeats` times over, into fresh trace files, each path in
its own transaction, the paths interleaved round by round. Each path's `ops` table is checked against the bound
rows' (every value equal). The time per row is process CPU and includes turning each flush's per-op values into the
path's parameter. The last path writes the template's rows with no per-op values at all (not the same rows): the
floor of an expansion inside SQLite. Writes its table to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sqlite3
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import tputrace.backend  # noqa: F401 - registers the tpu device
import workloads
from results import write_section
from tputrace.recording import lifecycle
from tputrace.schema import RECORD_KINDS_BY_TABLE, table_statements
from tputrace.store.batch_insert import BatchInserter, bind_none_cheaply

Row = tuple
# A replayed flush: (its template's id, chip, program, flush id, its rows in dispatch order).
Flush = tuple[int, int, int, int, list[Row]]
_FIELD_WIDTH = 20  # fixed-width decimal fields
_VALUES_ROWS = 16
_PER_OP = (0, 6, 7, 8, 9, 10)  # the columns of `ops` a replayed op's row has of its own: seq, start, dur, frame, module, step


def replayed_flushes(model: str, steps: int, folder: Path) -> list[Flush]:
    """The ops rows of the flushes that replayed, from a recording of `steps` steps of `model`."""
    step = workloads.build(model, "tpu", None)
    path = folder / "source.tptrace"
    lifecycle.start(str(path), script="bench", argv=[], mode="defer")
    try:
        for index in range(steps):
            loss = step(index)
        loss.item()
    finally:
        lifecycle.stop(0)
    with sqlite3.connect(path) as connection:
        held = [flush_id for (flush_id,) in connection.execute("SELECT id FROM flushes WHERE replay = 'held' ORDER BY id")]
        rows = connection.execute(f"SELECT * FROM ops WHERE flush_id IN ({','.join(map(str, held))}) ORDER BY flush_id, seq").fetchall()
    templates: dict[tuple, int] = {}
    flushes = []
    for flush_id, grouped in itertools.groupby(rows, key=lambda row: row[12]):
        flush_rows = list(grouped)
        template = tuple((row[2], row[3], row[4]) for row in flush_rows)
        template_id = templates.setdefault(template, len(templates) + 1)
        flushes.append((template_id, flush_rows[0][5], flush_rows[0][11], flush_id, flush_rows))
    return flushes


def _connect(path: Path) -> sqlite3.Connection:
    """A fresh trace file as the writer makes it (WAL, normal sync, no indexes yet)."""
    bind_none_cheaply()
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    for statement in table_statements():
        connection.execute(statement)
    connection.execute("CREATE TEMP TABLE template_ops (template INTEGER, position INTEGER, op_sid INTEGER, inputs_sid INTEGER,"
                       " outputs_sid INTEGER, PRIMARY KEY (template, position)) WITHOUT ROWID")
    return connection


def _templates(connection: sqlite3.Connection, flushes: list[Flush]) -> None:
    seen: set[int] = set()
    for template_id, _, _, _, rows in flushes:
        if template_id not in seen:
            seen.add(template_id)
            connection.executemany("INSERT INTO template_ops VALUES (?, ?, ?, ?, ?)",
                                   [(template_id, position, row[2], row[3], row[4]) for position, row in enumerate(rows)])


def _bound_rows(connection: sqlite3.Connection, flushes: list[Flush]) -> None:
    inserter = BatchInserter("ops", RECORD_KINDS_BY_TABLE["ops"].column_names)
    for _, _, _, _, rows in flushes:
        inserter.insert(connection, rows)


_EXPANDED = ("INSERT INTO ops SELECT {seq}, 0, t.op_sid, t.inputs_sid, t.outputs_sid, ?2, {start}, {dur}, {frame}, {module}, {step}, ?3, ?4 "
             "FROM {source} WHERE t.template = ?5")


def _json(connection: sqlite3.Connection, flushes: list[Flush]) -> None:
    fields = {name: f"j.value ->> {index}" for index, name in enumerate(("seq", "start", "dur", "frame", "module", "step"))}
    sql = _EXPANDED.format(source="json_each(?1) j CROSS JOIN template_ops t ON t.position = j.key", **fields)
    for template_id, chip, program_id, flush_id, rows in flushes:
        per_op = json.dumps([[row[column] for column in _PER_OP] for row in rows])
        connection.execute(sql, (per_op, chip, program_id, flush_id, template_id))


def _fixed_width(connection: sqlite3.Connection, flushes: list[Flush]) -> None:
    stride = _FIELD_WIDTH * len(_PER_OP)

    def field(index: int) -> str:
        return f"NULLIF(CAST(substr(?1, t.position * {stride} + {index * _FIELD_WIDTH + 1}, {_FIELD_WIDTH}) AS INTEGER), -1)"

    names = ("seq", "start", "dur", "frame", "module", "step")
    sql = _EXPANDED.format(source="template_ops t", **{name: field(index) for index, name in enumerate(names)})
    for template_id, chip, program_id, flush_id, rows in flushes:
        values = [-1 if row[column] is None else row[column] for row in rows for column in _PER_OP]
        connection.execute(sql, ((f"%{_FIELD_WIDTH}d" * len(values) % tuple(values)).encode(), chip, program_id, flush_id, template_id))


def _values_join(connection: sqlite3.Connection, flushes: list[Flush]) -> None:
    width = len(_PER_OP) + 1
    tuples = ", ".join(["(" + ", ".join("?" * width) + ")"] * _VALUES_ROWS)
    fields = {name: f"v.column{index + 2}" for index, name in enumerate(("seq", "start", "dur", "frame", "module", "step"))}
    many = _EXPANDED.format(source=f"(VALUES {tuples}) v CROSS JOIN template_ops t ON t.position = v.column1", **fields)
    # Unnumbered parameters, in the order they appear: chip, program, flush, the VALUES rows, template.
    many = many.replace("?2", "?").replace("?3", "?").replace("?4", "?").replace("?5", "?")
    one = "INSERT INTO ops VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    for template_id, chip, program_id, flush_id, rows in flushes:
        whole = len(rows) - len(rows) % _VALUES_ROWS
        flat = [value for position, row in enumerate(rows[:whole]) for value in (position, *(row[column] for column in _PER_OP))]
        size = width * _VALUES_ROWS
        connection.executemany(many, [(chip, program_id, flush_id, *flat[start:start + size], template_id) for start in range(0, len(flat), size)])
        connection.executemany(one, rows[whole:])


def _template_only(connection: sqlite3.Connection, flushes: list[Flush]) -> None:
    sql = _EXPANDED.format(source="template_ops t", seq="t.position", start="t.position", dur="0", frame="NULL", module="NULL", step="?1")
    for template_id, chip, program_id, flush_id, _ in flushes:
        connection.execute(sql, (0, chip, program_id, flush_id, template_id))


# path -> (writes the flushes' rows, whether its rows are the bound rows')
PATHS: dict[str, tuple[Callable[[sqlite3.Connection, list[Flush]], None], bool]] = {
    "bound rows (the writer's multi-row INSERT)": (_bound_rows, True),
    "template join, per-op values as one JSON array": (_json, True),
    "template join, per-op values as fixed-width fields of one blob": (_fixed_width, True),
    "template join, per-op values as bound VALUES rows": (_values_join, True),
    "template rows alone, no per-op values (SQLite's floor)": (_template_only, False),
}


def time_path(name: str, flushes: list[Flush], folder: Path) -> tuple[float, list[Row]]:
    """(µs of process CPU per row, the ops rows written) of one path."""
    write, same_rows = PATHS[name]
    path = folder / "paths.tptrace"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    connection = _connect(path)
    try:
        _templates(connection, flushes)
        started = time.process_time()
        connection.execute("BEGIN")
        write(connection, flushes)
        connection.execute("COMMIT")
        elapsed = time.process_time() - started
        written = connection.execute("SELECT * FROM ops ORDER BY rowid").fetchall() if same_rows else []
    finally:
        connection.close()
    return elapsed / sum(len(flush[4]) for flush in flushes) * 1e6, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small_lm", choices=workloads.MODELS)
    parser.add_argument("--steps", type=int, default=8, help="steps recorded")
    parser.add_argument("--repeats", type=int, default=40, help="times the replayed flushes are written per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print the table without writing bench/RESULTS.md")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        flushes = replayed_flushes(args.model, args.steps, folder) * args.repeats
        names = list(PATHS)
        samples: dict[str, list[float]] = {name: [] for name in names}
        expected = time_path(names[0], flushes, folder)[1]
        for round_index in range(args.rounds):
            for name in names if round_index % 2 == 0 else names[::-1]:
                per_row, written = time_path(name, flushes, folder)
                if PATHS[name][1] and written != expected:
                    raise SystemExit(f"{name}: its ops rows differ from the bound rows'")
                samples[name].append(per_row)
    n_rows = sum(len(flush[4]) for flush in flushes) // args.repeats
    lines = [
        f"{workloads.describe(args.model)}: {len(flushes) // args.repeats} replayed flushes of {args.steps} steps, {n_rows} ops rows, "
        f"written {args.repeats} times per measurement; median and range over {args.rounds} rounds.\n",
        "| path | µs of process CPU per row | range |",
        "|---|---|---|",
    ]
    for name in names:
        lines.append(f"| {name} | {statistics.median(samples[name]):.2f} | {min(samples[name]):.2f}-{max(samples[name]):.2f} |")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("Replayed flushes' ops rows: bound rows against an expansion inside SQLite (bench/replayed_ops_insert.py)",
                      "The same rows written per path, each path's table checked equal to the bound rows'; the last path writes "
                      "other rows (no per-op values), SQLite's floor.\n\n" + text)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
