"""Performance budgets: limits a run must keep, read from a TOML file or given as keyword arguments (the
pytest marker's), and the violations of a run's figures against them.

Keys (all optional): `max_recompiles` (compiles after warm-up that are not a program's first),
`max_syncs_per_step` and `max_transfers_per_step` (per steady step), `max_cpu_fallbacks`,
`max_compile_seconds`, `max_step_time_ratio` (steady step time over a baseline run's),
`max_peak_memory_bytes`, `max_exposed_communication_share` (0 to 1).

A limit on a figure the trace does not record (an imported capture without syncs, say) cannot be checked: it is
reported as a violation that says so, never passed on a count of 0.
"""

from __future__ import annotations

import difflib
import math
import sys
from dataclasses import dataclass
from typing import Any

from tputrace.compare.figures import RunFigures
from tputrace.store.errors import TputraceError
from tputrace.wording import format_bytes, plural

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

BUDGET_KEYS: dict[str, type] = {
    "max_recompiles": int,
    "max_syncs_per_step": float,
    "max_transfers_per_step": float,
    "max_cpu_fallbacks": int,
    "max_compile_seconds": float,
    "max_step_time_ratio": float,
    "max_peak_memory_bytes": int,
    "max_exposed_communication_share": float,
}
# Each key -> the figure it limits (`RunFigures.unrecorded` names).
LIMITED_FIGURES: dict[str, str] = {
    "max_recompiles": "recompiles after warm-up",
    "max_syncs_per_step": "host syncs",
    "max_transfers_per_step": "transfers",
    "max_cpu_fallbacks": "CPU fallbacks",
    "max_compile_seconds": "compile time",
    "max_peak_memory_bytes": "peak memory",
    "max_exposed_communication_share": "exposed communication share",
}
# Keys whose limit is a share of the step, 0 to 1.
SHARE_KEYS = frozenset({"max_exposed_communication_share"})
# Why a per-step limit cannot be checked on a run without a step after warm-up (a test of one step).
_NO_STEADY_STEP = ("no step after warm-up to count {what} in (the run has {steps}; `optimizer.step()` or"
                   " `tputrace.step()` ends a step, so run at least two)")
# How many recompiles a `max_recompiles` violation names, each with its step, line and what changed.
NAMED_RECOMPILES = 3


@dataclass(frozen=True)
class Violation:
    """One limit a run broke, with the finding behind it and its source line when known; `value` None: the
    trace does not record the figure, so the limit cannot be checked."""

    key: str
    limit: float
    value: float | None
    message: str
    site: str | None = None

    def describe(self) -> str:
        where = f" at {self.site}" if self.site else ""
        outcome = "cannot be checked" if self.value is None else "exceeded"
        return f"{self.key} = {self.limit:g} {outcome}: {self.message}{where}"


def budget_from_mapping(values: dict[str, Any], origin: str) -> dict[str, float]:
    """Validated limits from `values`; a `TputraceError` of one line names an unknown key or a bad value."""
    budget: dict[str, float] = {}
    for key, value in values.items():
        if key not in BUDGET_KEYS:
            close = difflib.get_close_matches(key.lower(), BUDGET_KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise TputraceError(f"{origin}: unknown budget key {key!r} ({hint}known: {', '.join(BUDGET_KEYS)})")
        kind = BUDGET_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise TputraceError(f"{origin}: {key} must be {'a whole number' if kind is int else 'a number'}, not {value!r}")
        if math.isnan(value):
            raise TputraceError(f"{origin}: {key} must be a number, not nan (no run can be compared with it)")
        if value < 0:
            raise TputraceError(f"{origin}: {key} must not be negative, not {value!r}")
        if key in SHARE_KEYS and value > 1:
            raise TputraceError(f"{origin}: {key} is a share of the step from 0 to 1, not {value!r}"
                                f" (write {value / 100:g} for {value:g}%)")
        budget[key] = value
    return budget


def read_budget(path: str) -> dict[str, float]:
    """The limits in the TOML file at `path`."""
    try:
        with open(path, "rb") as handle:
            values = tomllib.load(handle)
    except OSError as error:
        raise TputraceError(f"cannot read budget {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise TputraceError(f"{path}: not valid TOML: {error}") from None
    except UnicodeDecodeError:
        raise TputraceError(f"{path}: not a budget file (not UTF-8 text, as TOML is)") from None
    return budget_from_mapping(values, path)


def violations(figures: RunFigures, budget: dict[str, float], baseline: RunFigures | None = None) -> list[Violation]:
    """The limits of `budget` that `figures` break, or that it cannot be checked against (a figure the trace does
    not record); `max_step_time_ratio` needs `baseline`."""
    found = [Violation(key, limit, None, f"the trace does not record {figure} ({figures.unrecorded[figure]})")
             for key, limit in budget.items()
             if (figure := LIMITED_FIGURES.get(key)) is not None and not figures.records(figure)]
    budget = {key: limit for key, limit in budget.items() if LIMITED_FIGURES.get(key) not in figures.unrecorded}
    if "max_recompiles" in budget and len(figures.recompiles_after_warmup) > budget["max_recompiles"]:
        recompiles = figures.recompiles_after_warmup
        named = "; ".join(f"{recompile.name or 'a program'} in step {recompile.step}"
                          f" ({recompile.diff or recompile.reason or 'unknown reason'})"
                          + (f" at {recompile.site}" if recompile.site else "")
                          for recompile in recompiles[:NAMED_RECOMPILES])
        more = f"; {len(recompiles) - NAMED_RECOMPILES} more" if len(recompiles) > NAMED_RECOMPILES else ""
        found.append(Violation("max_recompiles", budget["max_recompiles"], len(recompiles),
                               f"{len(recompiles)} recompile(s) after warm-up: {named}{more}"))
    elif "max_recompiles" in budget and not figures.steady_steps and figures.warmup_recompiles:
        # A run of no step after warm-up (a test of forward passes) holds every recompile in its warm-up: 0 after it
        # says nothing of the ones it made.
        found.append(Violation("max_recompiles", budget["max_recompiles"], None, _NO_STEADY_STEP.format(
            steps=plural(figures.steps, "step"), what="recompiles")
            + f"; its {plural(figures.warmup_recompiles, 'recompile')} came in the warm-up"))
    for key, count, what in (("max_syncs_per_step", figures.steady_syncs, "host syncs"),
                             ("max_transfers_per_step", figures.steady_transfers, "transfers")):
        if key in budget and not figures.steady_steps:
            found.append(Violation(key, budget[key], None, _NO_STEADY_STEP.format(steps=plural(figures.steps, "step"),
                                                                                   what=what)))
        elif key in budget and figures.per_steady_step(count) > budget[key]:
            table = "syncs" if what == "host syncs" else "transfers"
            site = _finding_site(figures, table) or figures.busiest_steady_lines.get(table)
            found.append(Violation(key, budget[key], figures.per_steady_step(count),
                                   f"{figures.per_steady_step(count):.3g} {what} per steady step", site))
    if "max_cpu_fallbacks" in budget and figures.fallbacks > budget["max_cpu_fallbacks"]:
        found.append(Violation("max_cpu_fallbacks", budget["max_cpu_fallbacks"], figures.fallbacks,
                               f"{figures.fallbacks} CPU fallback(s)", _finding_site(figures, "fallbacks")))
    if "max_compile_seconds" in budget and figures.compile_ns / 1e9 > budget["max_compile_seconds"]:
        found.append(Violation("max_compile_seconds", budget["max_compile_seconds"], figures.compile_ns / 1e9,
                               f"compiling took {figures.compile_ns / 1e9:.3g} s"))
    if "max_step_time_ratio" in budget:
        if baseline is None:
            raise TputraceError("max_step_time_ratio needs a baseline trace (--baseline)")
        median_ns, baseline_median_ns = figures.median_step_ns, baseline.median_step_ns
        if not median_ns or not baseline_median_ns:
            stepless = " and ".join(name for name, median in (("the trace", median_ns), ("the baseline", baseline_median_ns))
                                    if not median)
            found.append(Violation("max_step_time_ratio", budget["max_step_time_ratio"], None,
                                   f"{stepless} {'have' if ' and ' in stepless else 'has'} no timed step"))
        else:
            ratio = median_ns / baseline_median_ns
            if ratio > budget["max_step_time_ratio"]:
                found.append(Violation("max_step_time_ratio", budget["max_step_time_ratio"], ratio,
                                       f"steady step time is {ratio:.3g}x the baseline's"))
    if "max_peak_memory_bytes" in budget and figures.peak_memory_bytes > budget["max_peak_memory_bytes"]:
        found.append(Violation("max_peak_memory_bytes", budget["max_peak_memory_bytes"], figures.peak_memory_bytes,
                               f"peak memory {format_bytes(figures.peak_memory_bytes)}"))
    share_key = "max_exposed_communication_share"
    if share_key in budget and figures.exposed_communication_share > budget[share_key]:
        found.append(Violation(share_key, budget[share_key], figures.exposed_communication_share,
                               f"collectives take {figures.exposed_communication_share:.0%} of the step",
                               _finding_site(figures, "collectives")))
    return found


def _finding_site(figures: RunFigures, analyzer: str) -> str | None:
    for item in figures.findings:
        finding = item.finding
        if finding.analyzer == analyzer and finding.file is not None:
            return f"{finding.file}:{finding.line} ({finding.title})"
    return None
