"""A jitted function compiled again and again with the same input shapes (an imported capture's XLA compiles).

The shape storms need input signatures that differ; a JAX function recompiled every step for a new value of an
argument marked `static_argnums`/`static_argnames` (a step counter, a float learning rate), or jitted anew on every
call, keeps its signature. What changed is read from the programs' HLO (the import's `hlo_structure`,
`hlo_constants` and `constants` in each compile's detail): the same instructions with other constants (a Python value
traced in as a constant: a static argument, or a number the function closes over), another placement of its arrays
(another sharding or other devices, `placement_changes`), other instructions (a Python
value that chose what was traced: a branch, a loop's count), or the very same program (a new function object jitted
on each call: `jax.jit` of a lambda or a `functools.partial` made in the loop). A capture without the HLO says only
that the shapes did not change. One finding per function and signature compiled at least `MIN_COMPILES` times, two of
them after the warm-up step, costed at its recompiles."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from tputrace.analysis.context import AnalysisContext, detail_object, in_list
from tputrace.analysis.findings import MEASURED_ON_HOST, Evidence, Finding
from tputrace.analysis.imported import context_import_facts
from tputrace.analysis.placement_changes import placement_changes, placement_suggestion, placement_text, placement_what
from tputrace.analysis.storm_findings import StormCompiles, compile_cost_text, loop_steps_compiling, storm_severity
from tputrace.analysis.storms import NAME
from tputrace.wording import plural

MIN_COMPILES = 3
MIN_STEADY_COMPILES = 2
MAX_LISTED_VALUES = 8

Change = Literal["placement", "constants", "shapes", "ops", "same", "unknown"]


@dataclass(frozen=True)
class StaticRecompile:
    """A function compiled `compiles` times with one signature: what changed between its programs, and the values of
    the constants that changed (for `constants`), one tuple per constant position, in compile order."""

    function: str
    where: str
    signature: str
    change: Change
    compiles: int
    recompile_ns: int
    changing_values: tuple[tuple[str, ...], ...]

    @property
    def recompiles(self) -> int:
        return self.compiles - 1


@dataclass(frozen=True)
class _Row:
    compile_id: int
    program_id: int | None
    start_ns: int
    dur_ns: int
    step: int
    detail: dict[str, object]


def findings(context: AnalysisContext, explained: set[int], not_evicted_sql: str,
             evicted: list[int]) -> Iterator[tuple[Finding, StaticRecompile, set[int]]]:
    """The findings of XLA programs compiled again with the same input shapes, with their data and compile ids."""
    if context_import_facts(context) is None:
        return  # a recording's same-shape recompiles are its program cache's and structure changes' (other analyzers)
    first_steady = context.first_steady_after_warm_up
    groups: dict[tuple[int, int | None, int | None], list[_Row]] = defaultdict(list)
    for compile_id, program_id, name_sid, frame_id, signature_sid, start_ns, dur_ns, step, detail in context.trace.sql(
        "SELECT id, program_id, name_sid, frame_id, signature_sid, start_ns, dur_ns, step, detail FROM compiles "
        f"WHERE rank = ? AND kind = 'xla' AND {not_evicted_sql} ORDER BY start_ns", (context.rank, *evicted),
    ):
        if compile_id not in explained:
            groups[(name_sid, frame_id, signature_sid)].append(
                _Row(compile_id, program_id, int(start_ns or 0), int(dur_ns or 0), int(step or 0), detail_object(detail)))
    storm_steps = {int(step) for (step,) in context.trace.sql(
        f"SELECT DISTINCT step FROM compiles WHERE id IN {in_list(sorted(explained))}", tuple(sorted(explained)))
        } if explained else set()
    for (name_sid, frame_id, signature_sid), rows in groups.items():
        if len(rows) < MIN_COMPILES:
            continue
        steady = sum(row.step >= first_steady for row in rows) if first_steady is not None else None
        if steady is not None and steady < MIN_STEADY_COMPILES:
            continue
        if not context.steps and _compiled_after_a_run(context, rows) < MIN_STEADY_COMPILES:
            continue
        function = context.trace.string(name_sid) or "an XLA program"
        change, values = _change(rows)
        if change == "shapes" and {row.step for row in rows} <= storm_steps:
            continue  # the size another storm names (its compiles' steps) reaching a small program (`jnp.ones(n)`)
        storm = StaticRecompile(function, context.where(frame_id), context.trace.string(signature_sid) or "unknown",
                                change, len(rows), sum(row.dur_ns for row in rows[1:]), values)
        compiles = StormCompiles(len(rows), sum(row.dur_ns for row in rows), storm.recompile_ns,
                                 sorted({row.step for row in rows}), [row.compile_id for row in rows])
        yield _finding(context, storm, compiles, frame_id), storm, {row.compile_id for row in rows}


def _change(rows: list[_Row]) -> tuple[Change, tuple[tuple[str, ...], ...]]:
    """What differs between the programs of one signature, and the constants that took other values."""
    if any("hlo_structure" not in row.detail for row in rows):
        return "unknown", ()
    placement = placement_changes([row.detail for row in rows])
    if placement:
        return "placement", placement
    if len({str(row.detail["hlo_structure"]) for row in rows}) > 1:
        return ("shapes" if len({str(row.detail.get("hlo_opcodes")) for row in rows}) == 1 else "ops"), ()
    if len({str(row.detail.get("hlo_constants")) for row in rows}) == 1:
        return "same", ()
    constants = [tuple(str(value) for value in _listed_values(row.detail.get("constants"))) for row in rows]
    width = min(len(values) for values in constants)
    changing = tuple(column for column in zip(*(values[:width] for values in constants)) if len(set(column)) > 1)
    return "constants", changing


def _finding(context: AnalysisContext, storm: StaticRecompile, compiles: StormCompiles, frame_id: int | None) -> Finding:
    jax = storm.function.startswith(("jit_", "pmap_"))
    function = storm.function.removeprefix("jit_").removeprefix("pmap_") if jax else storm.function
    cause = {
        "placement": "its arrays' placement changed (" + placement_text(storm.changing_values) + ")",
        "constants": "a constant in its program changed" + _values_text(storm.changing_values),
        "shapes": "the shapes inside its program changed",
        "ops": "its traced operations changed",
        "same": "the same program was compiled again",
        "unknown": "something other than its input shapes changed",
    }[storm.change]
    title = (f"Recompilation storm: {storm.function} compiled {storm.compiles} times with the same input shapes "
             f"({storm.signature}): {cause}")
    what = {
        "placement": placement_what(storm.function),
        "constants": (f"Each program of {storm.function} has the same instructions but other constants: a Python value "
                      "was traced into it as a constant, and each new value compiles a new program. "
                      + ("In JAX that is an argument marked `static_argnums`/`static_argnames` whose value changes "
                         "from call to call (a step counter, a learning rate), or a function made anew on each call "
                         "(a lambda or `functools.partial` jitted in the loop) that closes over a changing number" if jax else
                         "That is a Python number in the traced step (a step counter, a learning rate) whose value "
                         "changes from call to call")),
        "shapes": (f"The programs of {storm.function} run the same instructions on arrays of other shapes, though its "
                   "inputs kept theirs: a size given as a Python value (" +
                   ("a `static_argnums`/`static_argnames` size, the shape given to `jnp.ones`, `jnp.zeros`, `reshape` "
                    "or `jnp.arange` called outside a jitted function, each of which JAX compiles as a small program "
                    "of its own)" if jax else "a shape given to a factory or a reshape)") + " changes from call to call, or an "
                   "input's sharding did (arrays placed with another sharding or on other devices: the program's "
                   "per-device shapes and shardings change with it)"),
        "ops": (f"The programs of {storm.function} run other instructions for the same input shapes: a Python value "
                "chose what was traced (a branch or a loop count on " +
                ("a `static_argnums`/`static_argnames` argument or a closed-over value)" if jax else "a Python value)")),
        "same": (f"Every program of {storm.function} is the same, instructions and constants: the compile cache missed "
                 "on the very same computation. " +
                 ("In JAX that is a new function object jitted on each call (`jax.jit(...)` inside the loop, a "
                  "lambda or a `functools.partial` made each step) or `jax.clear_caches()`" if jax else
                  "A new compiled callable is made on each call")),
        "unknown": (f"{storm.function}'s input shapes did not change, and the capture holds no HLO to tell what did: a "
                    "static argument's value, a closed-over Python value, or a new function jitted on each call"),
    }[storm.change]
    explanation = f"{what}. {compile_cost_text(context, compiles)}."
    evidence = [Evidence(f"{storm.function} at {storm.where}: {plural(storm.compiles, 'compile')} of the signature "
                         f"{storm.signature}", table="compiles", record_ids=tuple(compiles.compile_ids[:20]))]
    if storm.changing_values and storm.change == "placement":
        evidence += [Evidence(f"{values[0]} took {_listed(values[1:])}") for values in storm.changing_values[:3]]
    elif storm.changing_values:
        evidence += [Evidence(f"a constant of the program took {_listed(values)}") for values in storm.changing_values[:3]]
    return Finding(
        analyzer=NAME,
        severity=storm_severity(context, compiles.recompile_ns, loop_steps_compiling(context, compiles)),
        title=title,
        explanation=explanation,
        suggestion=_suggestion(storm.change, function, jax),
        cost_total_ns=float(compiles.recompile_ns),
        cost_per_step_ns=context.per_step(compiles.recompile_ns),
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(evidence),
        **context.location_fields(frame_id),
    )


def _suggestion(change: Change, function: str, jax: bool) -> str:
    if change == "placement":
        return placement_suggestion(function)
    if not jax:
        return ("Pass the changing value as a tensor (on the device) rather than a Python number, so that it is an "
                "input of the program, not a constant in it; keep Python values only for what takes a few values.")
    traced = (f"Pass the changing value to {function} as a traced argument instead: drop it from `static_argnums`/"
              "`static_argnames` (`static_broadcasted_argnums` of `jax.pmap`) and pass it as an array (`jnp.asarray(lr, jnp.float32)`, the step as "
              "`jnp.int32(step)`), or let an optax schedule compute it from the step count inside the function")
    if change == "constants":
        return traced + "; keep static only arguments that take a few values (a mode flag, a size)."
    if change == "shapes":
        return (f"Keep the size that reaches {function} to a few values: pad it to a few buckets (each compiles once), "
                "or make the array inside the jitted step from the shape of an input it already takes "
                "(`jnp.zeros_like(x)`, `jnp.ones(x.shape[0])`), so that the size is the input's, not a new constant.")
    if change == "ops":
        return (traced + "; where the value chooses a branch or a loop count, use `jax.lax.cond` / `jax.lax.switch` or "
                "`jax.lax.fori_loop` on the traced value, or keep the static values to a few (one program each).")
    if change == "same":
        return (f"Jit {function} once, outside the loop (`step = jax.jit(step)` at the top level or as a decorator), "
                "and call that same object each step; pass values that change as arguments, not through a new "
                "`functools.partial` or lambda per call.")
    return (traced + "; if the function is jitted inside the loop, jit it once outside it. A capture with the "
            "programs' HLO (`jax.profiler.trace` of JAX 0.4 or later) tells which of the two it is.")


def _listed_values(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _values_text(values: tuple[tuple[str, ...], ...]) -> str:
    return f" ({_listed(values[0])})" if values else ""


def _listed(values: tuple[str, ...]) -> str:
    shown = ", ".join(values[:MAX_LISTED_VALUES])
    return shown + (f", ... ({len(values)} values)" if len(values) > MAX_LISTED_VALUES else "")


def _compiled_after_a_run(context: AnalysisContext, rows: list[_Row]) -> int:
    """How many of the compiles came after one of the programs had run: in a run without steps this tells compiles
    that keep coming as the loop runs from programs compiled one after another before it."""
    program_ids = [row.program_id for row in rows if row.program_id is not None]
    if not program_ids or not context.trace.has_table("executions"):
        return len(rows)
    ((first_run,),) = context.trace.sql(
        f"SELECT MIN(start_ns) FROM executions WHERE rank = ? AND program_id IN {in_list(program_ids)}",
        (context.rank, *program_ids))
    return len(rows) if first_run is None else sum(row.start_ns > first_run for row in rows)


