"""Lengths read from the chip: a slice or shape sized by a number that `.tolist()` or `.item()` read from the chip.

Bucketing such a length still compiles per combination when several are read at once (one per row); keeping the
lengths on the chip and masking compiles once and needs no read. A recompilation storm at a line whose function
read chip values into Python numbers, at or before that line, in every step that compiled, is told so.
"""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext

_HOST_READS = ("tolist", "item")


def host_read_before(context: AnalysisContext, frame_id: int | None, steps: set[int]) -> tuple[str, str] | None:
    """A read of chip values into Python numbers (`.tolist()`, `.item()`) in the same function as the frame, at or
    before its line, in every one of `steps`: its line (`file.py:12`) and kind (`` `.tolist()` ``), or None."""
    location = context.location(frame_id)
    if location is None or not steps:
        return None
    rows = context.trace.sql(
        f"SELECT frame_id, kind, COUNT(DISTINCT step) FROM syncs_v WHERE rank = ? AND file = ? AND function = ? AND line <= ? "
        f"AND kind IN ({', '.join('?' for _ in _HOST_READS)}) AND step IN ({', '.join('?' for _ in steps)}) "
        "GROUP BY frame_id, kind ORDER BY 3 DESC, line DESC LIMIT 1",
        (context.rank, location.file, location.function, location.line, *_HOST_READS, *sorted(steps)),
    )
    if not rows or rows[0][2] < len(steps):
        return None
    return context.where(rows[0][0]), f"`.{rows[0][1]}()`"


def masking_fix(read_where: str, read_kind: str) -> str:
    """The fix for a length read from the chip at `read_where`: mask with the lengths kept on the chip."""
    return (f"the length is a number read from the chip at {read_where} ({read_kind}): keep it on the chip and mask "
            "instead of slicing to it, e.g. `mask = torch.arange(size, device=x.device) < lengths[:, None]` and "
            "reduce with the mask (`(x * mask[..., None]).sum(1) / lengths[:, None]`), which needs no read either")
