"""Export a trace as XProf files: `<logdir>/plugins/profile/<run>/<host>.xplane.pb`, one per rank.

TensorBoard's profile plugin and the standalone `xprof` server read these files; the format is
described in `shared/notes/xprof-format.md`. Each file holds one `XSpace` with:

- one `/device:TPU:<chip>` plane per chip (`xplane_device`), with the target chip's peaks as plane
  stats and three lines: `Steps` (one event per training step; the trailing `end` step only when
  there is no other), `XLA Modules` (one event per program execution) and `XLA Ops` (the ATen ops of
  each execution, or XLA's fusions when a program has no recorded ops);
- a `/host:CPU` plane with the Python side (`xplane_host`).

The device timeline, and what in it is an estimate, is `tputrace.derived.device_runs`. Nothing here
imports torch or jax; strings from the trace are only ever data.

A file is written in bounded memory: while the trace is read, each line's events and each plane's
event metadata wait in a spill folder next to the output (`xplane_line`, `xplane_builder`), which is
removed once the file is written; only interned metadata (ids by key, stat names) and capped caches
stay in memory.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from tputrace.derived.device_runs import scan_rank
from tputrace.derived.op_cost import TargetChip
from tputrace.derived.trace_tables import TraceTables
from tputrace import xplane_proto
from tputrace.viewers.export.hosts import default_run_name, host_names, safe_name
from tputrace.analysis.target import DEFAULT_TARGET, target_chip
from tputrace.viewers.export.xplane_device import DevicePlanes
from tputrace.viewers.export.xplane_host import HostPlane

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class RankExport:
    """What one host file holds: the rank, its host name (the file stem), its path and event counts."""

    rank: int
    host: str
    path: Path
    device_events: int
    host_events: int


def write_xspace(file: BinaryIO, tables: TraceTables, rank: int, chip: TargetChip, host: str, spill_folder: Path) -> tuple[int, int]:
    """Write the XSpace of one rank to `file`, keeping its lines' events in `spill_folder` until then;
    returns its device and host event counts."""
    trace = tables.trace
    run_rows = trace.sql("SELECT start_unix_ns, chips FROM runs WHERE rank = ?", (rank,))
    start_unix_ns = run_rows[0][0] if run_rows and run_rows[0][0] is not None else 0
    chip_count = run_rows[0][1] if run_rows and run_rows[0][1] else 0
    used = trace.sql(
        "SELECT DISTINCT chip FROM executions WHERE rank = ? UNION SELECT DISTINCT chip FROM ops WHERE rank = ? AND chip >= 0",
        (rank, rank),
    )
    chips = sorted(set(range(chip_count)) | {max(row[0], 0) for row in used if row[0] is not None}) or [0]
    device = DevicePlanes(tables, chips, chip, spill_folder)
    host_plane = HostPlane(tables, max(chips) + 1, spill_folder)

    def restart() -> None:
        device.clear()
        host_plane.clear_dispatch()

    scan_rank(tables, rank, chip, device.add_run, host_plane.add_dispatches, restart)
    # The device Steps line is what XProf's step-time figures count: the loop's steps, without the `end`
    # step (the work after the last optimizer step) unless the run has no other.
    device.add_steps(trace.sql(
        "SELECT step, start_ns, end_ns FROM steps WHERE rank = ? AND (source IS NOT 'end' OR NOT EXISTS "
        "(SELECT 1 FROM steps WHERE rank = ? AND source IS NOT 'end')) ORDER BY step", (rank, rank),
    ))
    host_plane.add_records(rank)
    device_events, host_events = device.event_count, host_plane.event_count
    # XSpace{planes = 1, hostnames = 4}: the host name first, as a message with only it serializes, then
    # each plane as a `planes` field.
    file.write(xplane_proto.messages()["XSpace"](hostnames=[host]).SerializeToString())
    device.write(file, start_unix_ns)
    host_plane.write(file, start_unix_ns)
    return device_events, host_events


# -- files ------------------------------------------------------------------------------------------
def export_tensorboard(trace: Trace, logdir: str | Path, *, run: str | None = None, target: str = DEFAULT_TARGET) -> list[RankExport]:
    """Write `<logdir>/plugins/profile/<run>/<host>.xplane.pb` for every rank and return what was written."""
    chip = target_chip(target)
    run_name = safe_name(run, "run") if run else default_run_name(trace)
    run_dir = Path(logdir) / "plugins" / "profile" / run_name
    new_folders = _missing_folders(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    exports: list[RankExport] = []
    try:
        tables = TraceTables(trace)
        for rank, host in host_names(trace).items():
            path = run_dir / f"{host}.xplane.pb"
            temporary = path.with_name(path.name + ".partial")
            try:
                # The lines' events wait next to the output (where there is room for it) until written.
                with tempfile.TemporaryDirectory(prefix=f".{host}.spill-", dir=run_dir) as spill, temporary.open("wb") as file:
                    device_events, host_events = write_xspace(file, tables, rank, chip, host, Path(spill))
                temporary.replace(path)
            finally:
                temporary.unlink(missing_ok=True)
            exports.append(RankExport(rank, host, path, device_events, host_events))
    except BaseException:
        _undo_export(exports, new_folders)
        raise
    return exports


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and those above it that do not exist yet, deepest first."""
    missing = []
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    return missing


def _undo_export(exports: list[RankExport], new_folders: list[Path]) -> None:
    """After a failed export: remove the ranks' files it wrote and the folders it made, so that a
    logdir does not show TensorBoard a run with some ranks or none."""
    for export in exports:
        export.path.unlink(missing_ok=True)
    for folder in new_folders:
        try:
            folder.rmdir()
        except OSError:
            break
