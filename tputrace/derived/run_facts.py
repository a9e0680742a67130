"""The run and the trace file: what every view shows first."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.imported_sources import imported_device, measured_on, recorded_windows_ns
from tputrace.derived.recording_window import RecordingWindow, recording_window
from tputrace.derived.chip_pace import ChipPace, chip_pace
from tputrace.derived.eager_modes import eager_mode_spans, eager_modes_text
from tputrace.derived.steps import loop_step_durations, steady_median_ns

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class RunFacts:
    """One rank's run (or the first run, for the whole trace) and the file's facts.

    `rank` is None and `wall_ns` covers every rank when the facts are of the whole trace.
    """

    path: str
    size_bytes: int
    created: str | None
    ranks: tuple[int, ...]
    rank: int | None
    script: str | None
    argv: tuple[str, ...]
    cwd: str | None
    host: str | None
    platform: str | None
    eager_mode: str | None
    chips: int | None
    world_size: int | None
    versions: str
    wall_ns: int
    steps: int  # training-loop steps of `rank` (None: of the first run), as every view counts them
    median_step_ns: int | None  # the median steady step (the first, compiling step left out)
    finished: bool
    exit_status: int | None
    error: str | None
    counts: dict[str, int]
    recording_window: RecordingWindow | None = None  # the steps a `--steps`/`--schedule`/`--from-code` run kept (None: all)
    imported: bool = False  # written by `tputrace import` from another tool's capture
    imported_device: str | None = None  # the device an imported rank's times were measured on (cpu, gpu, tpu, host)
    chip_pace: ChipPace | None = None  # the chip's time per step where the host ran ahead of it (None: it did not)
    recorded_ns: int | None = None  # an import's profiling windows' time, without the gaps between them (None: one window)
    eager_modes: str | None = None  # the modes the ops ran in, in order (`eager_modes_text`); `eager_mode` is the last

    @property
    def measured_on(self) -> str:
        """Where the run's times were measured: this host, or an imported capture's device."""
        return measured_on(self.imported_device)


def default_rank(trace: Trace) -> int:
    """The rank a view shows first: 0, or the lowest recorded rank."""
    ranks = trace.ranks
    return 0 if 0 in ranks else ranks[0]


def run_facts(trace: Trace, rank: int | None = None) -> RunFacts:
    """The run of `rank` (None: the trace's first run, with the whole trace's wall time) and the file's
    facts. Cheap: no scan of the event tables."""
    run = trace.run if rank is None else next((candidate for candidate in trace.runs if candidate.rank == rank), trace.run)
    try:
        size_bytes = os.path.getsize(trace.path)
    except OSError:
        size_bytes = 0
    versions = ", ".join(
        f"{name} {version}"
        for name, version in (("torch", run.torch_version), ("jax", run.jax_version), ("tputrace", run.tputrace_version))
        if version
    )
    step_durations = loop_step_durations(trace, run.rank if rank is None else rank)
    return RunFacts(
        path=str(trace.path),
        size_bytes=size_bytes,
        created=trace.created,
        ranks=tuple(trace.ranks),
        rank=rank,
        script=run.script,
        argv=tuple(run.argv),
        cwd=run.cwd,
        host=run.host,
        platform=run.platform,
        eager_mode=run.eager_mode,
        chips=run.chips,
        world_size=run.world_size,
        versions=versions,
        wall_ns=trace.wall_ns(rank=rank),
        steps=len(step_durations),
        median_step_ns=steady_median_ns(step_durations),
        finished=run.finished,
        exit_status=run.exit_status,
        error=run.error,
        counts=trace.counts(),
        recording_window=recording_window(trace),
        imported=bool(trace.meta.get("imported")),
        imported_device=imported_device(trace, rank),
        chip_pace=chip_pace(trace, run.rank if rank is None else rank),
        recorded_ns=recorded_windows_ns(trace, run.rank if rank is None else rank),
        eager_modes=eager_modes_text(eager_mode_spans(trace, run)),
    )


def rank_offsets(trace: Trace) -> dict[int, int]:
    """Per rank, ns to add to its event times to put every rank on one clock (the earliest rank's)."""
    starts = {rank: start for rank, start in trace.sql("SELECT rank, start_unix_ns FROM runs") if start is not None}
    if not starts:
        return {}
    earliest = min(starts.values())
    return {rank: start - earliest for rank, start in starts.items()}
