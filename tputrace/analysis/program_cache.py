"""A program cache too small for the run: signatures compiled again only because the backend had
dropped their programs to stay within `TPUTRACE_MAX_PROGRAMS` kept programs.

Such a recompile's diff starts with `EVICTED_DIFF_PREFIX` and names the limit. The recompile-storm
analyzer leaves these rows out (no shape changed); here they are one finding: what they cost and
how many programs the run needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext, in_list
from tputrace.analysis.findings import MEASURED_ON_HOST, AnalysisResult, Evidence, Finding
from tputrace.schema import EVICTED_DIFF_PREFIX
from tputrace.wording import format_ns, plural

NAME = "program_cache"
_LIMIT = re.compile(r"keeps (\d+)")


@dataclass(frozen=True)
class ProgramCacheData:
    """Recompiles after an eviction from the program cache, their compile time, and the distinct programs
    the run compiled (0 when nothing was evicted)."""

    evicted_recompiles: int = 0
    evicted_compile_ns: int = 0
    distinct_programs: int = 0


def evicted_diff_ids(context: AnalysisContext) -> list[int]:
    """The string ids of the diffs that mark a recompile after an eviction."""
    rows = context.trace.sql(
        "SELECT id FROM strings WHERE substr(text, 1, ?) = ?", (len(EVICTED_DIFF_PREFIX), EVICTED_DIFF_PREFIX)
    )
    return [int(row[0]) for row in rows]


def analyze(context: AnalysisContext) -> AnalysisResult[ProgramCacheData]:
    trace, rank = context.trace, context.rank
    diff_ids = evicted_diff_ids(context)
    if not diff_ids:
        return AnalysisResult(NAME, ProgramCacheData())
    sites = trace.sql(
        f"SELECT c.name_sid, MIN(c.frame_id), COUNT(*), COALESCE(SUM(c.dur_ns), 0) FROM compiles c "
        f"LEFT JOIN frames f ON f.id = c.frame_id WHERE c.rank = ? AND c.diff_sid IN {in_list(diff_ids)} "
        "GROUP BY c.name_sid, f.file_sid, f.line, f.function_sid ORDER BY 4 DESC",  # by line, not by call
        (rank, *diff_ids),
    )
    if not sites:
        return AnalysisResult(NAME, ProgramCacheData())
    count = int(sum(row[2] for row in sites))
    total_ns = int(sum(row[3] for row in sites))
    distinct = int(trace.sql(
        "SELECT COUNT(*) FROM (SELECT DISTINCT name_sid, signature_sid, chip FROM compiles WHERE rank = ?)", (rank,)
    )[0][0])
    limits = {int(match[1]) for diff_id in diff_ids if (match := _LIMIT.search(trace.string(diff_id) or ""))}
    limit_text = f"{max(limits)}" if limits else "the limit"
    share = context.share_of_wall(total_ns)
    top_frame = sites[0][1]
    evidence = [
        context.evidence_at(
            f"{trace.string(name_sid) or '?'}: {plural(site_count, 'recompile')} after eviction, {format_ns(site_ns)}",
            frame_id, table="compiles",
        )
        for name_sid, frame_id, site_count, site_ns in sites[:5]
    ]
    evidence.append(Evidence(f"{distinct} distinct programs compiled in the run; the cache kept {limit_text}", table="compiles"))
    finding = Finding(
        analyzer=NAME,
        severity=context.severity(share),
        title=f"Program cache too small: {plural(count, 'program')} compiled again after being dropped",
        explanation=(
            f"The backend keeps at most {limit_text} compiled programs and drops the oldest past that. This run "
            f"compiled {distinct} distinct programs, so {plural(count, 'compile')} repeated a signature already compiled "
            f"once, only because its program had been dropped: {format_ns(total_ns)} of compiling ({share:.0%} of the run)."
        ),
        suggestion=(
            f"Set TPUTRACE_MAX_PROGRAMS above {distinct} (each kept program holds host memory; on XLA:CPU about four "
            f"of the 65,530 memory maps Linux allows a process), or give the shapes fewer distinct values."
        ),
        cost_total_ns=float(total_ns),
        cost_per_step_ns=context.per_step(total_ns),
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(evidence),
        **context.location_fields(top_frame),
    )
    return AnalysisResult(NAME, ProgramCacheData(count, total_ns, distinct), (finding,))
