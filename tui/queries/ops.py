"""Ops for the TUI: ops grouped by op, op and shapes, source line or module, and one page of the ops in
a group. Groups of all ops are summed over the ops' columns (`tputrace.derived.op_columns`): a sort
of every row in SQLite's `GROUP BY` costs more than reading the columns and counting with numpy
(imported on first use, not before the first paint).
Filtered aggregates read `ops` in SQL, `NOT INDEXED`: a scan beats walking the `op_sid` index and
looking up every row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tputrace.analysis.target import DEFAULT_TARGET, target_chip
from tputrace.derived.op_ranking import rank_ops
from tputrace.store.aggregates import rank_filter
from tputrace.store.records import SourceLocation
from tputrace.tui.queries.timeline import OpTimes, times_from_columns

if TYPE_CHECKING:
    import numpy as np

    from tputrace.derived.op_ranking_columns import RankingColumns
    from tputrace.store.reader import Trace

OpGrouping = Literal["op", "op_shapes", "source", "module"]
OP_GROUPINGS: tuple[OpGrouping, ...] = ("op", "op_shapes", "source", "module")
OP_GROUPING_LABELS: dict[str, str] = {
    "op": "op",
    "op_shapes": "op + input shapes",
    "source": "source line",
    "module": "module path",
}
GroupOrder = Literal["total", "count", "mean"]
GROUP_ORDERS: tuple[GroupOrder, ...] = ("total", "count", "mean")
MAX_GROUPS = 50_000
"""At most this many aggregated rows are fetched for one grouping (a pathological trace could have more)."""
PACKED_LIMIT = 2**62
"""Two string ids are read as one number when it stays below this."""


def like_pattern(text: str) -> str:
    """A case-insensitive `LIKE ... ESCAPE '\\'` pattern that matches `text` anywhere, literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@dataclass(frozen=True)
class OpGroup:
    """Ops with one key (op, op and shapes, source line or module): count, time and share. The time is host
    dispatch without the flushes and compiles that ran inside the calls; grouped by op, `chip_share` is the op's
    share of chip time projected for the default target (None: not projected)."""

    key: tuple[Any, ...]
    label: str
    count: int
    total_ns: int
    mean_ns: float
    share: float
    source: SourceLocation | None = None
    chip_share: float | None = None


_GROUP_COLUMNS: dict[str, tuple[str, ...]] = {
    "op": ("op_sid",),
    "op_shapes": ("op_sid", "inputs_sid"),
    "source": ("frame_id",),
    "module": ("module_sid",),
}


def _text_filter(group_by: OpGrouping, text: str) -> tuple[str, tuple[Any, ...]]:
    """SQL matching ops whose group label contains `text` (case-insensitive, literal)."""
    pattern = like_pattern(text)
    matching_strings = "SELECT id FROM strings WHERE text LIKE ? ESCAPE '\\'"
    if group_by == "op":
        return f"op_sid IN ({matching_strings})", (pattern,)
    if group_by == "op_shapes":
        return f"(op_sid IN ({matching_strings}) OR inputs_sid IN ({matching_strings}))", (pattern, pattern)
    if group_by == "module":
        return f"module_sid IN ({matching_strings})", (pattern,)
    return (
        "frame_id IN (SELECT frames.id FROM frames JOIN strings AS file ON file.id = frames.file_sid "
        "JOIN strings AS function ON function.id = frames.function_sid "
        "WHERE file.text LIKE ? ESCAPE '\\' OR function.text LIKE ? ESCAPE '\\' "
        "OR (file.text || ':' || frames.line) LIKE ? ESCAPE '\\')",
        (pattern, pattern, pattern),
    )


def ops_total_ns(trace: Trace, rank: int) -> int:
    """The host dispatch of all ops of `rank`, without the flushes and compiles that ran inside them (what an op
    group's share is a share of)."""
    from tputrace.derived.op_columns import read_op_columns

    read = read_op_columns(trace, rank, {"start": "start_ns", "dur": "COALESCE(dur_ns, 0)"})
    if read is not None:
        return int(_own_durations(trace, rank, read["start"], read["dur"]).sum())
    where, params = rank_filter(rank)
    rows = trace.sql(f"SELECT start_ns, COALESCE(dur_ns, 0) FROM ops NOT INDEXED{where}", params)
    return int(_own_durations(trace, rank, *_columns(rows, 2)).sum())


def _columns(rows: Sequence[tuple[Any, ...]], count: int) -> list[np.ndarray]:
    """`count` int64 columns of `rows` (NULL as `NULL_VALUE`)."""
    import numpy as np

    from tputrace.derived.op_columns import NULL_VALUE

    return [np.array([NULL_VALUE if row[index] is None else row[index] for row in rows], dtype=np.int64)
            for index in range(count)]


def _own_durations(trace: Trace, rank: int, starts: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """Each op's host dispatch without the flushes and compiles that ran inside the call, as the summary and the
    grouping by op count it (`tputrace.derived.op_ranking`): an optimizer's first `step()` holds its state's flush
    and compile, which are not the op's dispatch."""
    from tputrace.derived.op_ranking import nested_intervals
    from tputrace.derived.op_ranking_columns import nested_ns_of_calls

    return durations - nested_ns_of_calls(starts, durations, nested_intervals(trace, rank))


def op_groups(trace: Trace, group_by: OpGrouping, rank: int, text: str = "", *, all_ns: int | None = None) -> list[OpGroup]:
    """Ops of `rank` grouped by `group_by` (optionally only groups whose label contains `text`), biggest total first.

    `share` is of all ops' time on the rank (`all_ns`; computed when not given), filter or not.
    """
    if group_by not in _GROUP_COLUMNS:
        raise ValueError(f"unknown op grouping {group_by!r}")
    if group_by == "op":
        return ranked_op_groups(trace, rank, text)
    rows_by = None if text else _summed_groups(trace, [group_by], rank)
    if rows_by is not None:
        return _groups(trace, group_by, rank, rows_by[group_by], all_ns)
    columns = ", ".join(_GROUP_COLUMNS[group_by])
    where, params = rank_filter(rank)
    if text:
        if all_ns is None:
            all_ns = ops_total_ns(trace, rank)
        match_sql, match_params = _text_filter(group_by, text)
        where, params = f"{where} AND {match_sql}" if where else f" WHERE {match_sql}", params + match_params
    key_count = len(_GROUP_COLUMNS[group_by])
    matching = trace.sql(f"SELECT {columns}, start_ns, COALESCE(dur_ns, 0) FROM ops NOT INDEXED{where}", params)
    *keys, starts, durations = _columns(matching, key_count + 2)
    summed = _group_rows(dict(zip(_GROUP_COLUMNS[group_by], keys)), [group_by], _own_durations(trace, rank, starts, durations))
    return _groups(trace, group_by, rank, summed[group_by], all_ns)


def op_groups_by(trace: Trace, groupings: Sequence[OpGrouping], rank: int,
                 durations: np.ndarray | None = None) -> dict[OpGrouping, list[OpGroup]]:
    """`op_groups` for each of `groupings` (all ops, no filter), from one read of the ops' columns.
    `durations`: the rank's op durations in file order (NULL as 0), when read already (`OpsRead.durs_ns`)."""
    unranked = [grouping for grouping in groupings if grouping != "op"]
    rows_by = _summed_groups(trace, unranked, rank, durations) if unranked else {}
    groups: dict[OpGrouping, list[OpGroup]] = {}
    for grouping in groupings:
        rows = rows_by.get(grouping) if rows_by is not None else None
        groups[grouping] = op_groups(trace, grouping, rank) if rows is None else _groups(trace, grouping, rank, rows, None)
    return groups


def _summed_groups(trace: Trace, groupings: Sequence[OpGrouping], rank: int,
                   durations: np.ndarray | None = None) -> dict[OpGrouping, list[tuple[Any, ...]]] | None:
    """`op_groups`' rows (key columns, count, total ns) per grouping, biggest total first, at most
    `MAX_GROUPS`, summed over the ops' columns; None where they cannot be read as integers. The key
    columns (string and frame ids) are read packed, as many in one number as fit."""
    import numpy as np

    from tputrace.derived.op_columns import NULL_VALUE, packed_ids_sql, read_op_columns

    (high_sid,), = trace.sql("SELECT MAX(id) FROM strings")
    (high_frame,), = trace.sql("SELECT MAX(id) FROM frames")
    width = max(high_sid or 0, high_frame or 0) + 2  # ids below width - 1, and width - 1 for NULL
    key_columns = list(dict.fromkeys(column for grouping in groupings for column in _GROUP_COLUMNS[grouping]))
    per_pack = 1
    while per_pack < len(key_columns) and width ** (per_pack + 1) < PACKED_LIMIT:
        per_pack += 1
    packs = [key_columns[start:start + per_pack] for start in range(0, len(key_columns), per_pack)]
    expressions = {f"pack{index}": packed_ids_sql(pack, width) for index, pack in enumerate(packs)}
    if durations is None:
        expressions["dur"] = "COALESCE(dur_ns, 0)"
        expressions["start"] = "start_ns"
    read = read_op_columns(trace, rank, expressions)
    if read is None or any((read[f"pack{index}"] == NULL_VALUE).any() for index in range(len(packs))):
        return None
    if durations is None:
        durations = _own_durations(trace, rank, read["start"], read["dur"])
    elif len(durations) != len(read["pack0"]):
        return None
    columns: dict[str, np.ndarray] = {}
    for index, pack in enumerate(packs):
        for position, column in enumerate(pack):
            ids = read[f"pack{index}"] // width ** (len(pack) - 1 - position) % width
            columns[column] = np.where(ids == width - 1, NULL_VALUE, ids)
    return _group_rows(columns, groupings, durations)


def _group_rows(columns: dict[str, np.ndarray], groupings: Sequence[OpGrouping], durations: np.ndarray) -> dict[OpGrouping, list[tuple[Any, ...]]]:
    """Per grouping, the rows SQL's `GROUP BY` of its key columns would give: key values (NULL as None),
    count and total ns, biggest total first (ties: first seen), at most `MAX_GROUPS`."""
    import numpy as np

    from tputrace.derived.op_columns import NULL_VALUE, dense_codes, pair_codes, sums_by

    codes = {column: dense_codes(values)[1] for column, values in columns.items()}
    rows_by: dict[OpGrouping, list[tuple[Any, ...]]] = {}
    for grouping in groupings:
        key_columns = _GROUP_COLUMNS[grouping]
        group_of = codes[key_columns[0]]
        for column in key_columns[1:]:
            group_of = pair_codes(group_of, codes[column])
        size = int(group_of.max()) + 1 if len(group_of) else 0
        first_of_group = np.zeros(size, dtype=np.int64)
        first_of_group[group_of] = np.arange(len(group_of))  # any op of a group stands for its key
        counts = np.bincount(group_of, minlength=size)
        totals = sums_by(group_of, durations, size)
        order = np.lexsort((np.arange(size), -totals))[:MAX_GROUPS]
        keys = [[None if value == NULL_VALUE else value for value in columns[column][first_of_group[order]].tolist()]
                for column in key_columns]
        rows_by[grouping] = [(*key, count, total) for *key, count, total in zip(*keys, counts[order].tolist(), totals[order].tolist())]
    return rows_by


@dataclass(frozen=True)
class OpsRead:
    """What one read of a rank's ops' columns gives: the groups by op (ranked) and by op and input shapes,
    and the ops' times for the Timeline (None where the columns could not be read)."""

    by_op: list[OpGroup]
    by_op_shapes: list[OpGroup]
    times: OpTimes | None
    durs_ns: np.ndarray | None = None  # every op's own dispatch (`_own_durations`), in file order: `op_groups_by` needs no second read


def ops_read(trace: Trace, rank: int) -> OpsRead:
    """The Ops view's first two groupings and the Timeline's op times from one read of the ops' columns
    (`tputrace.derived.op_ranking_columns.read_ranking_columns`)."""
    from tputrace.derived.op_ranking_columns import read_ranking_columns

    read = read_ranking_columns(trace, rank, chip=True)
    by_op = ranked_op_groups(trace, rank, columns=read)
    if read is None:
        return OpsRead(by_op, op_groups(trace, "op_shapes", rank), None)
    key, start, dur = read.columns["key"], read.columns["start"], read.columns["dur"]
    own = _own_durations(trace, rank, start, dur)
    rows = _group_rows({"op_sid": read.ids(key, 0), "inputs_sid": read.ids(key, 1)}, ["op_shapes"], own)["op_shapes"]
    return OpsRead(by_op, _groups(trace, "op_shapes", rank, rows, None), times_from_columns(trace, rank, start, dur), own)


def _groups(trace: Trace, group_by: OpGrouping, rank: int, rows: Sequence[tuple[Any, ...]], all_ns: int | None) -> list[OpGroup]:
    if all_ns is None:  # unfiltered and uncapped groups add up to all ops: no second scan
        all_ns = sum(row[-1] for row in rows) if len(rows) < MAX_GROUPS else ops_total_ns(trace, rank)
    groups = []
    for row in rows:
        key, (count, total_ns) = tuple(row[:-2]), row[-2:]
        source = None
        if group_by == "op":
            label = trace.string(key[0]) or "?"
        elif group_by == "op_shapes":
            label = f"{trace.string(key[0]) or '?'}({trace.string(key[1]) or ''})"
        elif group_by == "module":
            label = trace.string(key[0]) or "(no module)"
        else:
            source = trace.frame(key[0])
            label = str(source) if source else "(no source)"
        groups.append(OpGroup(key, label, count, total_ns, total_ns / count if count else 0.0, total_ns / all_ns if all_ns else 0.0, source))
    return groups


def ranked_op_groups(trace: Trace, rank: int, text: str = "", *, columns: RankingColumns | None = None) -> list[OpGroup]:
    """Ops of `rank` grouped by op as the summary ranks them (`tputrace.derived.op_ranking`): host
    dispatch without nested flushes and compiles, and chip time share on the default target; optionally
    only ops whose name contains `text` (case-insensitive, literal). `columns`: the ops' columns, when read already."""
    ranking = rank_ops(trace, rank, target_chip(DEFAULT_TARGET), columns)
    sids = _op_sids(trace, rank, [op.op for op in ranking.ops])
    wanted = text.casefold()
    return [
        OpGroup((sids.get(op.op),), op.op, op.calls, op.self_dispatch_ns, op.self_dispatch_ns / op.calls if op.calls else 0.0,
                op.self_dispatch_share, None, op.chip_share if op.projected else None)
        for op in ranking.ops if wanted in op.op.casefold()
    ]


def _op_sids(trace: Trace, rank: int, names: Sequence[str]) -> dict[str, int]:
    """The string id of each op name (of those ids, the one `rank`'s ops use where a name was interned twice)."""
    ids_by_name: dict[str, list[int]] = {}
    for start in range(0, len(names), 500):
        chunk = names[start:start + 500]
        for sid, name in trace.sql(f"SELECT id, text FROM strings WHERE text IN ({', '.join('?' * len(chunk))}) ORDER BY id", chunk):
            ids_by_name.setdefault(name, []).append(sid)
    sids = {}
    for name, ids in ids_by_name.items():
        used = [sid for sid in ids if len(ids) == 1 or trace.sql("SELECT 1 FROM ops WHERE op_sid = ? AND rank = ? LIMIT 1", (sid, rank))]
        if used:
            sids[name] = used[-1]
    return sids


def filter_groups(groups: Sequence[OpGroup], text: str) -> list[OpGroup] | None:
    """The groups whose label contains `text` (case-insensitive, literal), from groups already
    aggregated: no scan of the ops. None when `groups` were capped at `MAX_GROUPS` (groups past the
    cap could match: `op_groups(..., text)` filters in SQL then)."""
    if len(groups) >= MAX_GROUPS:
        return None
    wanted = text.casefold()
    return [group for group in groups if wanted in group.label.casefold()]


def sort_groups(groups: Sequence[OpGroup], order: GroupOrder) -> list[OpGroup]:
    """`groups` biggest first by total time, count or mean time (ties: label)."""
    if order == "count":
        return sorted(groups, key=lambda group: (-group.count, group.label))
    if order == "mean":
        return sorted(groups, key=lambda group: (-group.mean_ns, group.label))
    return sorted(groups, key=lambda group: (-group.total_ns, group.label))


@dataclass(frozen=True)
class OpInstance:
    """One dispatched op."""

    seq: int
    step: int
    chip: int
    start_ns: int
    dur_ns: int
    op: str
    inputs: str
    outputs: str
    source: SourceLocation | None
    module: str | None
    flush_id: int | None


def op_instances(
    trace: Trace, group_by: OpGrouping, key: tuple[Any, ...], rank: int, *, offset: int = 0, limit: int = 200
) -> list[OpInstance]:
    """One page of the ops in a group, longest first."""
    conditions = " AND ".join(f"{column} IS ?" for column in _GROUP_COLUMNS[group_by])
    rows = trace.sql(
        "SELECT seq, step, chip, start_ns, dur_ns, op_sid, inputs_sid, outputs_sid, frame_id, module_sid, flush_id "
        f"FROM ops WHERE rank = ? AND {conditions} ORDER BY dur_ns DESC, seq LIMIT ? OFFSET ?",
        (rank, *key, int(limit), int(offset)),
    )
    return [
        OpInstance(seq, step, chip, start_ns, dur_ns or 0, trace.string(op_sid) or "?", trace.string(inputs_sid) or "",
                   trace.string(outputs_sid) or "", trace.frame(frame_id), trace.string(module_sid), flush_id)
        for seq, step, chip, start_ns, dur_ns, op_sid, inputs_sid, outputs_sid, frame_id, module_sid, flush_id in rows
    ]

