"""A torch.compile'd function traced again for each value of a Python argument, in a recorded run.

Dynamo specialises a graph on the Python ints and floats it reads (`kc[:, pos] = k`, `x[:, : pos + 1]`): a call with
another value fails the guard `pos == 3`, and Dynamo traces the function again (a `dynamo_frame` compile with reason
`guard_failure` whose diff is that guard), and the backend compiles the new graph. A decoding step called with the
position as an `int` does this at every token, until Dynamo's recompile limit stops compiling it. Size guards are
`dynamic_sizes`'; imported logs' recompiles are `guard_recompiles`'. One finding per function with at least
`MIN_GUARD_FAILURES` value-guard failures, at the line calling it, costing the failures and the compiles of the
graphs they traced.

A guard on `___stack0[0]` is on a value Dynamo's resumed frame took from the stack at a graph break: a number
the host read from a tensor at the break (`float(t)`, `.item()`, numpy of `.tolist()`), new at every call. Such a
finding names the function the resumed frame is part of, the line that read the value, and how to keep it a tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, Evidence, Finding
from tputrace.store.aggregates import merged_ns
from tputrace.wording import format_ns, plural

ANALYZER = "guard_recompiles"
MIN_GUARD_FAILURES = 3
# `pos == 1  # kc[:, pos] = k[:, 0]  # llama.py:31 in forward (...)`: the guard, then the line that read the value.
_VALUE_GUARD = re.compile(r"^(?:\d+/\d+: )?(?P<name>[A-Za-z_][\w.\[\]'\"]*) == (?P<value>[^\s#]+)")
_SIZE_GUARD = re.compile(r"(?:size|stride) mismatch")
_READ_AT = re.compile(r"#\s*(?P<code>.+?)\s+#\s+\S*?(?P<where>[^/\s]+:\d+) in ")
# A value Dynamo passed a resumed frame on the stack (`___stack0[0]`): one computed where the graph broke.
_STACK_VALUE = re.compile(r"^___stack\d+")
_RESUMED = re.compile(r"^(?P<owner>.*?)torch_dynamo_resume_in_(?P<function>.+)_at_(?P<line>\d+)$")
_FLOAT = re.compile(r"^-?(?:\d+\.\d*|\.\d+|\d+(?:\.\d*)?[eE][-+]?\d+|inf|nan)$")
_LIMIT_HIT = re.compile(r"hit config\.(?P<limit>\w+) \((?P<value>\d+)\)\n\s*function: '[^']*' \((?P<where>.*:\d+)\)")


@dataclass(frozen=True)
class ValueGuardStorm:
    """One compiled function traced again per value of a Python argument: the value's name, the line reading it,
    the failures, their compiles' wall time, the call's frame and the Dynamo limit the calls hit, if any."""

    function: str
    defined_at: str  # path:line of the function, as Dynamo's warnings name it
    defined_where: str  # file.py:line
    value: str
    read_by: str | None  # the source line that read the value, as the guard quotes it
    read_where: str | None  # file.py:line of that source line
    failures: int
    compile_ns: int
    call_frame_id: int | None
    limit: str | None  # `recompile_limit (8)` when Dynamo stopped compiling the function
    guarded: str = ""  # the value the last failed guard compared with (`0.09`)

    @property
    def is_float(self) -> bool:
        """Whether the guarded value is a Python float (`lr == 0.09`), not an int position."""
        return _FLOAT.match(self.guarded) is not None

    @property
    def from_graph_break(self) -> bool:
        """Whether the value is one a resumed frame took from the stack at a graph break."""
        return _STACK_VALUE.match(self.value) is not None

    @property
    def shown_function(self) -> str:
        """The function as its user knows it: `Gated.forward after its graph break at line 20` for a resumed frame."""
        resumed = _RESUMED.match(self.function)
        if resumed is None:
            return self.function
        function = resumed["function"]
        while (inner := _RESUMED.match(function)) is not None:
            function = inner["function"]
        return f"{resumed['owner']}{function} after its graph break at line {resumed['line']}"


def storms(context: AnalysisContext) -> list[ValueGuardStorm]:
    """The rank's value-guard storms (cached on the context: the recompile limit's analyzer asks too)."""
    cached = context.cache.get("value_guard_storms")
    if cached is not None:
        return cached  # type: ignore[return-value]
    trace = context.trace
    by_function: dict[tuple[int | None, str], list[tuple[str, int, int]]] = {}
    for frame_id, name, diff, start_ns, dur_ns in trace.sql(
        "SELECT c.frame_id, n.text, d.text, c.start_ns, COALESCE(c.dur_ns, 0) FROM compiles c "
        "LEFT JOIN strings n ON n.id = c.name_sid LEFT JOIN strings d ON d.id = c.diff_sid "
        "WHERE c.rank = ? AND c.kind = 'dynamo_frame' AND c.reason = 'guard_failure' ORDER BY c.start_ns",
        (context.rank,),
    ):
        first_guard = (diff or "").split("\n", 1)[0]
        if _VALUE_GUARD.match(first_guard) and not _SIZE_GUARD.search(first_guard):
            by_function.setdefault((frame_id, name or "?"), []).append((first_guard, start_ns, dur_ns))
    found = [_storm(context, frame_id, name, failures) for (frame_id, name), failures in by_function.items()
             if len(failures) >= MIN_GUARD_FAILURES]
    context.cache["value_guard_storms"] = found
    return found


def findings(context: AnalysisContext) -> list[Finding]:
    return [_finding(context, storm) for storm in storms(context)]


def limit_hit_explained(context: AnalysisContext, function_at: str) -> bool:
    """Whether a value-guard storm's finding already tells that the function defined at `function_at`
    (`/path/train.py:26`, as Dynamo's warning names it) hit the recompile limit."""
    return any(storm.limit is not None and storm.defined_at == function_at for storm in storms(context))


def _storm(context: AnalysisContext, frame_id: int | None, name: str, failures: list[tuple[str, int, int]]) -> ValueGuardStorm:
    location = context.location(frame_id)
    defined_at = f"{location.file}:{location.line}" if location is not None else "?"
    first_start = failures[0][1]
    graphs = context.trace.sql(
        "SELECT c.frame_id, c.start_ns, COALESCE(c.dur_ns, 0) FROM compiles c JOIN strings n ON n.id = c.name_sid "
        "WHERE c.rank = ? AND c.kind IN ('aot', 'xla') AND substr(n.text, 1, ?) = ? ORDER BY c.start_ns",
        (context.rank, len(name) + 7, f"{name} graph "),
    )
    intervals = sorted([(start_ns, start_ns + dur_ns) for _, start_ns, dur_ns in failures]
                       + [(start_ns, start_ns + dur_ns) for _, start_ns, dur_ns in graphs if start_ns >= first_start])
    call_frame_id, limit = _limit_hit(context, defined_at)
    if call_frame_id is None:  # the first graph compiled at a line other than the function's own: its call
        defined_line = location.line if location is not None else None
        calls = [graph_frame for graph_frame, *_ in graphs
                 if (graph_location := context.location(graph_frame)) is not None and graph_location.line != defined_line]
        call_frame_id = calls[0] if calls else frame_id
    guard = _VALUE_GUARD.match(failures[-1][0])
    # Dynamo quotes the user's line in the first failures only; later ones may name its own code
    read = next((found for text, *_ in reversed(failures) if (found := _READ_AT.search(text)) is not None), None)
    return ValueGuardStorm(name, defined_at, context.where(frame_id), guard["name"] if guard else "?", read["code"] if read else None,
                           read["where"] if read else None, len(failures),
                           merged_ns(intervals), call_frame_id, limit, guard["value"] if guard else "")


def _limit_hit(context: AnalysisContext, defined_at: str) -> tuple[int | None, str | None]:
    """The frame of the call at which the function defined at `defined_at` hit a Dynamo limit, and the limit."""
    for text, frame_id in context.trace.sql(
        "SELECT s.text, a.frame_id FROM annotations a JOIN strings s ON s.id = a.name_sid "
        "WHERE a.rank = ? AND a.source = 'recompile_limit' ORDER BY a.start_ns", (context.rank,),
    ):
        hit = _LIMIT_HIT.search(text or "")
        if hit is not None and hit["where"] == defined_at:
            return frame_id, f"{hit['limit']} ({hit['value']})"
    return None, None


def _finding(context: AnalysisContext, storm: ValueGuardStorm) -> Finding:
    where = context.where(storm.call_frame_id)
    share = context.share_of_wall(storm.compile_ns)
    function = storm.shown_function
    limit = f", then hit Dynamo's {storm.limit.split(' ', 1)[0]}" if storm.limit else ""
    if storm.from_graph_break:
        read_by = (f"`{storm.read_by}` ({storm.read_where})" if storm.read_by and storm.read_where
                   else f"`{storm.read_by}`" if storm.read_by else "the line where the graph broke")
        explanation = (
            f"torch.compile specialised {function} on the number {read_by} read from a tensor: the graph broke there, the host read the value, and "
            f"Dynamo resumed the function with it as a Python constant (`{storm.value}`), so each call with another "
            f"value failed the guard `{storm.value} == ...`, and Dynamo traced the rest again and the backend compiled "
            f"the new graph: {plural(storm.failures, 'guard failure')}, {format_ns(storm.compile_ns)} of compiling "
            f"with the graphs' compiles ({share:.0%} of the run)."
        )
        suggestion = (
            f"Keep the value a tensor: compute it with tensor ops instead of reading it at {read_by} (no `.item()`, "
            "`float(tensor)`, `.tolist()` or numpy of a tensor), so the graph does not break there and takes the value "
            "as data; one graph then serves every value."
        )
        title = f"torch.compile traced {function} again for each number read from a tensor at {read_by}"
    else:
        read_by = f" (`{storm.read_by}` reads it)" if storm.read_by else ""
        explanation = (
            f"torch.compile specialised {function} on the Python value `{storm.value}`{read_by}: each call with "
            f"another value failed the guard `{storm.value} == ...`, and Dynamo traced the function again and the backend "
            f"compiled the new graph: {plural(storm.failures, 'guard failure')}, {format_ns(storm.compile_ns)} of "
            f"compiling with the graphs' compiles ({share:.0%} of the run)."
        )
        suggestion = _value_advice(storm.value, storm.is_float)
        title = f"torch.compile traced {function} again for each value of `{storm.value}` at {where}"
    if storm.limit:
        explanation += (f" Then Dynamo reached `torch._dynamo.config.{storm.limit.split(' ', 1)[0]}` "
                        f"({storm.limit.split(' ', 1)[1].strip('()')}): later calls with a new value run uncompiled, "
                        "their ops dispatched one by one.")
    return Finding(
        analyzer=ANALYZER,
        severity=context.severity(share),
        title=f"{title}: {plural(storm.failures, 'recompile')}{limit}",
        explanation=explanation,
        suggestion=suggestion,
        cost_total_ns=float(storm.compile_ns),
        cost_per_step_ns=context.per_step(storm.compile_ns),
        cost_basis=MEASURED_ON_HOST,
        evidence=(
            Evidence(f"{plural(storm.failures, 'value guard failure')} of {function} ({storm.defined_where}), each "
                     "tracing it again", table="compiles"),
            *((Evidence(f"Dynamo's {storm.limit} hit at {where}", table="annotations"),) if storm.limit else ()),
        ),
        **context.location_fields(storm.call_frame_id),
    )


def guarded_value(guard: str) -> tuple[str, str] | None:
    """A failed guard on a Python value (not a size), as Dynamo's recompile-limit warning gives it (`0/2: sigma == 0.2
    # return F.dropout(x, p=sigma)  # train.py:12 in noisy`): the guard in short (with the line that read the value,
    where it says) and how to keep the value from specialising the graph; None for another guard."""
    first = guard.split("\n", 1)[0]
    matched = _VALUE_GUARD.match(first)
    if matched is None or _SIZE_GUARD.search(first) or _STACK_VALUE.match(matched["name"]):
        return None
    read = _READ_AT.search(first)
    short = f"`{matched['name']} == {matched['value']}`" + (f", read by `{read['code']}` ({read['where']})" if read else "")
    return short, _value_advice(matched["name"], _FLOAT.match(matched["value"]) is not None)


def _value_advice(value: str, is_float: bool) -> str:
    """How to keep a Python value from specialising the compiled graph: a float as a 0-d tensor in arithmetic, an int
    position as a tensor in tensor ops."""
    if is_float:
        return _float_advice(value)
    return (
        f"Pass `{value}` to the compiled function as a tensor (`torch.tensor([{value}], device=...)`) and "
        "use it in tensor ops (`index_copy_` into a preallocated cache, a mask over its full length) instead of "
        "Python indexing and slicing, so one graph serves every value; a value that takes only a few settings may "
        "stay a Python value."
    )


def _float_advice(value: str) -> str:
    """How to keep a Python float (a learning rate, a temperature, a dropout probability) from specialising the graph:
    a 0-d tensor on the chip, used in tensor arithmetic rather than as an argument that takes a number."""
    return (
        f"Pass `{value}` to the compiled function as a 0-d tensor on the chip (`torch.tensor({value}, device=...)`, "
        "updated in place with `.fill_()` each step) and use it in tensor arithmetic, not as an argument that takes a "
        "Python number, which Dynamo specialises on (`p.sub_(lr * g)`, not `p.add_(g, alpha=-lr)`; a dropout mask "
        "`torch.rand_like(x) >= p` scaled by `1 / (1 - p)`, not `F.dropout(x, p)`): one graph then serves every value. A float that takes only a few settings may "
        "stay a Python value."
    )
