"""What a report can say about a rank imported from another tool's capture (`tputrace import`):
where it came from, the device its times were measured on, and which analyzers cannot run on it.

An analyzer runs on an imported rank only when the capture filled every table it reads; those that
need what only tputrace's own recording records (its index checks, its compile cache) never run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tputrace.derived.imported_sources import imported_source
from tputrace.store.reader import Trace

if TYPE_CHECKING:
    from tputrace.analysis.context import AnalysisContext

# Analyzer name -> tables it needs rows in (None: it needs tputrace's own recording).
NEEDS: dict[str, tuple[str, ...] | None] = {
    "no_device_ops": None,
    "index_errors": None,
    "recompiles": ("compiles",),
    "guard_recompiles": ("compiles",),
    "recompile_limit": ("annotations",),  # Dynamo's limit warning: a recording's, or a TORCH_TRACE log's failed compile
    "program_cache": ("flushes",),
    "set_up_work": ("flushes",),
    "step_tail": ("flushes",),
    "remade_optimizers": None,  # the state-making flushes and the run's copy of the source
    "compile_cache": None,
    "graph_breaks": ("compiles",),
    "syncs": ("syncs",),
    "fallbacks": ("fallbacks",),
    "fusion": ("flushes",),
    "padding": ("flushes",),
    "frozen_backward": ("buffers",),  # the optimizer's labels of parameters, gradients and state
    "precision": ("flushes",),
    "host_bound": ("steps", "executions"),
    "input_wait": ("annotations",),
    "transfers": ("transfers",),
    "data_movement": ("executions",),
    "memory": ("memory",),
    "collectives": ("collectives",),
    "sharding": ("collectives",),
}

# What a torch.profiler capture imported without its process's TORCH_TRACE log cannot tell of torch.compile.
COMPILE_OUTCOMES = "torch.compile's errors and graph breaks"
NEEDS_TORCH_TRACE = ("a torch.profiler capture records neither: import the process's TORCH_TRACE log (`TORCH_TRACE=DIR`) "
                     "with it; a compile inside the profile that leaves no compiled code that ran is told")

# Analyzers that a format's rows would mislead, with the reason.
MISLEADS: dict[str, dict[str, str]] = {
    # The host-bound model reads `ops` as host dispatch; an XProf import's ops are device op times.
    "xplane": {"host_bound": "its ops are device op times, not host dispatch"},
}


@dataclass(frozen=True)
class ImportFacts:
    """An imported rank: its capture's format, path and device, and the analyzers that cannot run on it."""

    format: str
    path: str
    device: str
    skipped: dict[str, str] = field(default_factory=dict)

    def plain_data(self) -> dict[str, object]:
        return {"format": self.format, "path": self.path, "device": self.device, "skipped": dict(self.skipped)}


def context_import_facts(context: AnalysisContext) -> ImportFacts | None:
    """`import_facts` of the context's rank, read once per analysis (analyzers ask for it per finding)."""
    if "import_facts" not in context.cache:
        context.cache["import_facts"] = import_facts(context.trace, context.rank)
    facts = context.cache["import_facts"]
    return facts if isinstance(facts, ImportFacts) else None


def import_facts(trace: Trace, rank: int) -> ImportFacts | None:
    """The facts of `rank` when the trace was imported (None for a trace tputrace recorded)."""
    source = imported_source(trace, rank)
    if source is None:
        return None
    fmt = str(source.get("format", "?"))
    skipped: dict[str, str] = dict(MISLEADS.get(fmt, {}))
    for name, tables in NEEDS.items():
        if name in skipped:
            continue
        if tables is None:
            skipped[name] = "needs a tputrace recording"
            continue
        missing = [table for table in tables if not trace.count(table, where="rank = ?", params=(rank,))]
        if missing:
            skipped[name] = f"the capture has no {', '.join(missing)}"
    if fmt == "torch_profiler_json" and "torch_trace" not in source:
        skipped[COMPILE_OUTCOMES] = NEEDS_TORCH_TRACE
    return ImportFacts(fmt, str(source.get("path", "?")), str(source.get("device", "?")),
                       skipped)


JAX_PROGRAM_PREFIXES = ("jit_", "pmap_", "xmap_")  # JAX names an XLA module for its transformation and function


def jax_capture(context: AnalysisContext, program_names: list[str] | None = None) -> bool:
    """Whether the rank is an XProf capture of JAX programs (a jitted function's module, `jit_step`), for advice in
    JAX's terms rather than PyTorch's; `program_names`: the programs a finding is about, else any of the rank's."""
    facts = context_import_facts(context)
    if facts is None or facts.format != "xplane":
        return False
    if program_names is None:
        program_names = [str(name) for (name,) in context.trace.sql(
            "SELECT DISTINCT s.text FROM compiles c JOIN strings s ON s.id = c.name_sid WHERE c.rank = ? "
            "UNION SELECT DISTINCT s.text FROM programs p JOIN strings s ON s.id = p.name_sid WHERE p.rank = ? LIMIT 50",
            (context.rank, context.rank))]
    return any(name.startswith(JAX_PROGRAM_PREFIXES) for name in program_names)

