"""Buffer lifetimes from torch.profiler's `[memory]` events (`profile_memory=True`).

Each event is one allocation (`Bytes` > 0) or free (`Bytes` < 0) of the block at `Addr` on `Device Id`, at the
time the op that made or dropped it ran. An allocation and the next free of its address on its device are one
`buffers` row: kind `activation` where a module made it, else `temporary` (freed) or `other` (live at the
end); its place the innermost of the user's Python frames around the allocation (with `with_stack=True`:
the function, at its `def` line, for torch.profiler's stacks name functions, not lines), its module the innermost
`nn.Module` range around it. An allocation freed in no window of the capture stays live (`free_ns` NULL) where its
window is the last; one in an earlier window is taken as freed when that window ends, as its free may have come
between the windows. Blocks allocated before the profile started are freed without an allocation seen: no row."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

from tputrace.importers.chrome_scan import number

# An allocation seen: its start (ns since the rank's start), its time and thread in its file, bytes, device.
Allocation = tuple[int, float, Any, int, int]


class Allocations:
    """The `[memory]` events of one window, paired into buffer lifetimes when the window ends."""

    def __init__(self) -> None:
        self.events: list[tuple[int, float, Any, int, int, int]] = []  # start_ns, ts, tid, address, bytes, device

    def add(self, start_ns: int, ts: float, tid: Any, args: dict[str, Any]) -> None:
        address, nbytes = args.get("Addr"), int(number(args.get("Bytes")))
        if address is None or not nbytes:
            return
        device = args.get("Device Id")
        self.events.append((start_ns, ts, tid, int(number(address)), nbytes, int(device) if device is not None else -1))

    def lifetimes(self, window_end_ns: int, last_window: bool) -> list[tuple[Allocation, int | None]]:
        """Each allocation of the window with its free's time (None: live at the capture's end), in time order."""
        open_blocks: dict[tuple[int, int], Allocation] = {}
        paired: list[tuple[Allocation, int | None]] = []
        for start_ns, ts, tid, address, nbytes, device in sorted(self.events, key=lambda event: (event[0], event[4] < 0)):
            key = (device, address)
            if nbytes > 0:
                if key in open_blocks:  # a second allocation of the block without its free: the first's free was lost
                    paired.append((open_blocks[key], start_ns))
                open_blocks[key] = (start_ns, ts, tid, nbytes, device)
            elif key in open_blocks:
                paired.append((open_blocks.pop(key), start_ns))
        paired.extend((allocation, None if last_window else window_end_ns) for allocation in open_blocks.values())
        self.events.clear()
        return sorted(paired, key=lambda item: item[0][0])


def buffer_rows(rank: int, lifetimes: list[tuple[Allocation, int | None]], first_id: int, latest_alloc_ns: int,
                place: Callable[[float, Any], tuple[int | None, int | None]],
                step_of: Callable[[int], int]) -> tuple[list[tuple[Any, ...]], int]:
    """`buffers` rows of `lifetimes` (ids from `first_id`, each allocation after `latest_alloc_ns`, the table's
    order), their frame and module from `place(ts, tid)`; and the latest allocation's time."""
    rows = []
    for index, ((start_ns, ts, tid, nbytes, device), free_ns) in enumerate(lifetimes):
        alloc_ns = latest_alloc_ns = max(start_ns, latest_alloc_ns + 1)
        frame_id, module_sid = place(ts, tid)
        kind = "activation" if module_sid is not None else "other" if free_ns is None else "temporary"
        rows.append((first_id + index, rank, device, nbytes, None, None, kind, frame_id, module_sid, alloc_ns,
                     None if free_ns is None else max(free_ns, alloc_ns), step_of(alloc_ns)))
    return rows, latest_alloc_ns


def step_at(starts: Sequence[int], labels: Sequence[int]) -> Callable[[int], int]:
    """The step of a time from a `StepClock`'s starts and labels."""
    def step_of(t_ns: int) -> int:
        return labels[bisect.bisect_right(starts, t_ns)]
    return step_of
