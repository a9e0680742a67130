"""`import_captures`: every capture under some paths, written into one new trace."""

from __future__ import annotations

import gc
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tputrace.importers import json_events, separate_runs
from tputrace.importers.collective_waits import fill_waits
from tputrace.importers.drop_ranks import drop_ranks
from tputrace.importers.sink import ImportSink
from tputrace.importers.sources import CHROME_JSON, TORCH_TRACE, XPLANE, Capture, find_captures
from tputrace.store.writer import TraceWriter

_WRITER_INTERVAL_S = 60.0


@dataclass(frozen=True)
class ImportResult:
    """What an import wrote."""

    output: Path
    captures: list[Capture]
    rows: int
    warnings: tuple[str, ...] = ()  # one line each, for stderr

    def lines(self) -> list[str]:
        kinds = ", ".join(f"{capture.format} {capture.path}" for capture in self.captures)
        return [f"imported {len(self.captures)} capture(s) ({kinds}): {self.rows} rows -> {self.output}"]


def import_captures(paths: list[str], output: str | Path) -> ImportResult:
    """Detect and import every capture under `paths` into a new trace at `output` (one rank per capture)."""
    captures = find_captures(paths)
    output = Path(output)
    partial = output.with_name(output.name + ".partial")
    # The collector is paused while importing: rows and decoded events are many small containers and make no
    # reference cycles, so its passes over them would find nothing to free.
    collecting = gc.isenabled()
    gc.disable()
    try:
        groups = _by_process(captures)
        sink = _write(groups, partial)
        kept, notes = _latest_runs(groups, partial, len(sink.sources))
        if len(kept) < len(groups):
            # Other runs' captures in a directory: their ranks are taken out of the trace written, not read again.
            dropped = [group for group in groups if group not in kept]
            sink.rows -= drop_ranks(partial, {rank for rank, group in enumerate(groups) if group in dropped})
            dropped_paths = tuple(str(capture.path) for group in dropped for capture in group)
            sink.warnings[:] = [line for line in sink.warnings if not line.startswith(dropped_paths)]
            kept_paths = {capture.path for group in kept for capture in group}
            captures = [capture for capture in captures if capture.path in kept_paths]
        _join_ranks(partial, len(kept), sink)
        sink.warnings[:0] = notes
        partial.replace(output)
    finally:
        if collecting:
            gc.enable()
        partial.unlink(missing_ok=True)
    return ImportResult(output, captures, sink.rows, tuple(sink.warnings))


def _write(groups: list[list[Capture]], partial: Path) -> ImportSink:
    """Import each group of captures as a rank into a new trace at `partial`."""
    partial.unlink(missing_ok=True)
    # Bulk mode (no fsync, journal in memory): the file is only renamed into place once complete. The writer's
    # thread commits when the sink wakes it (every so many rows), not on a timer.
    with TraceWriter(partial, close_at_exit=False, bulk=True, commit_interval_s=_WRITER_INTERVAL_S) as writer:
        sink = ImportSink(writer)
        json_events.skipped_events.clear()
        for group in groups:
            _import_one(sink, group)
        _note_skipped_events(sink)
        sink.finish()
    return sink


def _join_ranks(partial: Path, ranks: int, sink: ImportSink) -> None:
    """What needs the trace's every rank: the collectives' waits across ranks, the backward compiles of a profile's
    `TORCH_TRACE` log placed at their forwards'."""
    if ranks > 1:
        fill_waits(partial)
    if any("torch_trace" in source for source in sink.sources):
        from tputrace.importers.torch_trace import place_backward_compiles

        place_backward_compiles(partial)


def _latest_runs(groups: list[list[Capture]], partial: Path, ranks: int) -> tuple[list[list[Capture]], list[str]]:
    """The groups to keep, and a line for each directory that held several runs: of the captures found in one
    directory, those of processes that ran at other times than the latest run's (no overlap with its captures) are
    other runs, not more of its ranks, and are left out. Captures given by name are always kept."""
    if ranks != len(groups) or ranks < 2:  # rank k is the k-th group's
        return groups, []
    spans = separate_runs.rank_spans(partial)
    dropped: set[int] = set()
    notes = []
    folders = {capture.folder for group in groups for capture in group if capture.folder is not None}
    for folder in sorted(folders):
        found = [rank for rank, group in enumerate(groups) if rank in spans
                 and all(capture.folder == folder for capture in group)]
        runs = separate_runs.runs_in_time({rank: spans[rank] for rank in found})
        if len(runs) < 2:
            continue
        earlier = [capture.path for run in runs[:-1] for rank in run for capture in groups[rank]]
        dropped.update(rank for run in runs[:-1] for rank in run)
        latest = ", ".join(str(capture.path) for rank in runs[-1] for capture in groups[rank])
        notes.append(f"{folder}: holds {len(runs)} runs whose captures do not overlap in time; imported the latest "
                     f"({latest}), not the {len(earlier)} earlier file(s) ({earlier[0]}{', ...' if len(earlier) > 1 else ''}); "
                     "name a run's files or folder to import another")
    return [group for rank, group in enumerate(groups) if rank not in dropped], notes


def _note_skipped_events(sink: ImportSink) -> None:
    """Warn of the events of each rank's JSON files that did not decode and were skipped (`skipped_events` in its
    `meta.imported` entry)."""
    for source in sink.sources:
        paths = source.get("windows") or [source["path"]]
        skipped = sum(json_events.skipped_events.get(str(path), 0) for path in paths)
        if skipped:
            sink.note(source["rank"], skipped_events=skipped)
            sink.warn(f"{source['path']}: skipped {skipped} event(s) that do not decode as JSON (torch.profiler writes "
                      "some Python frames' names unescaped); the rest imported")


def _by_process(captures: list[Capture]) -> list[list[Capture]]:
    """The captures to import as one rank each: one file, or the files of one process: its torch.profiler files
    (the windows of a profiling schedule, which `tensorboard_trace_handler` writes a file each), with its
    TORCH_TRACE log where one has the same process id (the log's compiles, graph breaks and recompile reasons join
    the profile's ops and steps), or its XProf files (one per `jax.profiler.trace` session)."""
    from tputrace.importers import chrome_json, torch_trace, xplane_processes

    # Only XProf files that share a host name can be sessions of one process (reading the key costs a pass over
    # the planes' metadata).
    hosts = Counter(capture.path.name for capture in captures if capture.format == XPLANE)
    groups: dict[Any, list[Capture]] = {}
    for capture in captures:
        if capture.format == CHROME_JSON:
            key: tuple[Any, ...] = ("profiler", *chrome_json.process_key(capture.path))
        elif capture.format == XPLANE and hosts[capture.path.name] > 1:
            key = ("xplane", *xplane_processes.process_key(capture.path))
        else:
            key = ("file", capture.path)
        groups.setdefault(key, []).append(capture)
    profiles: dict[str, list[Any]] = {}
    for key in groups:
        if key[0] == "profiler" and key[2]:
            profiles.setdefault(key[2], []).append(key)
    for key in [key for key in groups if key[0] == "file" and groups[key][0].format == TORCH_TRACE]:
        matches = profiles.get(str(torch_trace.log_pid(key[1])), [])
        if len(matches) == 1:
            groups[matches[0]] += groups.pop(key)
    return list(groups.values())


def _import_one(sink: ImportSink, group: list[Capture]) -> None:
    capture = group[0]
    if capture.format == XPLANE:
        from tputrace.importers.xplane import XPlaneImporter

        XPlaneImporter(sink, [item.path for item in group]).run()
    elif capture.format == TORCH_TRACE:
        from tputrace.importers.torch_trace import TorchTraceImporter

        TorchTraceImporter(sink, capture.path).run()
    elif capture.format == CHROME_JSON:
        from tputrace.importers.chrome_json import ChromeJsonImporter
        from tputrace.importers.torch_trace import TorchTraceImporter

        logs = [item.path for item in group if item.format == TORCH_TRACE]
        profile = ChromeJsonImporter(sink, [item.path for item in group if item.format == CHROME_JSON],
                                     compiles_elsewhere=bool(logs))
        profile.run()
        for log in logs:
            TorchTraceImporter(sink, log, into=profile.clock()).run()
