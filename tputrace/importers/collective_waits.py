"""Each rank's wait in its collectives, for an import of several ranks' captures of one distributed run (one
torch.profiler file per rank, or an XProf file per `jax.distributed` process of one device): written into
`collectives.wait_ns` as `tputrace merge` does for recorded ranks.

A capture names its rank in the run (`distributedInfo.rank`, `meta.imported`'s `distributed_rank`); a collective
names its group's members by those ranks (`Process Group Ranks`), or, where it names none (gloo's ranges), it is
taken to span every rank of the run. The k-th call of a group is the same call on every member, so on one clock each
member's wait is the last arrival less its own (at most the call's duration). Captures of several hosts are put on
one clock from the ends of the calls they shared (`tputrace.merge.host_offsets`).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tputrace.derived.imported_sources import IMPORTED_META_KEY
from tputrace.merge import POINT_TO_POINT, CollectiveRow, host_offsets, match_collectives, wait_times


def fill_waits(path: Path) -> int:
    """Set `wait_ns` of the matched collectives in the trace at `path`; how many rows got one."""
    connection = sqlite3.connect(path)
    try:
        found = connection.execute("SELECT value FROM meta WHERE key = ?", (IMPORTED_META_KEY,)).fetchone()
        sources = json.loads(found[0]) if found else []
        # Only the ranks with collectives: a TORCH_TRACE log imported as a rank of its own names its process's rank too.
        calling = {rank for (rank,) in connection.execute("SELECT DISTINCT rank FROM collectives")}
        distributed = {int(source["rank"]): int(source["distributed_rank"]) for source in sources
                       if isinstance(source.get("distributed_rank"), int) and source.get("rank") in calling}
        if len(distributed) < 2:
            distributed = _one_device_processes(connection, sources, calling)
        if len(distributed) < 2 or len(set(distributed.values())) != len(distributed):
            return 0
        world = sorted(distributed.values())
        by_distributed = {number: rank for rank, number in distributed.items()}
        runs = {rank: (start or 0, host or "") for rank, start, host in
                connection.execute("SELECT rank, start_unix_ns, host FROM runs")}
        rows = []
        for rowid, rank, kind, group, ranks, start_ns, dur_ns in connection.execute(
                "SELECT c.rowid, c.rank, c.kind, g.text, r.text, c.start_ns, c.dur_ns FROM collectives c "
                "LEFT JOIN strings g ON g.id = c.group_sid LEFT JOIN strings r ON r.id = c.ranks_sid"):
            members = _members(ranks, world, by_distributed)
            if rank not in distributed or start_ns is None or members is None:
                continue
            if kind in POINT_TO_POINT and not ranks and len(world) > 2:
                continue  # a send or receive that does not name its peer
            rows.append(CollectiveRow((0, rowid), rank, kind or "", group or "", members,
                                      runs.get(rank, (0, ""))[0] + start_ns, dur_ns or 0))
        hosts = {rank: runs.get(rank, (0, ""))[1] for rank in distributed}
        if len(set(hosts.values())) > 1:
            offsets = host_offsets(rows, hosts, hosts[min(hosts)])
            rows = [CollectiveRow(row.key, row.rank, row.kind, row.group, row.ranks,
                                  row.start_ns - offsets[hosts[row.rank]], row.dur_ns) for row in rows]
        waits = wait_times(match_collectives(rows))
        connection.executemany("UPDATE collectives SET wait_ns = ? WHERE rowid = ?",
                               [(wait, key[1]) for key, wait in waits.items()])
        connection.commit()
        return len(waits)
    finally:
        connection.close()


def _one_device_processes(connection: sqlite3.Connection, sources: list[dict[str, object]],
                          calling: set[int]) -> dict[int, int]:
    """The ranks of XProf captures of one device each (a `jax.distributed` process per device), numbered as the
    trace's ranks: every process runs the same programs, so a process's k-th collective of a kind is every process's
    k-th, spanning them all (a capture of several devices may also run collectives among its own devices alone)."""
    chips = dict(connection.execute("SELECT rank, chips FROM runs").fetchall())
    ranks = [int(str(source["rank"])) for source in sources if source.get("format") == "xplane"
             and source.get("rank") in calling]
    if len(ranks) < 2 or len(ranks) != len(calling) or any(chips.get(rank) != 1 for rank in ranks):
        return {}
    return {rank: rank for rank in ranks}


def _members(ranks: str | None, world: list[int], by_distributed: dict[int, int]) -> str | None:
    """A collective's members as the trace's ranks (`0,1`); None where a member's capture was not imported."""
    numbers = [int(part) for part in ranks.split(",") if part.strip().isdigit()] if ranks else world
    if not numbers or any(number not in by_distributed for number in numbers):
        return None
    return ",".join(str(by_distributed[number]) for number in numbers)
