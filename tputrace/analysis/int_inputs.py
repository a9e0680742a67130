"""A torch.compile graph whose XLA program compiles again for each value of a Python int it takes, in a recorded run.

After a guard on a Python int fails once (`temperature == 1`), Dynamo makes the int dynamic and traces one graph that
takes it as an input, so Dynamo itself traces nothing more. The tpu backend, though, compiles an XLA program per
value of such an int, as it does per size of a dynamic dim: each new value is a `recompile` of the graph's `xla`
program whose diff changes ints only (`input 3 (arg3_1): int 2 -> int 3`), the tensors' shapes unchanged. A step
counter, a temperature or a top-k given as an `int` compiles at every new value. One finding per graph with at least
`MIN_RECOMPILES` such recompiles, at the line of the compiled function, naming each changing int (by the name the
recording took from Dynamo's graph, else the guard that made it dynamic) and advising each by what it is: a length
(the graph's `int_uses` says it sets a size) is padded to a few fixed lengths and masked, a position or a step counter
(by its use or its name) is passed as a device tensor.
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
_LENGTH_WORDS = {"len", "length", "lengths", "size", "seqlen", "width", "height", "n", "num"}
_POSITION_WORDS = {"pos", "position", "index", "idx", "offset", "start", "cursor", "ptr", "cache_position"}
_COUNTER_WORDS = {"step", "steps", "iter", "iteration", "epoch", "calls", "count", "counter", "t", "tick", "global_step"}


@dataclass(frozen=True)
class IntInput:
    """One int the graph takes whose value changed between its compiles: its name, what the graph does with it
    (`length`, `position`, `counter` or `value`) and the values it took."""

    name: str
    kind: str
    values: tuple[int, ...]


@dataclass(frozen=True)
class IntInputRecompiles:
    """A compiled graph's programs compiled per value of its int inputs: the graph, the function, the ints (the
    first changed at the first recompile), the recompiles and their time."""

    graph: str
    function: str
    ints: tuple[IntInput, ...]
    recompiles: int
    recompile_ns: int
    frame_id: int | None

    @property
    def name(self) -> str:
        return self.ints[0].name


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
        recorded = _recorded_facts(context, graph)
        values: dict[str, set[int]] = {}
        nodes: dict[str, str] = {}
        for matched, _, _ in rows:
            for change in matched:
                index = change.group(0).split(" ", 2)[1]
                values.setdefault(index, set()).update((int(change["before"]), int(change["after"])))
                nodes.setdefault(index, change["node"])
        ints = []
        for position, (index, taken) in enumerate(values.items()):
            name = recorded[0].get(index) or (_int_name(context, function) if position == 0 else None) or nodes[index]
            use = recorded[1].get(index)  # a recorded length or position is what the graph does; else the name tells more
            kind = use if use in ("length", "position") else _kind_by_name(name, use is None)
            ints.append(IntInput(name, kind, tuple(sorted(taken))))
        out.append(IntInputRecompiles(graph, function, tuple(ints), len(rows), sum(dur_ns for _, dur_ns, _ in rows),
                                      rows[0][2]))
    return out


def _recorded_facts(context: AnalysisContext, graph: str) -> tuple[dict[str, str], dict[str, str]]:
    """The Python names the recording gave the graph's int inputs, and what the graph does with each (its AOT graph's
    `int_inputs` and `int_uses` details), by input index, where it has them."""
    for (detail,) in context.trace.sql(
        "SELECT c.detail FROM compiles c JOIN strings n ON n.id = c.name_sid WHERE c.rank = ? AND c.kind = 'aot' "
        "AND n.text = ? AND c.detail IS NOT NULL", (context.rank, graph),
    ):
        parsed = detail_object(detail)
        names, uses = parsed.get("int_inputs"), parsed.get("int_uses")
        if isinstance(names, dict):
            return ({index: str(name) for index, name in names.items() if isinstance(name, str)},
                    {index: str(use) for index, use in uses.items()} if isinstance(uses, dict) else {})
    return {}, {}


def _kind_by_name(name: str, may_be_length: bool) -> str:
    """What an int is by its name: a trace that does not record what the graph does with it (an import), or one whose
    graph only does arithmetic with it (`may_be_length` False: it sets no size)."""
    words = set(re.split(r"[^a-z]+|(?<=[a-z])(?=[A-Z])", name.rpartition(".")[2].lower()))
    if words & _COUNTER_WORDS:
        return "counter"
    if words & _POSITION_WORDS:
        return "position"
    return "length" if may_be_length and words & _LENGTH_WORDS else "value"


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
    named = " and ".join(f"`{one.name}`" for one in record.ints)
    took = "; ".join(f"`{one.name}` took {len(one.values)} values ({_listed(one.values)})" for one in record.ints)
    return Finding(
        analyzer=ANALYZER,
        severity=context.severity(share),
        title=(f"{record.graph} compiled again for each value of the {'int' if len(record.ints) == 1 else 'ints'} "
               f"{named} at {where}: {plural(record.recompiles, 'recompile')}"),
        explanation=(
            f"Dynamo traced {record.function} with {named} as {'an int input' if len(record.ints) == 1 else 'int inputs'}, and the tpu backend compiles "
            f"the graph's XLA program once per value (XLA takes an int as a constant, as it takes a size): {took}; "
            f"{plural(record.recompiles, 'recompile')}, {format_ns(record.recompile_ns)} of compiling "
            f"({share:.0%} of the run)."
        ),
        suggestion=" ".join(_advice(one) for one in record.ints),
        cost_total_ns=float(record.recompile_ns),
        cost_per_step_ns=context.per_step(record.recompile_ns),
        cost_basis=MEASURED_ON_HOST,
        evidence=(Evidence(f"{plural(record.recompiles, 'recompile')} of {record.graph}, each for new values of {named}",
                           table="compiles"),),
        **context.location_fields(record.frame_id),
    )


def _listed(values: tuple[int, ...]) -> str:
    listed = ", ".join(str(value) for value in values[:MAX_LISTED_VALUES])
    return listed + (f" and {len(values) - MAX_LISTED_VALUES} more" if len(values) > MAX_LISTED_VALUES else "")


def _advice(one: IntInput) -> str:
    """One sentence per int, by what the graph does with it."""
    name = one.name
    if one.kind == "length":
        return (f"`{name}` sets a size in the graph (a length: a slice's end, `torch.arange({name})`): pad to a few fixed "
                f"lengths (round `{name}` up to a multiple of 64, say) and mask what lies past the real length, so each "
                "fixed length compiles once; marking it dynamic does not help here, as the tpu backend still compiles "
                "one program per value.")
    if "." in name:  # an attribute the compiled function reads (`self.step_count`): nothing passes it
        return (f"`{name}` is an attribute, not an argument: keep it a 0-d tensor on the device (made once as "
                f"`torch.zeros((), dtype=torch.long, device=...)` and updated in place, `{name}.add_(1)`), so the "
                "program takes it as data and compiles once; or, where the graph's result does not depend on it, "
                "update and read it outside the compiled function.")
    if one.kind == "position":
        return (f"`{name}` is a position or index: pass it as a 0-d tensor on the device "
                f"(`torch.tensor({name}, device=...)`) and index with tensor ops (`index_select`, `index_copy_`, a mask "
                f"`torch.arange(n, device=...) == {name}`), so the program takes it as data and compiles once.")
    if one.kind == "counter":
        return (f"`{name}` counts calls (a step counter): where the result depends on it (a schedule, a decay), pass it "
                f"as a 0-d tensor on the device updated in place (`{name}_t += 1`), so the program takes it as data and "
                "compiles once; where it does not, keep it out of the compiled function.")
    return (f"Pass `{name}` to the compiled function as a 0-d tensor on the device (`torch.tensor({name}, device=...)`), "
            "so the program takes it as data and compiles once.")
