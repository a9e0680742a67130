"""A line that read from the chip once in the whole run (a script's one `.item()`, a tensor printed once): the host
waited once, with nothing recurring to save, so the finding is at most `info` and its advice is for that one wait,
not for a read repeated every step or iteration."""

from __future__ import annotations

# The kinds a script's own read of a value makes (`.item()`, `print(t)`, `.tolist()`, `.numpy()`, `.cpu()`, `if t:`).
VALUE_READS = frozenset({"item", "print", "tolist", "numpy", "cpu", "bool"})

READ_ONCE = (
    "The line reads from the chip once in the whole run, so the host waits once, for the work queued before the read "
    "to run: nothing recurs to save. Where the script needs the value on the host there, that wait is its cost; "
    "otherwise use the tensor itself in the ops that follow ({instead}), or read it after the rest of the work is "
    "queued, at the end, so the chip runs while the host queues.")
_INSTEAD = {
    "item": "no `.item()`",
    "print": "print it at the end",
    "bool": "`torch.where` in place of the `if`",
}


def reads_once(count: int, kind: str) -> bool:
    """Whether a line's `count` reads of `kind` are a single read of a value, made once in the run."""
    return count == 1 and kind in VALUE_READS


def once_suggestion(kind: str) -> str:
    """The advice for a single read of `kind`."""
    return READ_ONCE.format(instead=_INSTEAD.get(kind, "no copy to the host"))

