"""Merging per-rank traces into one multi-rank trace on one clock.

Every table has a `rank` column, so a merge copies each rank's rows into one file, re-interning
strings and frames, renumbering ids (programs, compiles, flushes), and shifting event times onto one
time origin: the earliest rank start. Every rank's `runs.start_unix_ns` in the merged file is that
origin, so `start_unix_ns + start_ns` is still the wall-clock time of every event.

Clocks. Ranks on one host share its wall clock, which is what `runs.start_unix_ns` records. Ranks
on several hosts (merged with `tputrace merge`) also differ by the hosts' clock error; the merge then
estimates each host's offset from the collectives the ranks took part in together: a collective ends
at nearly the same moment on every rank (when the last rank's data has arrived), so the median
difference of end times is the offset.

Waiting. The k-th collective of a group is the same call on every member (c10d requires that order),
so once the ranks share a clock each rank's wait for the last arrival is `max(arrivals) - own arrival`
(at most the call's duration); the merge writes it into `collectives.wait_ns`. A send and a receive
match in order per (sender, receiver) pair.

Ranks that died. A rank whose trace is missing gets a `runs` row whose `error` says so; a rank whose
trace ends without an end record (killed) keeps its rows and gets an `error` saying it died (with the
launcher's reason when known). A rank that ended on its own with a failure keeps its own exit status
and error. `meta.merge` holds the same facts as JSON.

Forked processes. A trace recorded by a process forked under `tputrace run` (`meta.forked_from`) is
one more rank, not a distributed one: it does not count towards the world size, and the merged
trace lists it in `meta.forks` (`tputrace.forks`).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tputrace.forks import FORKS_META_KEY, ForkOrigin, fork_origins, forks_meta, started_by
from tputrace.schema import COLLECTIVES, RECORD_KINDS, RECORDING_WINDOW_META_KEY, RUNS, RecordKind
from tputrace.store.errors import TputraceError
from tputrace.store.reader import Trace, open_trace
from tputrace.store.records import RunInfo
from tputrace.store.writer import TraceWriter

# Columns holding times relative to the run's start (shifted by a merge), and plain durations (kept).
EVENT_TIME_COLUMNS = frozenset({"start_ns", "end_ns", "t_ns", "alloc_ns", "free_ns"})
DURATION_COLUMNS = frozenset({"dur_ns", "wait_ns", "waited_after_ns"})
WALL_CLOCK_COLUMNS = frozenset({"start_unix_ns"})
ALIGNMENTS = ("auto", "wall", "collectives")
POINT_TO_POINT = ("send", "recv")
_FLUSH_EVERY_ROWS = 200_000


class MergeError(TputraceError):
    """Traces that cannot be merged (the same rank twice, no inputs, an unknown alignment)."""


@dataclass(frozen=True)
class CollectiveRow:
    """One collectives row as the merge sees it: who, which call, and when on the merged clock."""

    key: tuple[int, int]  # (input index, rowid): where the row came from
    rank: int
    kind: str
    group: str
    ranks: str
    start_ns: int  # wall clock, ns since the Unix epoch, after the host's offset
    dur_ns: int

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


@dataclass
class MergeResult:
    """What a merge did: which ranks it holds, which are missing or died, and how clocks were aligned."""

    output: Path
    ranks: list[int]
    world_size: int
    missing: dict[int, str] = field(default_factory=dict)
    died: dict[int, str] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    clock: str = "wall clock"
    offsets_ns: dict[str, int] = field(default_factory=dict)
    matched_collectives: int = 0
    waits_filled: int = 0
    forks: dict[int, ForkOrigin] = field(default_factory=dict)
    first_failure: str | None = None  # the launcher's word on which rank failed first, and where

    def lines(self) -> list[str]:
        """The merge, in a few lines for people."""
        distributed = len([rank for rank in self.ranks if rank not in self.forks])
        forked = f" and {len(self.forks)} forked processes" if self.forks else ""
        lines = [f"merged {distributed} of {self.world_size} ranks{forked} into {self.output} ({self.clock})"]
        for host, offset in sorted(self.offsets_ns.items()):
            if offset:
                lines.append(f"  clock of {host}: {offset / 1e6:+.3f} ms from the reference host")
        if self.matched_collectives:
            lines.append(f"  {self.matched_collectives} collectives matched across ranks; {self.waits_filled} waits filled in")
        for rank, why in sorted(self.died.items()):
            lines.append(f"  rank {rank} died: {why}")
        for rank, why in sorted(self.failed.items()):
            lines.append(f"  rank {rank} failed: {why}")
        for rank, why in sorted(self.missing.items()):
            lines.append(f"  rank {rank} is missing: {why}")
        if self.first_failure:
            lines.append(f"  {self.first_failure}")
        for rank, origin in sorted(self.forks.items()):
            lines.append(f"  rank {rank} is process {origin.pid}, {started_by(origin)} rank {origin.parent_rank} (process {origin.parent_pid})")
        return lines

    def meta(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "world_size": self.world_size,
            "missing_ranks": {str(rank): why for rank, why in sorted(self.missing.items())},
            "died_ranks": {str(rank): why for rank, why in sorted(self.died.items())},
            "failed_ranks": {str(rank): why for rank, why in sorted(self.failed.items())},
            "clock": self.clock,
            "clock_offsets_ns": self.offsets_ns,
            "matched_collectives": self.matched_collectives,
            **({"first_failure": self.first_failure} if self.first_failure else {}),
        }


def column_roles(kind: RecordKind) -> list[str]:
    """How a merge treats each column of a table: rank, id, a reference, event time, or plain value."""
    roles = []
    for column in kind.columns:
        if column.name == "rank":
            roles.append("rank")
        elif column.name == kind.primary_key:
            roles.append("id")
        elif column.ref is not None:
            roles.append(f"ref:{column.ref}")
        elif column.name in EVENT_TIME_COLUMNS:
            roles.append("time")
        elif column.name.endswith("_ns") and column.name not in DURATION_COLUMNS | WALL_CLOCK_COLUMNS:
            raise MergeError(f"{kind.table}.{column.name} is neither an event time nor a duration; teach tputrace.merge which it is")
        else:
            roles.append("value")
    return roles


# ----------------------------------------------------------------- matching collectives across ranks
def match_collectives(rows: Iterable[CollectiveRow]) -> list[list[CollectiveRow]]:
    """The calls that every participant recorded: the k-th call of a group on each member rank
    (stopping where the ranks disagree on the kind, which means they are out of step), and the k-th
    send and receive of each (sender, receiver) pair."""
    by_group: dict[tuple[str, str], dict[int, list[CollectiveRow]]] = defaultdict(lambda: defaultdict(list))
    pairs: dict[str, dict[str, list[CollectiveRow]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.kind in POINT_TO_POINT:
            pairs[row.ranks][row.kind].append(row)
        else:
            by_group[(row.group, row.ranks)][row.rank].append(row)
    matched = []
    for (_, ranks_text), per_rank in by_group.items():
        members = _members(ranks_text)
        if not members or any(member not in per_rank for member in members):
            continue
        sequences = [sorted(per_rank[member], key=lambda row: row.start_ns) for member in members]
        for calls in zip(*sequences):
            if len({call.kind for call in calls}) != 1:
                break
            matched.append(list(calls))
    for by_kind in pairs.values():
        sends = sorted(by_kind.get("send", []), key=lambda row: row.start_ns)
        receives = sorted(by_kind.get("recv", []), key=lambda row: row.start_ns)
        matched.extend([send, receive] for send, receive in zip(sends, receives))
    return matched


def wait_times(matched: Iterable[list[CollectiveRow]]) -> dict[tuple[int, int], int]:
    """Each matched row's wait for the last arrival: `max(arrivals) - own arrival`, within its duration."""
    waits = {}
    for calls in matched:
        last = max(call.start_ns for call in calls)
        for call in calls:
            waits[call.key] = max(0, min(last - call.start_ns, call.dur_ns))
    return waits


def host_offsets(rows: Sequence[CollectiveRow], hosts: Mapping[int, str], reference_host: str) -> dict[str, int]:
    """Each host's clock minus the reference host's, from the end times of collectives they shared."""
    differences: dict[str, list[int]] = defaultdict(list)
    for calls in match_collectives(rows):
        reference_ends = [call.end_ns for call in calls if hosts.get(call.rank) == reference_host]
        if not reference_ends:
            continue
        reference_end = statistics.median(reference_ends)
        for call in calls:
            host = hosts.get(call.rank)
            if host is not None and host != reference_host:
                differences[host].append(call.end_ns - reference_end)
    offsets = {host: 0 for host in set(hosts.values())}
    for host, values in differences.items():
        offsets[host] = int(statistics.median(values))
    return offsets


def _members(ranks_text: str) -> list[int]:
    return [int(part) for part in ranks_text.split(",") if part.strip()]


# ----------------------------------------------------------------- the merge
@dataclass
class _Source:
    index: int
    trace: Trace
    runs: dict[int, RunInfo]
    scratch: Path | None = None  # a recovered copy's directory, removed after the merge


def merge_traces(
    inputs: Sequence[str | Path],
    output: str | Path,
    *,
    expected_ranks: Iterable[int] | None = None,
    failures: Mapping[int, str] | None = None,
    align: str = "auto",
    source_roots: Sequence[str | Path] = (),
    first_failure: str | None = None,
) -> MergeResult:
    """Merge traces (one rank each, or merged already) into `output`.

    `expected_ranks` are the ranks that should be there (default: every rank below the largest
    recorded world size); `failures` are the launcher's reasons for ranks that failed, and
    `first_failure` its sentence on the rank that failed first (kept in `meta.merge`); `source_roots`
    are searched for a copy of a source file the run saw, which an older trace's byte columns need to
    be written in characters (without one, such a call's columns are dropped)."""
    if align not in ALIGNMENTS:
        raise MergeError(f"unknown clock alignment {align!r}; use one of {', '.join(ALIGNMENTS)}")
    if not inputs:
        raise MergeError("nothing to merge: give at least one trace")
    output_path = Path(output).resolve()
    failures = dict(failures or {})
    sources = _open_sources(inputs, output_path, source_roots)
    try:
        return _merge(sources, output_path, expected_ranks, failures, align, first_failure)
    finally:
        _close(sources)


def _close(sources: list[_Source]) -> None:
    import shutil

    for source in sources:
        source.trace.close()
        if source.scratch is not None:
            shutil.rmtree(source.scratch, ignore_errors=True)


def _open_sources(inputs: Sequence[str | Path], output_path: Path, source_roots: Sequence[str | Path]) -> list[_Source]:
    sources: list[_Source] = []
    owner: dict[int, Path] = {}
    try:
        for index, path in enumerate(inputs):
            if Path(path).resolve() == output_path:
                raise MergeError(f"{path} is both an input and the output")
            trace, scratch = _open_recovering(Path(path), source_roots)
            sources.append(_Source(index, trace, {}, scratch))
            runs = {run.rank: run for run in trace.runs}
            if not runs:
                (rank,) = trace.sql("SELECT COALESCE(MIN(rank), 0) FROM ops")[0]
                runs = {rank: _placeholder_run(rank)}
            for rank in runs:
                if rank in owner:
                    raise MergeError(f"rank {rank} is in both {owner[rank]} and {path} (merge joins the ranks of one"
                                     " distributed run; `tputrace diff A B` compares two runs)")
                owner[rank] = Path(path)
            sources[-1].runs = runs
    except BaseException:
        _close(sources)
        raise
    return sources


def _open_recovering(path: Path, source_roots: Sequence[str | Path]) -> tuple[Trace, Path | None]:
    """Open a trace; one whose writer was stopped half-way through a commit (a hot `-journal` next to
    it, which a read-only reader cannot roll back) is opened from a rolled-back copy in a scratch
    directory (returned, to be removed after the merge)."""
    journal = Path(f"{path}-journal")
    if not journal.exists() or journal.stat().st_size == 0:
        return open_trace(path, source_roots=source_roots), None
    import shutil
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="tputrace-merge-"))
    copy = scratch / path.name
    shutil.copyfile(path, copy)
    shutil.copyfile(journal, f"{copy}-journal")
    connection = sqlite3.connect(copy)
    try:
        connection.execute("SELECT COUNT(*) FROM meta").fetchall()  # reading rolls the journal back
    except sqlite3.Error as error:
        shutil.rmtree(scratch, ignore_errors=True)
        raise MergeError(f"{path} was left half-written and cannot be recovered: {error}") from None
    finally:
        connection.close()
    return open_trace(copy, source_roots=source_roots), scratch


def _placeholder_run(rank: int) -> RunInfo:
    return RunInfo(rank, None, None, (), None, None, None, None, None, None, None, None, None, None, None, None, None)


def _merge(sources: list[_Source], output: Path, expected_ranks: Iterable[int] | None, failures: dict[int, str], align: str, first_failure: str | None = None) -> MergeResult:
    runs = {rank: run for source in sources for rank, run in source.runs.items()}
    forks = {rank: origin for source in sources for rank, origin in fork_origins(source.trace.meta).items() if rank in runs}
    distributed = [rank for rank in runs if rank not in forks] or list(runs)
    world_size = max([runs[rank].world_size or 0 for rank in distributed] + [max(distributed) + 1])
    expected = sorted(set(expected_ranks) if expected_ranks is not None else set(range(world_size)))
    if expected_ranks is not None and expected:
        world_size = max(world_size, expected[-1] + 1)
    result = MergeResult(output, sorted(runs), world_size, forks=forks, first_failure=first_failure)

    known_starts = [run.start_unix_ns for run in runs.values() if run.start_unix_ns is not None]
    starts = {rank: run.start_unix_ns if run.start_unix_ns is not None else min(known_starts, default=0) for rank, run in runs.items()}
    hosts = {rank: run.host or "?" for rank, run in runs.items()}
    collectives = _load_collectives(sources, starts)
    reference_host = hosts[min(runs)]
    distinct_hosts = set(hosts.values())
    if align == "wall" or (align == "auto" and len(distinct_hosts) == 1):
        offsets = {host: 0 for host in distinct_hosts}
        result.clock = "wall clock, one host" if len(distinct_hosts) == 1 else "wall clock"
    else:
        offsets = host_offsets(collectives, hosts, reference_host)
        result.clock = f"clocks aligned on collectives (reference host {reference_host})"
    result.offsets_ns = offsets
    aligned_starts = {rank: starts[rank] - offsets[hosts[rank]] for rank in runs}
    origin = min(aligned_starts.values())
    shifts = {rank: aligned_starts[rank] - origin for rank in runs}
    aligned_rows = [
        CollectiveRow(row.key, row.rank, row.kind, row.group, row.ranks, row.start_ns - offsets[hosts[row.rank]], row.dur_ns) for row in collectives
    ]
    matched = match_collectives(aligned_rows)
    result.matched_collectives = len(matched)
    waits = wait_times(matched)
    result.waits_filled = len(waits)

    for rank in expected:
        if rank not in runs:
            result.missing[rank] = failures.get(rank, "no trace from this rank (it did not start recording, or its trace was not given)")
    for rank, run in runs.items():
        if run.end_ns is None and rank in forks:
            result.died[rank] = "its trace ends without an end record (it was killed, called os._exit off its main thread or _exit from C, or was still running when the recording ended)"
        elif run.end_ns is None:
            result.died[rank] = failures.get(rank, "its trace ends without an end record (the process was killed or crashed)")
        elif run.exit_status:
            result.failed[rank] = _failure_text(run)

    partial = output.with_name(f".{output.name}.partial")
    try:
        writer = TraceWriter(partial, rank=min(runs), created_unix_ns=origin)
        try:
            for source in sources:
                _copy_source(writer, source, shifts, waits)
            for rank, run in sorted(runs.items()):
                _write_run(writer, run, origin, shifts[rank], world_size, result.died.get(rank))
            for rank, why in sorted(result.missing.items()):
                writer.set_run(rank=rank, world_size=world_size, start_unix_ns=origin, error=f"rank {rank} is missing from this trace: {why}")
        finally:
            writer.close()
        merge_meta = {"merge": json.dumps(result.meta()), "merged_from": json.dumps([str(source.trace.path) for source in sources])}
        if forks:
            merge_meta[FORKS_META_KEY] = forks_meta(forks)
        windows = [source.trace.meta[RECORDING_WINDOW_META_KEY] for source in sources if RECORDING_WINDOW_META_KEY in source.trace.meta]
        if windows:  # the ranks of one `tputrace run --nproc` share a window: the first rank's says which steps it kept
            merge_meta[RECORDING_WINDOW_META_KEY] = windows[0]
        _write_meta(partial, merge_meta)
        partial.replace(output)
    finally:
        _remove_trace_file(partial)
    return result


def _remove_trace_file(path: Path) -> None:
    """Remove a trace file and any `-wal`/`-shm` beside it (a merge that failed leaves none of its output)."""
    for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        leftover.unlink(missing_ok=True)


def _load_collectives(sources: list[_Source], starts: Mapping[int, int]) -> list[CollectiveRow]:
    rows = []
    for source in sources:
        for rowid, rank, kind, group, ranks, start_ns, dur_ns in source.trace.sql(
            "SELECT c.rowid, c.rank, c.kind, g.text, r.text, c.start_ns, c.dur_ns FROM collectives c "
            "LEFT JOIN strings g ON g.id = c.group_sid LEFT JOIN strings r ON r.id = c.ranks_sid"
        ):
            if start_ns is None:
                continue
            rows.append(CollectiveRow((source.index, rowid), rank, kind or "", group or "", ranks or "", starts.get(rank, 0) + start_ns, dur_ns or 0))
    return rows


class _Remap:
    """Old-to-new ids of one source: strings and frames re-interned, table ids renumbered."""

    def __init__(self, writer: TraceWriter, trace: Trace) -> None:
        self.writer = writer
        self.strings = {sid: writer.intern(text) for sid, text in trace.sql("SELECT id, text FROM strings")}
        self.frames = {}
        for (frame_id,) in trace.sql("SELECT id FROM frames"):
            location = trace.frame(frame_id)  # columns in characters, whichever unit the file stored
            if location is not None:
                self.frames[frame_id] = writer.frame(location.file, location.line, location.function, location.col,
                                                     location.end_col, location.end_line)
        self.ids: dict[str, dict[int, int]] = defaultdict(dict)

    def id_in(self, table: str, old: int | None) -> int | None:
        if old is None:
            return None
        mapping = self.ids[table]
        new = mapping.get(old)
        if new is None:
            new = mapping[old] = self.writer.next_id(table)
        return new

    def ref(self, target: str, old: Any) -> Any:
        if old is None:
            return None
        if target == "strings":
            return self.strings.get(old)
        if target == "frames":
            return self.frames.get(old)
        return self.id_in(target, old)


def _copy_source(writer: TraceWriter, source: _Source, shifts: Mapping[int, int], waits: Mapping[tuple[int, int], int]) -> None:
    remap = _Remap(writer, source.trace)
    copied = 0
    for kind in RECORD_KINDS:
        if kind.table in ("strings", "frames", "runs"):
            continue
        roles = column_roles(kind)
        rank_index = roles.index("rank")
        converters = [_converter(role, kind.table, remap) for role in roles]
        append = writer.appender(kind.table)
        for key, row in _rows(source, kind):
            new_row = [convert(value, shifts.get(row[rank_index], 0)) for convert, value in zip(converters, row)]
            if key is not None and key in waits:
                new_row[_WAIT_INDEX] = waits[key]
            append(tuple(new_row))
            copied += 1
            if copied >= _FLUSH_EVERY_ROWS:
                writer.flush()
                copied = 0


_WAIT_INDEX = COLLECTIVES.column_names.index("wait_ns")


def _rows(source: _Source, kind: RecordKind) -> Iterable[tuple[tuple[int, int] | None, tuple[Any, ...]]]:
    """A table's rows in insertion order; collectives with their (input, rowid) key for the waits."""
    if kind is COLLECTIVES:
        stored = {row[1] for row in source.trace.sql("PRAGMA table_info(collectives)")}
        columns = ", ".join(name if name in stored else f"NULL AS {name}" for name in kind.column_names)
        for rowid, *row in source.trace.sql(f"SELECT rowid, {columns} FROM collectives ORDER BY rowid"):
            yield (source.index, rowid), tuple(row)
        return
    for row in source.trace.raw_records(kind.table):
        yield None, row


def _converter(role: str, table: str, remap: _Remap) -> Any:
    if role == "id":
        return lambda value, shift: remap.id_in(table, value)
    if role.startswith("ref:"):
        target = role[4:]
        return lambda value, shift: remap.ref(target, value)
    if role == "time":
        return lambda value, shift: None if value is None else value + shift
    return lambda value, shift: value


def _failure_text(run: RunInfo) -> str:
    """Why a rank that ended on its own failed: its exit status and the last line of its error."""
    status = run.exit_status or 0
    text = f"exit status {status}"
    if status > 128:
        import signal

        try:
            text += f" ({signal.Signals(status - 128).name}: stopped)"
        except ValueError:
            pass
    if run.error:
        text += f", {_exception_line(run.error)}"
    return text


def _exception_line(error: str, limit: int = 200) -> str:
    """The `Type: message` line of a formatted exception (its last one), shortened."""
    import re

    lines = error.strip().splitlines()
    line = next((line for line in reversed(lines) if re.match(r"^[A-Za-z_][\w.]*: ", line)), lines[-1] if lines else "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _write_run(writer: TraceWriter, run: RunInfo, origin: int, shift: int, world_size: int, died: str | None) -> None:
    fields = {name: getattr(run, name) for name in RUNS.column_names if name != "rank"}
    fields["argv"] = list(run.argv)
    fields["world_size"] = run.world_size or world_size
    fields["start_unix_ns"] = origin
    if run.end_ns is not None:
        fields["end_ns"] = run.end_ns + shift
    if died is not None:
        note = f"rank {run.rank} died: {died}"
        fields["error"] = note if not run.error else f"{note}\n{run.error}"
    writer.set_run(rank=run.rank, **fields)


def _write_meta(path: Path, entries: Mapping[str, str]) -> None:
    """Add keys to a closed trace's `meta` table (what the merge did and from which files)."""
    connection = sqlite3.connect(path)
    try:
        with connection:
            connection.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", entries.items())
    finally:
        connection.close()


def merge_info(trace: Trace) -> dict[str, Any] | None:
    """What `meta.merge` says about a merged trace (None for a trace that was not merged)."""
    text = trace.meta.get("merge")
    return json.loads(text) if text else None

