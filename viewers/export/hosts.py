"""The names an export gives its files: one per rank, after the rank's host."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str, fallback: str) -> str:
    """`text` as a file or folder name: only letters, digits, `_`, `-` and `.`; never empty or dotted-only."""
    cleaned = _UNSAFE.sub("_", text).strip("._")
    return cleaned or fallback


def host_names(trace: Trace) -> dict[int, str]:
    """The file stem of each rank's host file: the run's host name when every rank has its own, else
    `<host>-rank<N>` (or `rank<N>`)."""
    rows = trace.sql("SELECT rank, host FROM runs ORDER BY rank")
    if not rows:
        return {rank: f"rank{rank}" for rank in trace.ranks}
    hosts = [host for _, host in rows]
    distinct = all(hosts) and len(set(hosts)) == len(hosts)
    names = {}
    for rank, host in rows:
        if distinct:
            names[rank] = safe_name(host, f"rank{rank}")
        else:
            names[rank] = safe_name(f"{host}-rank{rank}" if host else f"rank{rank}", f"rank{rank}")
    return names


def default_run_name(trace: Trace) -> str:
    return safe_name(trace.path.stem, "tputrace")

