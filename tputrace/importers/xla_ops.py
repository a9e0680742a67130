"""What an XLA op's events tell beyond their stats: the collective an op is, known by its name where it carries
no `hlo_category` (XLA:CPU), and each op's self time where control flow nests ops on a line."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

# `hlo_category` -> `collectives.kind`.
COLLECTIVE_CATEGORIES = {
    "all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
    "all-to-all": "all_to_all", "collective-permute": "collective_permute",
}
_CATEGORY_OF_KIND = {kind: category for category, kind in COLLECTIVE_CATEGORIES.items()}
# A collective's HLO name where its op carries no `hlo_category` (XLA:CPU's host-thread ops): XLA's opcode
# (`all-reduce.3`) or JAX's primitive (`psum.3`, `psum_invariant.7`, `all_gather.2`, `ppermute`), with an
# asynchronous pair's `-start` (its `-done` only waits, and is left out).
_COLLECTIVE_NAME = re.compile(
    r"^(?:(?P<all_reduce>all[-_]reduce|psum(?:_invariant)?|pmax|pmin)|(?P<reduce_scatter>reduce[-_]scatter|"
    r"psum_scatter)|(?P<all_gather>all[-_]gather)|(?P<all_to_all>all[-_]to[-_]all)|"
    r"(?P<collective_permute>collective[-_]permute|ppermute))(?:[-_]start)?(?:\.\d+)*$")


def collective_category(name: str) -> str | None:
    """The `hlo_category` of a collective op known by its name only (None for other ops)."""
    match = _COLLECTIVE_NAME.match(name)
    return _CATEGORY_OF_KIND[next(kind for kind, text in match.groupdict().items() if text)] if match else None


class LineNesting:
    """The XLA ops still open on one line. Control flow nests ops (a `while` holds its body's ops, a `call` its
    callee's): each op's row gets its self time, its duration less that of the ops directly inside it, so that
    a line's rows add up to its busy time. Rows wait here until an op that starts after their end shows them
    closed, across windows; a window without nesting is settled a column at a time."""

    _DUR = 7  # the `ops` row's dur_ns

    def __init__(self) -> None:
        self.open: list[list[Any]] = []  # [end_ns, row, children's ns]

    def settle(self, rows: list[tuple[Any, ...]], starts: np.ndarray, ends: np.ndarray) -> list[tuple[Any, ...]]:
        """The rows of a window's ops (in start order) that are closed; the others wait."""
        if not rows:
            return []
        closed: list[tuple[Any, ...]] = []
        flat = bool(np.all(starts[1:] >= np.maximum.accumulate(ends)[:-1]))
        if flat and (not self.open or int(starts[0]) >= max(item[0] for item in self.open)):
            while self.open:
                self._close(closed)
            closed += rows[:-1]
            self.open.append([int(ends[-1]), rows[-1], 0])
            return closed
        for row, start, end in zip(rows, starts.tolist(), ends.tolist()):
            while self.open and self.open[-1][0] <= start:
                self._close(closed)
            if self.open:
                parent = self.open[-1]
                parent[2] += max(0, min(end, parent[0]) - start)
            self.open.append([end, row, 0])
        return closed

    def flush(self) -> list[tuple[Any, ...]]:
        """The rows still waiting, at the line's end."""
        closed: list[tuple[Any, ...]] = []
        while self.open:
            self._close(closed)
        return closed

    def _close(self, closed: list[tuple[Any, ...]]) -> None:
        _, row, children_ns = self.open.pop()
        if children_ns:
            row = (*row[:self._DUR], max(0, row[self._DUR] - children_ns), *row[self._DUR + 1:])
        closed.append(row)
