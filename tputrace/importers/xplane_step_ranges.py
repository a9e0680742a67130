"""Steps of an XProf capture without step markers, from the user's TraceMe range around each iteration
(`jax.profiler.TraceAnnotation("train_step")`, a `StepTraceAnnotation` without `step_num`): a range of one name (or
of names that differ only in their numbers, `TraceAnnotation(f"step {i}")`: `range_names`) repeated one after another at the top level of the host's main Python thread (the line making most of JAX's jitted
calls and program launches), as torch.profiler's captures get theirs from a repeated `record_function` range
(`window_ranges`). JAX's and XLA's own TraceMes are never steps: the names of JAX's calls and compiles and of XLA's C++
scopes (`PjitFunction(step)`, `…::ExecuteHelper…`) are left out, and a step's range holds a jitted call or launch of the
line (a top-level `CommonPjRtBuffer::Await` of `block_until_ready` holds none)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from tputrace.importers.range_names import OWN_TRACEME, family_label, range_keys
from tputrace.importers.step_markers import StepMarkers
from tputrace.importers.xevents import isin_few

_MIN_REPEATS = 2

# A top-level range of a line: (start ns, end ns, name, whether it holds a jitted call or launch of the line).
TopRange = tuple[int, int, str, bool]


@dataclass
class LineRanges:
    """A host line's top-level TraceMe ranges (user-named ones only) and how many jitted calls and launches it made.
    The ranges are kept as blocks of integer columns (32 bytes a range; a capture's worker threads can hold a range
    per collective) and made tuples only for the lines that `TraceMeRanges.steps` reads."""

    calls: int = 0  # JAX's jitted calls (`PjitFunction(step)`), made on the thread running the user's Python
    work: int = 0  # those and the program launches
    names: dict[str, int] = field(default_factory=dict)  # a range's name -> its number
    # (4, n) int64 blocks: start ns, end ns, the name's number, whether it holds a jitted call or launch (1 or 0).
    blocks: list[np.ndarray] = field(default_factory=list)

    def add(self, starts: np.ndarray, ends: np.ndarray, names: list[str], name_of_range: np.ndarray,
            holds: np.ndarray) -> None:
        """Add ranges, each named by `names[name_of_range[i]]`."""
        if not len(starts):
            return
        numbers = np.array([self.names.setdefault(name, len(self.names)) for name in names], dtype=np.int64)
        self.blocks.append(np.stack([starts, ends, numbers[name_of_range], holds.astype(np.int64)]))

    def extend(self, other: LineRanges, offset: int) -> None:
        """Add `other`'s ranges, moved by `offset` ns."""
        names = list(other.names)
        for block in other.blocks:
            self.add(block[0] + offset, block[1] + offset, names, block[2], block[3])

    def ranges(self) -> list[TopRange]:
        names = list(self.names)
        return [(start, end, names[number], bool(holds)) for block in self.blocks
                for start, end, number, holds in zip(*block.tolist())]


def top_level(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Indices of the ranges not inside or overlapping an earlier-starting range of the same line, in start order."""
    order = np.lexsort((-ends, starts))
    ordered_ends = ends[order]
    open_until = np.maximum.accumulate(np.concatenate(([np.iinfo(np.int64).min], ordered_ends[:-1])))
    return order[starts[order] >= open_until]


def line_ranges(starts: np.ndarray, ends: np.ndarray, metadata_ids: np.ndarray, name_of: Callable[[int], str],
                work_starts: np.ndarray, calls: int) -> LineRanges:
    """A line's `LineRanges` from its TraceMe events (start and end ns, event metadata id, named by `name_of`; the
    Python tracer's frames and XLA's ops left out), the starts of its jitted calls and launches, and how many of them
    are jitted calls."""
    work_starts = np.sort(work_starts)
    found = LineRanges(calls=calls, work=len(work_starts))
    top = top_level(starts, ends)
    top_ids = metadata_ids[top]
    user_ids = [key for key in np.unique(top_ids).tolist() if not OWN_TRACEME.search(name_of(key))]
    kept = top[isin_few(top_ids, user_ids)]
    kept_starts, kept_ends = starts[kept], ends[kept]
    holds = np.searchsorted(work_starts, kept_starts) < np.searchsorted(work_starts, kept_ends, side="right")
    found.add(kept_starts, kept_ends, [name_of(key) for key in user_ids],
              np.searchsorted(np.array(user_ids, dtype=metadata_ids.dtype), metadata_ids[kept]), holds)
    return found


@dataclass
class TraceMeRanges:
    """The top-level TraceMe ranges of a capture's host lines, per file (a profiling session) and line
    (plane name, line name)."""

    lines: dict[tuple[int, str, str], LineRanges] = field(default_factory=dict)

    def add(self, session: int, plane: str, line: str, ranges: LineRanges, offset: int = 0) -> None:
        """Add a line's ranges of session `session`, moved by `offset` ns (onto the Unix clock)."""
        entry = self.lines.setdefault((session, plane, line), LineRanges())
        entry.extend(ranges, offset)
        entry.calls += ranges.calls
        entry.work += ranges.work

    def extend(self, other: TraceMeRanges, session: int, offset: int) -> None:
        for (_, plane, line), ranges in other.lines.items():
            self.add(session, plane, line, ranges, offset)

    def steps(self) -> tuple[str, StepMarkers] | None:
        """The name of the range taken as the steps and the steps (no numbers): on the main Python thread (the line with
        most jitted calls, else launches), of its repeated user ranges holding such work (a name's numbers aside), the
        name covering the most
        time by its occurrences' median (a first iteration's compile in a `load` range beside the step's does not
        outweigh the step); None where no range qualifies."""
        threads: dict[tuple[str, str], tuple[int, int]] = {}  # (plane, line) -> (jitted calls, and launches)
        for (_, plane, line), ranges in self.lines.items():
            calls, work = threads.get((plane, line), (0, 0))
            threads[(plane, line)] = (calls + ranges.calls, work + ranges.work)
        if not threads:
            return None
        main = max(threads, key=lambda thread: (*threads[thread], thread[1] == "python"))
        durations: dict[tuple[str, str, str], list[int]] = {}  # (plane, line, name) -> each occurrence's length
        holding: set[tuple[str, str, str]] = set()  # those of which an occurrence holds a jitted call or launch
        main_ranges = [ranges.ranges() for (_, plane, line), ranges in self.lines.items() if (plane, line) == main]
        keys = range_keys(name for tops in main_ranges for _, _, name, _ in tops)
        plane, line = main
        for tops in main_ranges:
            for start, end, name, holds in tops:
                durations.setdefault((plane, line, keys[name]), []).append(end - start)
                if holds or not threads[main][1]:
                    holding.add((plane, line, keys[name]))
        candidates = {key: len(lengths) * float(np.median(lengths)) for key, lengths in durations.items()
                      if len(lengths) >= _MIN_REPEATS and key in holding}
        if not candidates:
            return None
        plane, line, family = max(candidates, key=lambda key: (candidates[key], len(durations[key])))
        markers = StepMarkers()
        names = []
        for (_, other_plane, other_line), ranges in sorted(self.lines.items()):
            if (other_plane, other_line) == (plane, line):
                chosen = [(start, end, other) for start, end, other, _ in sorted(ranges.ranges()) if keys[other] == family]
                names += [other for _, _, other in chosen]
                _contiguous(markers, [(start, end) for start, end, _ in chosen])
        return family_label(names), markers


def _contiguous(markers: StepMarkers, ranges: Iterable[tuple[int, int]]) -> None:
    """Steps of one session from its occurrences of the step range: each ends where its range ends, and each after
    the first starts where the one before it ended (work between two ranges is in the step it prepares)."""
    previous_end = None
    for start, end in ranges:
        markers.add(start if previous_end is None else previous_end, end, None)
        previous_end = end
