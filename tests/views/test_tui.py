"""The terminal UI: its headless queries, formatting and action registry, the app driven with Textual's
Pilot over the committed fixtures (tests/fixtures/make_tui_fixture.py), and `tputrace tui` on bad files."""

from __future__ import annotations

import asyncio
import html
import re
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import tputrace
from fixtures.make_traces import BROKEN_TRACE_MESSAGES, build_broken_traces
from fixtures.make_tui_fixture import (
    MARKUP_DIFF,
    MARKUP_FILE,
    MARKUP_FUNCTION,
    MARKUP_MODULE,
    MARKUP_OP,
    MARKUP_SHAPES,
    MARKUP_TRACE,
    SMALL_TRACE,
    SOURCE_ROOT,
    make_session,
    settle,
)
from tputrace.cli.main import main
from tputrace.derived.steps import step_rows
from tputrace.tui import queries
from tputrace.tui.queries import timeline as timeline_queries
from tputrace.tui.actions import ACTIONS, ACTIONS_BY_ID, LETTER_KEYS, VIEW_ORDER, parse_keymap, view_key
from tputrace.tui.render import ChartBar, StepChart, fmt_bytes, fmt_ns, shade_row, share_bar

REPO_ROOT = Path(__file__).resolve().parents[2]
SIZE = (130, 40)


@pytest.fixture(scope="module")
def small() -> Any:
    with tputrace.open(SMALL_TRACE) as trace:
        yield trace


# -- helpers ------------------------------------------------------------------------------------


def screen_lines(app: Any) -> list[str]:
    """What the terminal shows, one string per line (from the app's SVG screenshot)."""
    rows: dict[int, list[tuple[float, str]]] = {}
    svg = app.export_screenshot()
    for match in re.finditer(r'<text [^>]*x="([\d.]+)"[^>]*clip-path="url\(#terminal-\d+-line-(\d+)\)">([^<]*)</text>', svg):
        rows.setdefault(int(match.group(2)), []).append((float(match.group(1)), html.unescape(match.group(3)).replace("\xa0", " ")))
    return ["".join(text for _, text in sorted(parts)) for _, parts in sorted(rows.items())]


def rows_by_key(app: Any, selector: str) -> list[dict[str, str]]:
    """A table's rows as {column key: cell text} (for tables whose columns depend on the data)."""
    table = app.screen.query_one(selector)
    keys = [str(key.value) for key in table.columns]
    return [dict(zip(keys, row)) for row in table_rows(app, selector)]


def screen_text(app: Any) -> str:
    return "\n".join(screen_lines(app))


def table_rows(app: Any, selector: str) -> list[list[str]]:
    table = app.screen.query_one(selector)
    return [[str(getattr(cell, "plain", cell)) for cell in table.get_row_at(index)] for index in range(table.row_count)]


def run_app(scenario: Callable[[Any], Awaitable[None]], *, session: Any = None, size: tuple[int, int] = SIZE, **app_options: Any) -> None:
    """Run the app headless on the small fixture (or `session`), settle, then run `scenario(pilot)`."""
    from tputrace.tui.app import TraceApp

    async def drive() -> None:
        app = TraceApp(session or make_session(), **app_options)
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            await scenario(pilot)

    asyncio.run(drive())


async def press(pilot: Any, *keys: str) -> None:
    await pilot.press(*keys)
    await settle(pilot)


# -- headless parts -----------------------------------------------------------------------------


def test_headless_modules_never_import_textual() -> None:
    code = textwrap.dedent(
        """
        import sys
        import tputrace.tui, tputrace.tui.queries, tputrace.tui.session
        heavy = sorted(name for name in sys.modules if name.split(".")[0] in ("textual", "torch", "jax"))
        print(",".join(heavy))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == ""


def test_op_groups_add_up_and_sort(small: Any) -> None:
    groups = queries.op_groups(small, "op", 0)
    (count, total), = small.sql("SELECT COUNT(*), SUM(dur_ns) FROM ops WHERE rank = 0")
    assert sum(group.count for group in groups) == count
    assert sum(group.total_ns for group in groups) == total
    assert abs(sum(group.share for group in groups) - 1.0) < 1e-9
    assert [group.total_ns for group in groups] == sorted((group.total_ns for group in groups), reverse=True)
    by_count = queries.sort_groups(groups, "count")
    assert [group.count for group in by_count] == sorted((group.count for group in groups), reverse=True)
    for grouping in queries.OP_GROUPINGS:
        assert sum(group.count for group in queries.op_groups(small, grouping, 0)) == count


def test_op_filter_is_literal_and_case_insensitive(small: Any) -> None:
    matching = queries.op_groups(small, "op", 0, "ADDMM")
    assert [group.label for group in matching] == ["aten.addmm.default"]
    assert queries.op_groups(small, "op", 0, "%") == []
    assert queries.op_groups(small, "op", 0, "_") != []  # '_' appears literally in op names
    assert all("_" in group.label for group in queries.op_groups(small, "op", 0, "_"))
    sources = queries.op_groups(small, "source", 0, "model.py:52")
    assert [group.source.line for group in sources if group.source] == [52]
    assert queries.like_pattern("a%b_c\\") == "%a\\%b\\_c\\\\%"


def test_filtering_aggregated_groups_matches_the_sql_filter(small: Any) -> None:
    for grouping, text in (("op", "ADDMM"), ("op", "_"), ("op", "%"), ("op_shapes", "f32[8"), ("source", "model.py:52")):
        groups = queries.op_groups(small, grouping, 0)
        in_python = queries.filter_groups(groups, text)
        assert in_python is not None
        assert [group.label for group in in_python] == [group.label for group in queries.op_groups(small, grouping, 0, text)]
        assert [group.share for group in in_python] == [group.share for group in queries.op_groups(small, grouping, 0, text)]
    capped = [queries.OpGroup((index,), f"op{index}", 1, 1, 1.0, 0.0) for index in range(queries.MAX_GROUPS)]
    assert queries.filter_groups(capped, "op1") is None  # groups past the cap could match: the view asks SQL


def test_session_keeps_groups_and_analyses_each_rank() -> None:
    session = make_session()
    try:
        by_op = session.op_groups(0, "op")
        assert session.op_groups(0, "op") is by_op
        assert [group.label for group in session.op_groups(0, "op", "addmm")] == ["aten.addmm.default"]
        one_connection = queries.load_findings(session.trace, 1)
        two_connections = session.findings(1)
        assert [finding.title for finding in two_connections.findings] == [finding.title for finding in one_connection.findings]
        if not two_connections.unavailable:
            assert [finding.title for finding in session.findings(0).findings] != [finding.title for finding in two_connections.findings]
    finally:
        session.close()
        session.trace.close()


def test_op_instances_page_longest_first(small: Any) -> None:
    group = queries.op_groups(small, "op", 0)[0]
    first = queries.op_instances(small, "op", group.key, 0, limit=10)
    second = queries.op_instances(small, "op", group.key, 0, offset=10, limit=10)
    durations = [op.dur_ns for op in first + second]
    assert durations == sorted(durations, reverse=True)
    assert {op.op for op in first} == {group.label}
    assert not {op.seq for op in first} & {op.seq for op in second}


def test_compile_rows_show_old_and_new_signature(small: Any) -> None:
    rows = queries.compile_rows(small, 0)
    recompile = next(row for row in rows if row.reason == "recompile")
    assert recompile.diff == "input 0 dim 1: 128 -> 192"
    assert recompile.old_signature is not None and "128" in recompile.old_signature
    assert "192" in recompile.signature
    assert rows[0].old_signature is None and rows[0].old_id is None
    assert recompile.old_relation == "structure" and recompile.old_id == rows[0].id
    sites = queries.compile_sites(small, 0)
    assert sum(site.count for site in sites) == len(rows)
    assert any(site.recompiles for site in sites)


def test_a_recompile_whose_structure_changed_compares_with_the_last_compile_at_its_call_site(tmp_path: Path) -> None:
    from fixtures.make_traces import START_UNIX_NS
    from tputrace.store.writer import TraceWriter

    path = tmp_path / "structure.tptrace"
    with TraceWriter(path, created_unix_ns=START_UNIX_NS) as writer:
        writer.set_run(world_size=1, script="/w/train.py", argv=[], cwd="/w", host="h", platform="tpu", chips=1,
                       eager_mode="DEFER_AND_FUSE", start_unix_ns=START_UNIX_NS)
        here, elsewhere = writer.frame("/w/train.py", 12, "step"), writer.frame("/w/train.py", 30, "evaluate")
        for index, (structure, frame, reason) in enumerate(
            (("A", here, "first"), ("X", elsewhere, "first"), ("B", here, "recompile")), start=1
        ):
            program_id = writer.next_id("programs")
            writer.append("programs", (program_id, 0, "fused", writer.intern(f"fused_{structure}"), writer.intern(structure),
                                       writer.intern(f"f32[{index}]"), 1, 0.0, 0.0, 1))
            writer.append("compiles", (writer.next_id("compiles"), 0, program_id, "fused", writer.intern(f"fused_{structure}"),
                                       writer.intern(f"f32[{index}]"), 0, index * 1_000, 500, frame, 0, reason,
                                       writer.intern("structure change at op 0: a -> b") if reason == "recompile" else None, None))
        writer.append("steps", (0, 0, 0, 10_000, "explicit"))
        writer.update_run(end_ns=10_000, exit_status=0)
    with tputrace.open(path) as trace:
        first, other, recompile = queries.compile_rows(trace, 0)
    assert (first.old_id, other.old_id) == (None, None)
    assert (recompile.old_id, recompile.old_relation, recompile.old_name, recompile.old_signature) == (
        first.id, "call site", "fused_A", "f32[1]")


def test_the_overview_counts_the_loops_steps_without_the_end_step(tmp_path: Path) -> None:
    """Three optimizer steps, then an evaluation recorded as the trailing `end` step: the overview says 3 steps
    (as the script ran them and the report counts them) and charts three bars; the timeline keeps all four."""
    from fixtures.make_traces import START_UNIX_NS
    from tputrace.store.writer import TraceWriter

    path = tmp_path / "end_step.tptrace"
    with TraceWriter(path, created_unix_ns=START_UNIX_NS) as writer:
        writer.set_run(world_size=1, script="/w/train.py", argv=[], cwd="/w", host="h", platform="tpu", chips=1,
                       eager_mode="DEFER_AND_FUSE", start_unix_ns=START_UNIX_NS)
        for step in range(3):
            writer.append("steps", (0, step, step * 20_000_000, (step + 1) * 20_000_000, "optimizer"))
        writer.append("steps", (0, 3, 60_000_000, 560_000_000, "end"))
        writer.update_run(end_ns=560_000_000, exit_status=0)
    with tputrace.open(path) as trace:
        assert [row.in_loop for row in step_rows(trace, 0)] == [True, True, True, False]

    async def scenario(pilot: Any) -> None:
        text = screen_text(pilot.app)
        assert "3 steps · median 20.0 ms" in text and "4 steps" not in text

    run_app(scenario, session=make_session(path))


def test_the_overviews_median_step_is_the_reports(tmp_path: Path) -> None:
    """A slow first (compiling) step, then four steady ones: the overview's median step leaves the warm-up step
    out, as the report and the summary do, instead of giving a median the other views never show."""
    from fixtures.make_traces import START_UNIX_NS
    from tputrace.analysis import analyze_path
    from tputrace.analysis.render import render_text
    from tputrace.store.writer import TraceWriter

    path = tmp_path / "warm_up.tptrace"
    durations_ms = [900, 10, 20, 40, 50]
    with TraceWriter(path, created_unix_ns=START_UNIX_NS) as writer:
        writer.set_run(world_size=1, script="/w/train.py", argv=[], cwd="/w", host="h", platform="tpu", chips=1,
                       eager_mode="DEFER_AND_FUSE", start_unix_ns=START_UNIX_NS)
        clock = 0
        for step, duration_ms in enumerate(durations_ms):
            writer.append("steps", (0, step, clock, clock + duration_ms * 1_000_000, "optimizer"))
            clock += duration_ms * 1_000_000
        writer.update_run(end_ns=clock, exit_status=0)
    assert "median step 30.0 ms" in render_text(analyze_path(path))

    async def scenario(pilot: Any) -> None:
        assert "5 steps · median 30.0 ms" in screen_text(pilot.app)

    run_app(scenario, session=make_session(path))


ONE_STEP_SCRIPT = """\
import torch
from torch import nn

model = nn.Linear(4, 2).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for rows in (2, 3):  # the second forward and backward is a recompile for 3 rows
    model(torch.ones(rows, 4).to("tpu")).sum().backward()
    if rows == 2:
        optimizer.step()
"""


def test_the_overview_words_counts_of_one_in_the_singular(tmp_path: Path) -> None:
    """A real run on 1 chip with 1 step and 1 recompile: the overview says "1 chip", "1 step", "1 recompile"."""
    pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")
    pytest.importorskip("jax", reason="recording a run needs jax (pip install -e .[backend])")
    script = tmp_path / "one_step.py"
    script.write_text(ONE_STEP_SCRIPT)
    trace_path = tmp_path / "one_step.tptrace"
    completed = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace_path), str(script)],
                               capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    with tputrace.open(trace_path) as trace:
        stats = trace.compile_stats(rank=0)
        assert (trace.run.chips, stats.recompiles) == (1, 1)
        assert sum(row.in_loop for row in step_rows(trace, 0)) == 1

    async def scenario(pilot: Any) -> None:
        text = screen_text(pilot.app)
        assert "1 chip" in text and "1 step ·" in text and "1 recompile)" in text, text
        assert not re.search(r"\b1 (chips|steps|recompiles|compiles|ops)\b", text), text

    run_app(scenario, session=make_session(trace_path))


def test_flushes_and_their_contents(small: Any) -> None:
    triggers = {stat.trigger: stat for stat in queries.flush_triggers(small, 0)}
    assert set(triggers) == {"item", "step", "tolist"}
    flushes = queries.flush_rows(small, 0)
    assert len(flushes) == sum(stat.count for stat in triggers.values())
    longest = queries.flush_rows(small, 0, order="duration")
    assert [flush.dur_ns for flush in longest] == sorted((flush.dur_ns for flush in flushes), reverse=True)
    contents = queries.flush_contents(small, flushes[0].id, flushes[0].program_id, 0)
    assert len(contents.ops) == flushes[0].n_ops
    assert contents.fusions and all(fusion.kind.startswith("k") for fusion in contents.fusions)
    capped = queries.flush_contents(small, flushes[0].id, flushes[0].program_id, 0, limit=5)
    assert len(capped.ops) == 5 and capped.more_ops == flushes[0].n_ops - 5


def test_collectives_per_kind_and_rank(small: Any) -> None:
    groups = queries.collective_groups(small, 0)
    assert {group.kind for group in groups} == {"all_reduce", "broadcast"}
    ranks = queries.collective_ranks(small)
    assert [row.rank for row in ranks] == [0, 1]
    assert sum(group.count for group in groups) == ranks[0].count


def test_timeline_lanes_are_bucketed_busy_fractions(small: Any) -> None:
    steps = step_rows(small, 0)
    step = steps[1]
    lanes = {row.lane.name: row for row in queries.timeline_lanes(small, 0, step.start_ns, step.end_ns, 50)}
    assert {"dispatch", "compile", "syncs", "tpu:0 exec"} <= set(lanes)
    for row in lanes.values():
        assert len(row.busy) == 50 and all(0.0 <= value <= 1.0 + 1e-9 for value in row.busy)
    (ops_in_step,) = small.sql("SELECT COUNT(*) FROM ops WHERE rank = 0 AND start_ns < ? AND start_ns + dur_ns >= ?", (step.end_ns, step.start_ns))[0]
    assert lanes["dispatch"].lane.events == ops_in_step
    bucket_ns = -(-(step.end_ns - step.start_ns) // 50)
    (dispatch_ns,) = small.sql(
        "SELECT SUM(MIN(start_ns + dur_ns, ?) - MAX(start_ns, ?)) FROM ops WHERE rank = 0 AND start_ns < ? AND start_ns + dur_ns >= ?",
        (step.end_ns, step.start_ns, step.end_ns, step.start_ns),
    )[0]
    assert abs(sum(lanes["dispatch"].busy) * bucket_ns - dispatch_ns) < 1
    events = queries.window_events(small, 0, step.start_ns, step.end_ns, limit=5)
    assert len(events) == 5 and [event.dur_ns for event in events] == sorted((event.dur_ns for event in events), reverse=True)


def test_bucket_busy_carries_long_events_forward() -> None:
    busy, events = timeline_queries._bucket_busy([(0, 250, 1), (3, 50, 2)], 5, 100)
    assert busy == (1.0, 1.0, 0.5, 0.5, 0.0) and events == 3


def test_source_stats_and_resolution(small: Any) -> None:
    files = {stat.file: stat for stat in queries.source_stats(small, 0)}
    train = files["/home/user/proj/train.py"]
    assert train.lines[35].syncs == 6 and train.lines[35].compiles == 2
    (ops_total,) = small.sql("SELECT COUNT(*) FROM ops WHERE rank = 0")[0]
    assert sum(stat.ops for stat in files.values()) == ops_total
    from_groups = queries.source_stats(small, 0, queries.op_groups(small, "source", 0))
    assert [(stat.file, stat.lines) for stat in from_groups] == [(stat.file, stat.lines) for stat in files.values()]
    assert queries.resolve_source("/home/user/proj/train.py", [str(SOURCE_ROOT)]) == SOURCE_ROOT / "proj" / "train.py"
    assert queries.resolve_source("/home/user/proj/missing.py", [str(SOURCE_ROOT)]) is None


def test_findings_are_loaded_or_said_unavailable(small: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    result = queries.load_findings(small)
    assert result.unavailable is None or result.unavailable.startswith("diagnoses unavailable")
    import tputrace.analysis as analysis

    monkeypatch.delattr(analysis, "analyze", raising=False)
    unavailable = queries.load_findings(small)
    assert unavailable.findings == () and unavailable.unavailable.startswith("diagnoses unavailable")


def test_formatting() -> None:
    assert [fmt_ns(value) for value in (812, 12_345, 4_560_000, 1_200_000_000, 250e9)] == ["812 ns", "12.3 µs", "4.56 ms", "1.20 s", "250 s"]
    assert fmt_bytes(3 * 1024 * 1024) == "3.00 MiB"
    assert share_bar(0.5, 4).plain == "██  "
    assert shade_row([0.0, 0.01, 0.5, 1.0]).plain == " ░▒█"
    chart = StepChart([ChartBar(1000.0, True, "step 0"), ChartBar(10.0, False, "step 1"), ChartBar(9.0, False, "step 2")], height=3)
    assert chart.scale(chart.bars) == 10.0  # the compiling step would flatten the others: it is clipped
    storm = [ChartBar(1000.0 + step, True) for step in range(12)] + [ChartBar(300.0, False)]
    assert StepChart(storm).scale(storm) == 1011.0  # clipping would leave one bar readable: none is clipped
    assert "▲" in chart.lines(40)[0].plain and chart.lines(40)[-1].plain.count("c") == 1
    legend = chart.legend(40)
    assert legend is not None
    assert legend.plain == "▲ clipped at 10 ns, the slowest step without a compile: step 0 took 1.00 µs (compiled) · c: the step compiled"
    many = StepChart([ChartBar(1000.0 + step, True, f"step {step}") for step in range(5)] + [ChartBar(10.0, False, f"step {step}") for step in range(5, 40)])
    many_legend = many.legend(80)
    assert many_legend is not None and many_legend.plain.startswith(
        "▲ clipped at 10 ns, the slowest step without a compile: step 4 took 1.00 µs (compiled), step 3 took 1.00 µs (compiled), "
        "step 2 took 1.00 µs (compiled) and 2 more")
    storm_legend = StepChart(storm).legend(40)
    assert storm_legend is not None and storm_legend.plain == "c: the step compiled"  # nothing clipped


def test_action_registry() -> None:
    assert len(ACTIONS_BY_ID) == len(ACTIONS)
    assert [ACTIONS_BY_ID[f"view.{view_id}"].keys for view_id, _ in VIEW_ORDER] == [
        str(index % 10) if index <= 10 else LETTER_KEYS[VIEW_ORDER[index - 1][0]] for index in range(1, len(VIEW_ORDER) + 1)]
    assert parse_keymap(["view.ops=o", " app.quit = ctrl+q "]) == {"view.ops": "o", "app.quit": "ctrl+q"}
    with pytest.raises(ValueError, match="no action with id"):
        parse_keymap(["view.nope=x"])
    with pytest.raises(ValueError, match="ID=KEYS"):
        parse_keymap(["view.ops"])


def test_text_columns_read_in_sql_show_escape_sequences_as_text(tmp_path: Path) -> None:
    """The views' own SQL reads TEXT columns (a step's source, a flush's trigger, a compile's kind and reason,
    a collective's or sync's kind) that a trace from someone else may fill with escape sequences: they come
    back written as `\\x1b`, as the reader's own records give them, never as the control character."""
    import shutil
    import sqlite3

    path = tmp_path / "escapes.tptrace"
    shutil.copyfile(SMALL_TRACE, path)
    hostile = "\x1b]0;pwned\x07\x1b[2J"
    with sqlite3.connect(path) as connection:
        for table, column in (("steps", "source"), ("flushes", "trigger"), ("compiles", "kind"), ("compiles", "reason"),
                              ("collectives", "kind"), ("syncs", "kind")):
            assert connection.execute(f"UPDATE {table} SET {column} = ?", (hostile,)).rowcount, table
    connection.close()
    with tputrace.open(path) as trace:
        compile_row = queries.compile_rows(trace, 0)[0]
        shown = [
            step_rows(trace, 0)[0].source, queries.flush_triggers(trace, 0)[0].trigger,
            queries.flush_rows(trace, 0)[0].trigger, compile_row.kind, compile_row.reason,
            queries.collective_groups(trace, 0)[0].kind,
            *(event.label for event in queries.window_events(trace, 0, 0, trace.wall_ns(), limit=1000)
              if event.lane in ("syncs", "collectives")),
        ]
    assert len(shown) > 6 and all("\x1b" not in text and "\\x1b]0;pwned\\x07" in text for text in shown), shown


# -- the app, driven with Pilot -----------------------------------------------------------------


def test_overview_shows_the_run() -> None:
    async def scenario(pilot: Any) -> None:
        text = screen_text(pilot.app)
        assert "/home/user/proj/train.py --steps 6" in text
        assert "rank 0 of 2" in text and "6 steps" in text
        assert "Where the time went" in text and "compile" in text and "program execution" in text
        assert "c───" in text  # compile steps are marked under the step chart
        findings = pilot.app.session.findings()
        if findings.unavailable:
            assert findings.unavailable in text
        else:
            assert findings.findings[0].title[:40] in text

    run_app(scenario)


def test_number_keys_switch_views_and_load_them() -> None:
    async def scenario(pilot: Any) -> None:
        tabs = pilot.app.query_one("#views")
        for index, (view_id, _) in enumerate(VIEW_ORDER, start=1):
            if view_id == "compare":  # only with a baseline run (test_compare_view_...)
                await press(pilot, view_key(index))
                assert tabs.active == VIEW_ORDER[index - 2][0]  # no Compare tab: the view on show stays
                continue
            await press(pilot, view_key(index))
            assert tabs.active == view_id
            assert not pilot.app.view(view_id).pending

    run_app(scenario)


def test_compare_view_shows_what_changed_since_the_baseline() -> None:
    from tputrace.tui.session import Session

    session = Session.open(tputrace.open(MARKUP_TRACE), baseline_path=SMALL_TRACE)

    async def scenario(pilot: Any) -> None:
        await press(pilot, "0")
        assert pilot.app.query_one("#views").active == "compare"
        text = screen_text(pilot.app)
        assert "regression: new recompile at /home/user/[link=https://example.com]proj[/link]/train[bold].py:7" in text
        events = table_rows(pilot.app, "#compare-events")
        assert ["new", "recompile"] == events[0][:2] and "train[bold].py:7" in events[0][2]
        assert any(row[:2] == ["fixed", "finding"] for row in events)
        assert any(row[:2] == ["gone", "program"] for row in events)
        figures = {row[0]: row for row in table_rows(pilot.app, "#compare-figures")}
        assert figures["host syncs"][1] == "8 -> 2"

    run_app(scenario, session=session, size=(160, 50))


def test_ops_group_sort_filter_and_drill_down() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "3")
        rows = table_rows(app, "#ops-groups")
        assert rows[0][0] == "aten.mm.default"
        await press(pilot, "s")
        assert "sorted by count" in screen_text(app)
        await press(pilot, "s", "s", "g")
        assert app.view("ops").grouping == "op_shapes"
        assert table_rows(app, "#ops-groups")[0][0].startswith("aten.")
        await press(pilot, "g")
        assert table_rows(app, "#ops-groups")[0][0].startswith("/home/user/proj/")
        await press(pilot, "g", "g")  # back to "op"
        await press(pilot, "slash", *"layer_norm", "enter")
        labels = [row[0] for row in table_rows(app, "#ops-groups")]
        assert labels == ["aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"]
        assert "filter layer_norm" in screen_text(app)
        await press(pilot, "enter")
        instances = table_rows(app, "#ops-instances")
        assert len(instances) == 30 and "instances of aten.native_layer_norm.default" in screen_text(app)
        await press(pilot, "escape")
        assert not app.view("ops").drilled
        assert app.query_one("#ops-filter").display
        await press(pilot, "escape")
        assert len(table_rows(app, "#ops-groups")) > 2
        assert not app.query_one("#ops-filter").display  # the cleared filter's box is gone
        assert "filter (literal text" not in screen_text(app)

    run_app(scenario)


def test_ops_instance_opens_its_source_line() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "3", "enter", "enter")
        assert app.query_one("#views").active == "source"
        source = app.view("source")
        line = source.current_line()
        assert source.file is not None and source.file.file.endswith(".py") and line in source.file.lines

    run_app(scenario)


def test_ops_load_more_on_demand() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "3", "g")  # op + shapes
        table = app.query_one("#ops-groups")
        table.page_size = 5
        app.view("ops")._show_groups()
        await settle(pilot)
        assert table.row_count == 5
        await press(pilot, *["down"] * 4)
        assert table.row_count == 10

    run_app(scenario)


def test_compiles_view_shows_reasons_and_change() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "4")
        rows = table_rows(app, "#compiles-table")
        assert [row[5] for row in rows] == ["first", "first", "first", "recompile", "guard_failure"]
        assert rows[3][7] == "input 0 dim 1: 128 -> 192"
        await press(pilot, "down", "down", "down")
        detail = app.query_one("#compiles-detail").content.plain
        assert "old: compile 1 fused:gpt_train_step (same structure): i64[8,128]" in detail and "new: i64[8,192]" in detail
        sites = table_rows(app, "#compiles-sites")
        assert sites[0][0] == "/home/user/proj/train.py:35 (train_step)" and sites[0][1:3] == ["2", "1"]
        await press(pilot, "enter")
        assert app.query_one("#views").active == "source" and app.view("source").current_line() == 35

    run_app(scenario)


def test_fusions_view_shows_flushes_ops_and_xla_fusions() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "5")
        flushes = table_rows(app, "#fusions-flushes")
        assert flushes[0][4] == "item" and flushes[0][6] == "miss" and flushes[2][6] == "hit"
        assert len(table_rows(app, "#fusions-ops")) == int(flushes[0][5])
        assert table_rows(app, "#fusions-xla")[0][1].startswith("k")
        await press(pilot, "down")
        assert len(table_rows(app, "#fusions-ops")) == int(flushes[1][5])
        await press(pilot, "s")
        first = table_rows(app, "#fusions-flushes")[0]
        assert first[4] in ("item", "step") and "sorted by duration" in screen_text(app)

    run_app(scenario)


def test_collectives_view_compares_ranks() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "6")
        kinds = table_rows(app, "#collectives-kinds")
        assert [row[0] for row in kinds] == ["all_reduce", "broadcast"] and kinds[0][2] == "6"
        ranks = table_rows(app, "#collectives-ranks")
        assert [row[0] for row in ranks] == ["0", "1"]
        assert "rank 0 waits least" in screen_text(app)

    run_app(scenario)


def test_timeline_zoom_pan_and_steps() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "7")
        view = app.view("timeline")
        window = view.window
        assert window is not None and window.step is not None
        assert "dispatch" in screen_text(app) and "tpu:0 exec" in screen_text(app)
        await press(pilot, "plus")
        assert abs(view.window.span_ns - window.span_ns / 2) <= 1
        zoomed = view.window
        await press(pilot, "right")
        assert view.window.start_ns == zoomed.start_ns + zoomed.span_ns // 4
        await press(pilot, "minus", "minus")
        assert view.window.span_ns >= window.span_ns
        await press(pilot, "right_square_bracket")
        assert view.window.step is not None
        step = view.steps[view.window.step]
        assert (view.window.start_ns, view.window.end_ns) == (step.start_ns, step.end_ns)
        await press(pilot, "w")
        assert view.window.start_ns == 0 and view.window.end_ns == view.wall_ns
        assert table_rows(app, "#timeline-events")[0][0] == "compile"
        longest = view.events[0]
        await press(pilot, "tab", "enter")
        assert view.window.span_ns == longest.dur_ns * 3
        assert view.window.start_ns <= longest.start_ns and longest.start_ns + longest.dur_ns <= view.window.end_ns
        await press(pilot, "enter")  # the same event again: its source line
        assert app.query_one("#views").active == "source" and app.view("source").current_line() == longest.source.line

    run_app(scenario)


def test_source_view_shows_code_with_a_gutter_and_opens_the_editor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "editor-args.txt"
    editor = tmp_path / "editor.py"
    editor.write_text(f"import sys\nopen({str(record)!r}, 'w').write(' '.join(sys.argv[1:]))\n")
    monkeypatch.setenv("EDITOR", f"{sys.executable} {editor}")

    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "8")
        files = table_rows(app, "#source-files")
        assert files[0][0] == "train.py" and files[1][0] == "model.py"
        code = rows_by_key(app, "#source-code")
        line_35 = next(row for row in code if row["line"] == "35")
        assert line_35["code"].strip() == "losses.append(loss.item())"
        assert line_35["compiles"] == "2" and line_35["syncs"] == "6"
        assert "caused" not in line_35  # no recompile storm: the empty column is left out
        source = app.view("source")
        assert source.current_line() == 35  # the hottest line
        await press(pilot, "n")
        assert source.current_line() == 36
        await press(pilot, "N", "N")
        assert source.current_line() == 33
        await press(pilot, "o")
        for _ in range(200):
            if record.exists():
                break
            await asyncio.sleep(0.05)
        assert record.read_text() == f"+33 {SOURCE_ROOT / 'proj' / 'train.py'}"

    run_app(scenario)


def test_source_view_without_the_file_lists_active_lines() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "8")
        assert "not found on this machine" in screen_text(app)
        lines = [row["line"] for row in rows_by_key(app, "#source-code")]
        assert lines == ["18", "20", "26", "27", "28", "30", "32", "33", "35", "36", "40", "44"]

    with tputrace.open(SMALL_TRACE) as trace:
        from tputrace.tui.session import Session

        run_app(scenario, session=Session(trace, 0, ()))


def test_findings_view_selects_and_moves_the_source_view() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        result = app.session.findings()
        await press(pilot, "2")
        text = screen_text(app)
        if result.unavailable:
            assert "diagnoses unavailable" in text
            return
        titles = [row[4] for row in table_rows(app, "#findings-table")]
        assert titles == [finding.title for finding in result.findings]
        located = [index for index, finding in enumerate(result.findings) if queries.finding_location(finding)]
        await press(pilot, *["down"] * located[-1])
        finding = result.findings[located[-1]]
        detail = app.query_one("#findings-detail").content.plain
        assert finding.explanation in detail and finding.suggestion in detail
        file, line = queries.finding_location(finding)
        await press(pilot, "enter")
        source = app.view("source")
        assert app.query_one("#views").active == "source"
        assert source.file is not None and source.file.file == file and source.current_line() == line

    run_app(scenario)


def test_findings_view_says_when_the_analysis_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import tputrace.analysis as analysis

    monkeypatch.delattr(analysis, "analyze", raising=False)

    async def scenario(pilot: Any) -> None:
        await press(pilot, "2")
        text = screen_text(pilot.app)
        assert "diagnoses unavailable" in text
        assert table_rows(pilot.app, "#findings-table") == []

    run_app(scenario)


def test_help_lists_bindings_with_ids_and_keys_can_be_remapped() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "question_mark")
        text = screen_text(app)
        assert "view.ops" in text and "Keys" in text
        help_rows = {row[3]: row for row in table_rows(app, "#help-table")}
        assert {"timeline.zoom_in", "ops.filter"} <= help_rows.keys()
        assert help_rows["view.ops"][1] == "o"
        await press(pilot, "escape")
        await press(pilot, "o")
        assert app.query_one("#views").active == "ops"
        await press(pilot, "3")  # the old key no longer switches
        assert app.query_one("#views").active == "ops"

    run_app(scenario, keymap={"view.ops": "o"})


def test_command_palette_runs_named_actions() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"Show Timeline")
        await pilot.pause(0.5)
        await press(pilot, "enter")
        assert app.query_one("#views").active == "timeline"

    run_app(scenario)


def test_next_rank_reloads_views() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "R")
        assert app.session.rank == 1
        assert "rank 1 of 2" in screen_text(app)
        await press(pilot, "4")
        rows = table_rows(app, "#compiles-table")
        assert [row[5] for row in rows] == ["first", "first", "first", "recompile"]  # rank 1 has no dynamo recompile

    run_app(scenario)


def test_strings_from_the_trace_are_shown_verbatim() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        seen = [screen_text(app)]
        for key in "34578":
            await press(pilot, key)
            seen.append(screen_text(app))
        await press(pilot, "3", "enter")
        seen.append(screen_text(app))
        await press(pilot, "escape", "g", "g", "g")
        seen.append(screen_text(app))
        text = "\n".join(seen)
        for literal in (MARKUP_OP, MARKUP_SHAPES, MARKUP_MODULE, MARKUP_DIFF, "[red]host[/]", "--name [bold]x[/]",
                        "train[bold].py:7", "fused:[bold]graph[/]", f"({MARKUP_FUNCTION})"):
            assert literal in text, literal
        assert MARKUP_FILE in text.replace("\n", "") or MARKUP_FILE in text

    run_app(scenario, session=make_session(MARKUP_TRACE), size=(200, 40))


@pytest.mark.parametrize("update", ["UPDATE strings SET text = NULL", "UPDATE strings SET text = CAST(text AS BLOB)",
                                    "UPDATE frames SET line = 'x'", "UPDATE ops SET start_ns = 'x'",
                                    "UPDATE steps SET start_ns = NULL", "UPDATE steps SET end_ns = NULL"],
                         ids=["null-strings", "blob-strings", "text-lines", "text-op-starts", "null-step-starts", "null-step-ends"])
def test_damaged_strings_and_lines_show_as_unknown(update: str, tmp_path: Path) -> None:
    """A hand-made file's NULL or blob strings and non-numeric lines read as unknown (`?`, line 0), text op starts
    and steps without times leave the app running through every view, instead of ending it with a traceback."""
    import shutil
    import sqlite3

    path = tmp_path / "damaged.tptrace"
    shutil.copyfile(SMALL_TRACE, path)
    with sqlite3.connect(path) as connection:
        connection.execute(update)
    connection.close()

    async def scenario(pilot: Any) -> None:
        for key in "2345678":
            await press(pilot, key)
        assert pilot.app.return_code is None and "Traceback" not in screen_text(pilot.app)

    run_app(scenario, session=make_session(path))


# -- the command line ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "text", "sqlite_not_trace", "corrupt", "truncated", "directory", "newer_version"])
def test_bad_files_print_one_line_and_exit_2_before_the_ui(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from tputrace.tui.app import TraceApp

    def no_ui(self: Any, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the UI started")

    monkeypatch.setattr(TraceApp, "run", no_ui)
    paths = build_broken_traces(tmp_path, SMALL_TRACE)
    assert main(["tui", str(paths[kind])]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("tputrace: error: ") and BROKEN_TRACE_MESSAGES[kind] in err[0]


def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tui", str(SMALL_TRACE), "--rank", "7"]) == 2
    assert main(["tui", str(SMALL_TRACE), "--keys", "nope=x"]) == 2
    assert main(["tui", str(SMALL_TRACE), "--theme", "nope"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 3 and "no rank 7" in err[0] and "no action with id" in err[1] and "no theme" in err[2]


def test_cli_starts_the_app_with_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from tputrace.tui.app import TraceApp

    started: dict[str, Any] = {}

    def fake_run(self: Any, *args: Any, **kwargs: Any) -> None:
        started.update(rank=self.session.rank, keymap=self.user_keymap, view=self.initial_view, roots=self.session.source_roots)

    monkeypatch.setattr(TraceApp, "run", fake_run)
    for stream in (sys.stdin, sys.stderr):  # as in a terminal: the UI needs one
        monkeypatch.setattr(stream, "isatty", lambda: True)
    argv = ["tui", str(SMALL_TRACE), "--rank", "1", "--view", "ops", "--keys", "view.ops=o", "--source-root", str(SOURCE_ROOT)]
    assert main(argv) == 0
    assert started["rank"] == 1 and started["keymap"] == {"view.ops": "o"} and started["view"] == "ops"
    assert started["roots"][0] == str(SOURCE_ROOT)


def test_an_error_in_the_app_is_its_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """An app that ended on an error (Textual prints its traceback) exits 1, not 0; on a trace holding a value its
    format never stores, 2, with the value named on the last line."""
    import shutil
    import sqlite3

    from tputrace.tui.app import TraceApp

    monkeypatch.setattr(TraceApp, "run", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(TraceApp, "return_code", property(lambda self: 1))
    for stream in (sys.stdin, sys.stderr):
        monkeypatch.setattr(stream, "isatty", lambda: True)
    assert main(["tui", str(SMALL_TRACE)]) == 1
    damaged = tmp_path / "damaged.tptrace"
    shutil.copyfile(SMALL_TRACE, damaged)
    with sqlite3.connect(damaged) as connection:
        connection.execute("UPDATE ops SET start_ns = 'x'")
    connection.close()
    capsys.readouterr()
    assert main(["tui", str(damaged)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"tputrace: error: {damaged} is damaged: ops.start_ns holds 'x' (text) where the format has integers")


def test_tui_without_a_terminal_is_one_line_not_a_hang() -> None:
    """With stdin not a terminal (a pipe, /dev/null, CI) the app would wait for keys forever."""
    result = subprocess.run(
        [sys.executable, "-m", "tputrace.cli.main", "tui", str(SMALL_TRACE)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == ["tputrace: error: tputrace tui needs a terminal: it reads keys from stdin and draws on stderr"]


def test_run_tui_opens_the_ui_with_only_stdout_redirected(monkeypatch: pytest.MonkeyPatch) -> None:
    """`tputrace run --tui script.py > log`: the UI draws on stderr, so it still opens."""
    from tputrace.cli.tui import open_ui_after_run
    from tputrace.tui.app import TraceApp

    started: list[str] = []
    monkeypatch.setattr(TraceApp, "run", lambda self, *args, **kwargs: started.append(self.initial_view))
    for stream, is_terminal in ((sys.stdin, True), (sys.stderr, True), (sys.stdout, False)):
        monkeypatch.setattr(stream, "isatty", lambda answer=is_terminal: answer)
    open_ui_after_run(SMALL_TRACE)
    assert started == ["overview"]


def test_run_tui_needs_a_terminal(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from tputrace.cli.tui import open_ui_after_run
    from tputrace.tui.app import TraceApp

    monkeypatch.setattr(TraceApp, "run", lambda self, *args, **kwargs: pytest.fail("the UI started without a terminal"))
    open_ui_after_run(SMALL_TRACE)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tputrace: --tui needs a terminal; open the trace with: tputrace tui {SMALL_TRACE}"]


def test_sharding_tables_group_collectives_by_cause(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        tables = queries.sharding_tables(trace, 0)
        ((gradients,),) = trace.sql("SELECT COUNT(*) FROM collectives WHERE rank = 0 AND kind = 'all_reduce'")
    assert [(mesh.shape, mesh.dim_names, mesh.ranks) for mesh in tables.meshes] == [("2", "dp", "[0, 1]")]
    (parameter,) = tables.parameters
    assert parameter.name == "GPT.embed.weight" and parameter.placements == "Replicate()" and parameter.bytes_per_rank == parameter.bytes > 0
    by_cause = {group.cause: group for group in tables.causes}
    assert set(by_cause) == {"ddp_bucket", queries.USER_CALL}
    bucket = by_cause["ddp_bucket"]
    assert (bucket.phase, bucket.module, bucket.count) == ("backward", "DistributedDataParallel", gradients)
    assert bucket.line.endswith("train.py:19") and bucket.total_ns > 0 and not tables.empty


def test_sharding_tables_of_a_trace_without_the_tables_are_empty(small: Any) -> None:
    tables = queries.sharding_tables(small, 0)
    assert tables.empty and not tables.meshes and not tables.parameters
    assert {group.cause for group in tables.causes} == {queries.USER_CALL}


def test_sharding_view_shows_meshes_parameters_and_causes(sample_trace_path: Path) -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "9")
        (mesh,) = table_rows(app, "#sharding-meshes")
        assert mesh[1:] == ["2", "dp", "[0, 1]"]
        (parameter,) = table_rows(app, "#sharding-parameters")
        assert parameter[:3] == ["GPT.embed.weight", "ddp", "Replicate()"]
        causes = table_rows(app, "#sharding-causes")
        assert [row[0] for row in causes][:1] == ["ddp_bucket"] and causes[0][4] == "6"
        assert "1 mesh, 1 parameter" in screen_text(app)

    run_app(scenario, session=make_session(sample_trace_path))


def test_sharding_view_says_when_a_trace_has_no_records() -> None:
    async def scenario(pilot: Any) -> None:
        await press(pilot, "9")
        assert "no sharding records in this trace" in screen_text(pilot.app)

    run_app(scenario)


def test_ops_by_op_rank_as_the_summary_with_labelled_figures(small: Any) -> None:
    from tputrace.analysis.target import DEFAULT_TARGET, target_chip
    from tputrace.derived.op_ranking import CHIP_SHARE_LABEL, HOST_DISPATCH_LABEL, rank_ops

    ranking = rank_ops(small, 0, target_chip(DEFAULT_TARGET))

    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "3")
        table = app.query_one("#ops-groups")
        headers = [str(column.label) for column in table.columns.values()]
        assert headers[1:5] == ["calls", "host dispatch", "mean dispatch", "share"] and CHIP_SHARE_LABEL in headers
        rows = table_rows(app, "#ops-groups")
        assert [row[0] for row in rows] == [op.op for op in ranking.ops]
        assert rows[0][2] == fmt_ns(ranking.ops[0].self_dispatch_ns)
        assert f"{HOST_DISPATCH_LABEL}, measured on this host · {CHIP_SHARE_LABEL}, projected for {DEFAULT_TARGET}" in screen_text(app)
        await press(pilot, "g")
        assert "host dispatch" in [str(column.label) for column in table.columns.values()]

    run_app(scenario, size=(200, 40))


def test_op_groups_by_op_leave_out_flushes_and_compiles_inside_calls(tmp_path: Path) -> None:
    from fixtures.make_traces import MS, build_trace_with_a_flush_inside_an_op

    with tputrace.open(build_trace_with_a_flush_inside_an_op(tmp_path / "nested.tptrace")) as trace:
        groups = queries.op_groups(trace, "op", 0)
        instances = queries.op_instances(trace, "op", groups[1].key, 0)
    assert [(group.label, group.total_ns) for group in groups] == [("aten.bmm.default", 40 * MS), ("aten._foreach_mul_.Scalar", 30 * MS)]
    assert [instance.dur_ns for instance in instances] == [750 * MS]


def test_no_table_has_a_bare_time_column() -> None:
    from textual.widgets import DataTable

    async def scenario(pilot: Any) -> None:
        app = pilot.app
        labels: set[str] = set()
        for key in "3456789":
            await press(pilot, key)
            for table in app.screen.query(DataTable):
                labels |= {str(column.label) for column in table.columns.values()}
        assert not labels & {"time", "start", "mean", "recorded time"}  # each says which time it is
        assert {"host dispatch", "mean dispatch", "compile time", "collective time", "mean collective", "host time",
                "start (wall)", "duration"} <= labels
        await press(pilot, "7")
        kinds = {row[0] for row in table_rows(app, "#timeline-events")}
        assert kinds and kinds <= {"host dispatch", "compile", "sync stall", "transfer", "fallback", "collective", "program execution"}

    run_app(scenario)


def test_rows_added_later_widen_their_columns_instead_of_cutting_numbers() -> None:
    from rich.text import Text

    from tputrace.tui.render import right

    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "3")
        table = app.query_one("#ops-groups")
        row = ("0", (Text("aten.mm.default"), right("12"), right("1 ms"), right("1 ms"), right("1%"), Text(""), right("1%")))
        table.show([row], more=True)
        table.extend([("1", (Text("aten.add.Tensor"), right("1,622,000"), right("1 ms"), right("1 ms"), right("1%"), Text(""), right("1%")))],
                     more=False)
        await settle(pilot)
        assert table_rows(app, "#ops-groups")[1][1] == "1,622,000"
        assert any("1,622,000" in line for line in screen_lines(app))

    run_app(scenario)


def test_next_hot_line_works_from_the_file_list() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "8")
        source = app.view("source")
        assert source.current_line() == 35
        await press(pilot, "f")
        assert app.focused is app.query_one("#source-files")
        files_cursor = app.query_one("#source-files").get_component_styles("datatable--cursor")
        code = app.query_one("#source-code")
        blurred_cursor = code.get_component_styles("datatable--cursor")
        assert blurred_cursor.text_style.bold and blurred_cursor.background != files_cursor.background
        await press(pilot, "n")
        assert source.current_line() == 36 and app.focused is code
        focused_cursor = code.get_component_styles("datatable--cursor")
        assert focused_cursor.text_style.bold and focused_cursor.background.a == 1.0
        await press(pilot, "N", "N")
        assert source.current_line() == 33

    run_app(scenario)


def test_fusions_side_tables_are_divided_when_wide_and_stacked_below_with_no_scrollbar_mid_view() -> None:
    async def wide(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "5")
        ops_table = app.query_one("#fusions-ops")
        assert ops_table.show_vertical_scrollbar and ops_table.styles.scrollbar_size_vertical == 1
        line = next(line for line in screen_lines(app) if "aten.embedding.default" in line and "fusion." in line)
        between = line[line.index("aten.embedding.default") + len("aten.embedding.default"):line.index("fusion.")]
        assert "│" in between or "▕" in between or "▏" in between

    run_app(wide, size=(150, 40))

    async def narrow(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "5")
        width = app.size.width
        view = app.view("fusions")
        assert view.has_class("-stacked")
        for table in view.query("TraceTable"):
            assert not table.show_horizontal_scrollbar, table.id  # the columns fit: no scrollbar across the view
            if table.show_vertical_scrollbar:
                assert table.region.right == width, table.id  # at the screen's edge, not mid-view
        ops_title = app.query_one("#fusions-ops-title")
        assert ops_title.region.y > app.query_one("#fusions-flushes").region.bottom - 1
        assert app.query_one("#fusions-xla").region.y > app.query_one("#fusions-ops").region.y

    for size in ((100, 40), (80, 40)):
        run_app(narrow, size=size)


def test_long_finding_titles_end_in_an_ellipsis_and_show_whole_in_the_detail() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        result = app.session.findings()
        await press(pilot, "2")
        if result.unavailable:
            return
        title = result.findings[0].title
        lines = screen_lines(app)
        assert any(title[:12] in line and title not in line and "…" in line for line in lines)  # too long for the table at 100 columns
        assert app.query_one("#findings-detail").content.plain.startswith(title)

    run_app(scenario, size=(100, 40))


def test_memory_tables_break_the_peak_down_by_kind_module_and_line(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        tables = queries.memory_tables(trace, 0)
        ((measured,),) = trace.sql("SELECT MAX(peak_bytes) FROM memory WHERE rank = 0 AND chip = 0")
    peak = tables.peak
    assert peak is not None and peak.bytes == measured == sum(part.bytes for part in peak.parts)
    assert dict(peak.by_kind)["parameter"] == 40_000_000
    assert any(part.module == "GPT.head" and part.where.startswith("train.py:30") for part in peak.parts)
    assert max(tables.live_columns) == peak.bytes
    (surviving,) = tables.surviving
    assert (surviving.module, surviving.line, surviving.bytes_per_step) == ("GPT.head", 30, 2_000_000)


def test_memory_view_shows_the_peak_and_surviving_lines(sample_trace_path: Path) -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "M")
        parts = table_rows(app, "#memory-parts")
        assert parts[0][:4] == [fmt_bytes(40_000_000), "parameter", "GPT", "train.py:18"]
        assert table_rows(app, "#memory-surviving")[0][2:] == ["other", "GPT.head", "train.py:30"]
        assert "tpu:0 peaked at" in screen_text(app)

    run_app(scenario, session=make_session(sample_trace_path))


def test_memory_view_says_when_a_trace_has_no_buffer_lifetimes() -> None:
    async def scenario(pilot: Any) -> None:
        await press(pilot, "M")
        assert "no buffer lifetimes in this trace" in screen_text(pilot.app)

    run_app(scenario)


def test_every_tab_shows_without_scrolling_the_tab_bar_at_80_columns_and_whole_titles_when_they_fit() -> None:
    from textual.widgets import Tabs

    from tputrace.tui.actions import SHORT_TITLES, VIEW_ORDER

    def labels(app: Any) -> list[str]:
        return [tab.label_text for tab in app.query_one("#views").query_one(Tabs).query("Tab")]

    async def scenario(pilot: Any) -> None:
        app = pilot.app
        width = app.size.width
        tabs = list(app.query_one("#views").query_one(Tabs).query("Tab"))
        assert all(0 <= tab.region.x and tab.region.right <= width for tab in tabs)  # every tab whole on screen
        shown = labels(app)
        whole = [title for view_id, title in VIEW_ORDER if view_id != "compare"]
        if width >= 100:
            assert [label[1:] for label in shown] == whole
        else:
            assert [label[1:] for label in shown] == [SHORT_TITLES[view_id] for view_id, _ in VIEW_ORDER if view_id != "compare"]
        assert shown[0].startswith("1") and shown[-1].startswith("M")
        await pilot.resize_terminal(120, 36)
        await settle(pilot)
        assert [label[1:] for label in labels(app)] == whole

    for size in ((100, 36), (80, 36)):
        run_app(scenario, size=size)


NARROW_SIZES = ((100, 36), (80, 36))
"""The widths a new user's terminal often has: every view must read there."""


def test_no_number_is_cut_and_tables_fit_at_100_and_80_columns() -> None:
    from tputrace.tui.widgets import TraceTable

    async def scenario(pilot: Any) -> None:
        app = pilot.app
        for key in ("2", "3", "4", "5", "6", "7", "8", "9", "M"):
            await press(pilot, key)
            for table in app.screen.query(TraceTable):
                if not table.display or not table.row_count or not table.is_on_screen:
                    continue
                columns = list(table.columns.values())
                for index in range(table.row_count):
                    for column, cell in zip(columns, table.get_row_at(index)):
                        if getattr(cell, "justify", None) == "right":  # a number: shown whole
                            assert len(cell.plain) <= column.width, (table.id, str(column.label), cell.plain)
                for column in columns:
                    assert len(str(column.label)) <= column.width, (table.id, str(column.label))  # no header is cut
                if table.fit_width:
                    total = sum(column.get_render_width(table) for column in columns)
                    assert total <= table.scrollable_content_region.width, (table.id, total)
                    assert not table.show_horizontal_scrollbar, table.id
        await press(pilot, "8")
        files = app.query_one("#source-files")
        (first_time, *_), = [[row[1]] for row in table_rows(app, "#source-files")[:1]]
        assert first_time == fmt_ns(app.view("source").files[0].time_ns)
        assert any(first_time in line for line in screen_lines(app))  # "1.15 s", never "1.1"
        assert files.region.width <= 34

    for size in NARROW_SIZES:
        run_app(scenario, size=size)


def test_the_help_screen_wraps_every_description_whole_at_100_and_80_columns() -> None:
    from tputrace.tui.actions import ACTIONS

    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "question_mark")
        table = app.screen.query_one("#help-table")
        total = sum(column.get_render_width(table) for column in table.columns.values())
        assert total <= table.scrollable_content_region.width, total
        described = {row[-2]: " ".join(row[-1].split()) for row in table_rows(app, "#help-table")}
        assert described == {action.id: " ".join(action.help.split()) for action in ACTIONS}
        assert any("\n" in str(cell) for cell in table.get_column("help"))  # long descriptions take several lines

    for size in NARROW_SIZES:
        run_app(scenario, size=size)


def test_tabs_and_overview_headings_fit_at_100_columns() -> None:
    from textual.widgets import Tab

    async def scenario(pilot: Any) -> None:
        app = pilot.app
        width = app.size.width
        tabs = list(app.query(Tab))
        assert len(tabs) == len(VIEW_ORDER) - 1  # no Compare tab without --compare
        assert all(0 <= tab.region.x and tab.region.right <= width for tab in tabs)  # every tab whole, none scrolled off
        tab_line = next(line for line in screen_lines(app) if "1Overview" in line)
        assert all(f"{view_key(index)}{title}" in tab_line for index, (view_id, title) in enumerate(VIEW_ORDER, start=1) if view_id != "compare")
        chart_text = app.query_one("#overview-chart").render()
        assert "…" not in str(chart_text)  # the step summary and the projection wrap rather than end in an ellipsis
        text = screen_text(app)
        assert "Step time: the wall time of each step of the loop, measured on this host" in text
        assert "(roofline of" in text and "a lower bound)" in text.replace("\n", " ")

    run_app(scenario, size=(100, 40))


def test_the_step_chart_names_its_clipped_steps() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        steps = [step for step in step_rows(app.session.trace, 0) if step.in_loop]
        steady = [step.dur_ns for step in steps if not step.compiles]
        clipped = sorted((step for step in steps if step.dur_ns > max(steady) * 1.001), key=lambda step: -step.dur_ns)
        assert clipped  # the fixture's compiling steps dwarf the others
        text = " ".join(screen_lines(app))
        assert f"▲ clipped at {fmt_ns(max(steady))}, the slowest step without a compile: step {clipped[0].step} took {fmt_ns(clipped[0].dur_ns)}" in text
        assert "c: the step compiled" in text

    run_app(scenario, size=(100, 40))


def test_narrow_tables_leave_out_optional_columns_and_bring_them_back_when_wider() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "5")
        table = app.query_one("#fusions-flushes")
        keys = [str(key.value) for key in table.columns]
        assert "in" not in keys and "out" not in keys and {"dur", "ops", "trigger"} <= set(keys)  # the host time, ops and trigger stay
        await press(pilot, "down", "down")
        flush = app.view("fusions").flushes[2]
        await pilot.resize_terminal(150, 36)
        await settle(pilot)
        assert {"in", "out", "start"} <= {str(key.value) for key in table.columns}
        assert table.cursor_row == 2 and rows_by_key(app, "#fusions-flushes")[2]["in"] == fmt_bytes(flush.input_bytes)
        assert table.row_count == len(app.view("fusions").flushes)

    run_app(scenario, size=(80, 36))


def test_the_source_cursor_row_drops_its_syntax_colours_so_no_token_vanishes_into_the_highlight() -> None:
    from textual.coordinate import Coordinate

    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await press(pilot, "8")
        table = app.query_one("#source-code")
        column = table.get_column_index("code")
        source = app.view("source")
        coloured = next(index for index, line in enumerate(source.row_lines) if line == 40)  # print('argmax', ...): coloured tokens
        before = table.get_cell_at(Coordinate(coloured, column))
        assert before.spans
        table.move_cursor(row=coloured, animate=False)
        await settle(pilot)
        on_cursor = table.get_cell_at(Coordinate(coloured, column))
        assert on_cursor.plain == before.plain and not on_cursor.spans and not on_cursor.style
        table.move_cursor(row=coloured + 1, animate=False)
        await settle(pilot)
        assert table.get_cell_at(Coordinate(coloured, column)).spans == before.spans  # colours back once the cursor leaves

    run_app(scenario)
