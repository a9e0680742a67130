"""A torch.compile graph whose XLA program compiles again for each value of a Python int it takes, in a recorded run.

After a guard on a Python int fails once (`temperature == 1`), Dynamo makes the int dynamic and traces one graph that
takes it as an input, so Dynamo itself traces nothing more. The tpu backend, though, compiles an XLA program per
value of such an int, as it does per size of a dynamic dim: each new value is a `recompile` of the graph's `xla`
program whose diff changes ints only (`input 3 (arg3_1): int 2 -> int 3`), the tensors' shapes unchanged. A step
counter, a temperature or a top-k given as an `int` compiles at every new value. One finding per graph with at least
`MIN_RECOMPILES` such recompiles, at the line of the compiled function, naming the int by the guard that made it
dynamic where the trace has it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext, detail_object
from tputrace.analysis.findings import MEASURED_ON_HOST, Evidence, Finding
from tputrace.wording import format_ns, plural

ANALYZER = "guard_recompiles"
MIN_RECOMPILES = 3
MAX_LISTED_VALUES = 8
_INT_CHANGE = re.compile(r"input \d+ \((?P<node>[^)]+)\): int (?P<before>-?\d+) -> int (?P<after>-?\d+)")
_INT_GUARD = re.compile(r"^(?:\d+/\d+: )?(?P<name>[A-Za-z_][\w.\[\]'\"]*) == -?\d+(?:\s|$)")


@dataclass(frozen=True)
class IntInputRecompiles:
    """A compiled graph's programs compiled per value of an int input: the graph, the function, the int's name,
    the values it took, the recompiles and their time."""

    graph: str
    function: str
    name: str
    values: tuple[int, ...]
    recompiles: int
    recompile_ns: int
    frame_id: int | None


def findings(context: AnalysisContext) -> list[Finding]:
    return [_finding(context, record) for record in recompiles(context)]


def recompiles(context: AnalysisContext) -> list[IntInputRecompiles]:
    by_graph: dict[str, list[tuple[list[re.Match[str]], int, int | None]]] = {}
    for name, diff, dur_ns, frame_id in context.trace.sql(
        "SELECT n.text, d.text, COALESCE(c.dur_ns, 0), c.frame_id FROM compiles c "
        "JOIN strings n ON n.id = c.name_sid JOIN strings d ON d.id = c.diff_sid "
        "WHERE c.rank = ? AND c.kind = 'xla' AND c.reason = 'recompile' ORDER BY c.start_ns", (context.rank,),
    ):
        parts = (diff or "").split("; ")
        changes = [_INT_CHANGE.fullmatch(part) for part in parts]
        if name and " graph " in name and all(changes):
            by_graph.setdefault(name, []).append(([change for change in changes if change], dur_ns, frame_id))
    out = []
    for graph, rows in by_graph.items():
        if len(rows) < MIN_RECOMPILES:
            continue
        function = graph.split(" graph ", 1)[0]
        values = sorted({int(change[key]) for changes, _, _ in rows for change in changes[:1] for key in ("before", "after")})
        first = rows[0][0][0]
        name = _recorded_name(context, graph, first.group(0)) or _int_name(context, function) or first["node"]
        out.append(IntInputRecompiles(graph, function, name,
                                      tuple(values), len(rows), sum(dur_ns for _, dur_ns, _ in rows), rows[0][2]))
    return out


def _recorded_name(context: AnalysisContext, graph: str, change: str) -> str | None:
    """The Python name the recording gave the graph's int input that `change` (`input 4 (arg4_1): int 4 -> int 5`)
    names (its AOT graph's `int_inputs` detail), where it has one."""
    index = change.split(" ", 2)[1]
    for (detail,) in context.trace.sql(
        "SELECT c.detail FROM compiles c JOIN strings n ON n.id = c.name_sid WHERE c.rank = ? AND c.kind = 'aot' "
        "AND n.text = ? AND c.detail IS NOT NULL", (context.rank, graph),
    ):
        names = detail_object(detail).get("int_inputs")
        if isinstance(names, dict) and isinstance(names.get(index), str):
            return str(names[index])
    return None


def _int_name(context: AnalysisContext, function: str) -> str | None:
    """The Python name of the int, from the guard on it that failed before Dynamo made it dynamic."""
    for (diff,) in context.trace.sql(
        "SELECT d.text FROM compiles c JOIN strings n ON n.id = c.name_sid JOIN strings d ON d.id = c.diff_sid "
        "WHERE c.rank = ? AND c.kind = 'dynamo_frame' AND c.reason = 'guard_failure' AND n.text = ? ORDER BY c.start_ns",
        (context.rank, function),
    ):
        guard = _INT_GUARD.match((diff or "").split("\n", 1)[0])
        if guard is not None:
            return guard["name"]
    return None


def _finding(context: AnalysisContext, record: IntInputRecompiles) -> Finding:
    where = context.where(record.frame_id)
    share = context.share_of_wall(record.recompile_ns)
    listed = ", ".join(str(value) for value in record.values[:MAX_LISTED_VALUES])
    more = f" and {len(record.values) - MAX_LISTED_VALUES} more" if len(record.values) > MAX_LISTED_VALUES else ""
    return Finding(
        analyzer=ANALYZER,
        severity=context.severity(share),
        title=(f"{record.graph} compiled again for each value of the int `{record.name}` at {where}: "
               f"{plural(record.recompiles, 'recompile')}"),
        explanation=(
            f"Dynamo traced {record.function} with `{record.name}` as an int input, and the tpu backend compiles "
            f"the graph's XLA program once per value of it (XLA takes it as a constant, as it takes a size): "
            f"`{record.name}` took {len(record.values)} values ({listed}{more}), "
            f"{plural(record.recompiles, 'recompile')}, {format_ns(record.recompile_ns)} of compiling "
            f"({share:.0%} of the run)."
        ),
        suggestion=_attribute_advice(record.name) if "." in record.name else (
            f"Pass `{record.name}` to the compiled function as a tensor on the device "
            f"(`torch.tensor({record.name}, device=...)`): the program then takes it as data and compiles "
            "once. Where it sets a shape inside the function (`torch.arange(n)`, a slice's end), give it a few fixed "
            "values instead and mask."
        ),
        cost_total_ns=float(record.recompile_ns),
        cost_per_step_ns=context.per_step(record.recompile_ns),
        cost_basis=MEASURED_ON_HOST,
        evidence=(Evidence(f"{plural(record.recompiles, 'recompile')} of {record.graph}, each for a new value of "
                           f"`{record.name}`", table="compiles"),),
        **context.location_fields(record.frame_id),
    )


def _attribute_advice(name: str) -> str:
    """An int attribute the compiled function reads (`self.step_count`, often a counter it increments): nothing is
    passed, so the fix is to keep the attribute a tensor, or to leave it out of the graph."""
    return (
        f"`{name}` is an attribute, not an argument: keep it a tensor on the device (made once as "
        f"`torch.zeros((), dtype=torch.long, device=...)` and updated in place, `{name}.add_(1)`), so the program "
        "takes it as data and compiles once; or, where the graph's result does not depend on it (a counter), update "
        "and read it outside the compiled function. Where it sets a shape inside the function (`torch.arange(n)`, a "
        "slice's end), give it a few fixed values instead and mask."
    )
