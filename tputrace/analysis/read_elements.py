"""Reads of a tensor's elements (or of a list's or a dict's tensors) one at a time, told by the run's copy of the
source (`element_loops`): a comprehension (`[s.item() for s in scores]`, `{k: v.item() for k, v in metrics.items()}`,
`[t[i].item() for i in range(n)]`) or a `for` loop (`for x in losses:` then `total += x.item()`) whose element is read
on its loop variable. Each element read is a sync of its own, where one read of them all stacked (`scores.tolist()`,
`torch.stack(losses).tolist()`) waits once. A `for` loop counts only where the trace shows it is such a loop: between
the line's reads in a step, the run dispatched no op but at the read's line and the loop's header (taking the
elements out), so a training or evaluation loop whose variable is read (`for x, y in loader:`) is none."""

from __future__ import annotations

import bisect

from tputrace.analysis.context import AnalysisContext, in_list
from tputrace.analysis.element_loops import VALUES, ElementLoop, element_loop

# the op that iterating a tensor runs (`for row in t`, `t.unbind()`): the elements come from one tensor
ITERATES_A_TENSOR = "aten.unbind"
_COPIES = (".tolist()", ".cpu()", ".numpy()")
_WASTE = ("every element read is a sync of its own (a small program to take the element out, then a wait for the "
          "chip), one per element where one read would do")
ELEMENTS_OF_A_TENSOR = ("The line reads the elements of `{source}` one at a time{loop}, each with its own `{read}`: "
                        f"{_WASTE}. Read them once, `{{once}}`{{host}}, and take the elements from that.")
ELEMENTS_OF_A_LIST = ("The line reads the tensors of `{source}` one at a time{loop}, each with its own `{read}`: every "
                      "read is a sync of its own, one per tensor where one read would do. Stack them on the chip and "
                      "read them once, `{once}`, and take the values from that.")
VALUES_OF_A_DICT = ("The line reads the values of `{source}` one at a time{loop}, each with its own `{read}`: every read "
                    "is a sync of its own, one per value where one read would do. Stack them on the chip and read them "
                    "once, `values = {once}`, and pair them with the keys on the host (`dict(zip({source}, values))`).")
SUMMED = ("The line reads the {what} of `{source}` one at a time{loop}, each with its own `{read}`, to add them up: "
          "every read is a sync of its own, one per element where one read would do. Add them up on the chip and read "
          "the sum once, `{once}`.")
HOST_LOOP = " The loop then runs over the Python values: `{host_loop}:`."
WITH_STEPS = (" To wait less still, keep the tensor on the chip and read it every N steps or after the loop, so the host "
              "can queue the next step while the chip works.")


def _line_element_reads(context: AnalysisContext, frame_id: int | None) -> ElementLoop | None:
    """The element reads the run's copy of the line's source shows, where the trace agrees the line (or its loop) read
    elements only; else None."""
    location = context.location(frame_id)
    copy = context.trace.source_copy(location.file) if location is not None else None
    reads = element_loop(copy, location.line) if copy is not None and location is not None else None
    if reads is None or location is None:
        return None
    if reads.loop_line is not None and not _elements_only(context, frame_id, location.line, reads):
        return None
    return reads


def element_reads_fix(context: AnalysisContext, frame_id: int | None, count: int) -> str | None:
    """What to change for a line that read the elements of a tensor (or the tensors of a list or dict) one at a time,
    `count` reads in the run: read them once. None where the source shows no such reads, or the line read once."""
    reads = _line_element_reads(context, frame_id) if count >= 2 else None
    if reads is None:
        return None
    container = reads.container
    if container == "sequence" and _iterated_a_tensor(context, frame_id, reads.header_lines):
        container = "tensor"
    if container != "tensor" and reads.read in _COPIES:
        return None  # copies of a list's tensors, whose shapes may differ: no one stack reads them all
    return _fix(reads, container) + (WITH_STEPS if context.steps else "")


def element_read_text(context: AnalysisContext, frame_id: int | None) -> str | None:
    """`float(...)` of each element of `rows`: what the line reads one element at a time, where it does, else None."""
    reads = _line_element_reads(context, frame_id)
    if reads is None:
        return None
    return f"`{reads.read}` of each element of `{reads.source}`, one at a time"


def _fix(reads: ElementLoop, container: str) -> str:
    """The advice for `reads` of a `container` (`tensor`, `sequence`, `dict`): one read of them all."""
    plain = (reads.element in (reads.variable, f"{reads.source}[{reads.variable}]") and not reads.filtered
             and not reads.unpacked)
    loop = f" (the loop at line {reads.loop_line}, `{reads.loop}:`, takes them)" if reads.loop_line is not None else ""
    stacked = (f"torch.stack([{reads.element} {reads.loop}])" if not plain else
               reads.source if container == "tensor" else
               f"torch.stack(list({reads.source}.values()))" if container == "dict" else f"torch.stack({reads.source})")
    fields = {"source": reads.source, "read": reads.read, "loop": loop}
    if reads.sums:
        what = {"tensor": "elements", "dict": "values"}.get(container, "tensors")
        return SUMMED.format(what=what, once=f"{stacked}.sum().item()", **fields)
    if (reads.host_loop is not None and not reads.filtered and container != "dict"
            and (plain or (reads.unpacked and container == "tensor"))):
        # a `for` loop over the values read once: the loop's own header, with its source read to the host
        once = f"{reads.source if container == 'tensor' else stacked}.tolist()"
        template = ELEMENTS_OF_A_TENSOR if container == "tensor" else ELEMENTS_OF_A_LIST
        return (template.format(once=once, host="", **fields)
                + HOST_LOOP.format(host_loop=reads.host_loop.replace(VALUES, once)))
    if container == "tensor":
        host = f" (or one `{reads.source}.cpu()`, indexed on the host)" if plain else ""
        return ELEMENTS_OF_A_TENSOR.format(once=f"{stacked}.tolist()", host=host, **fields)
    template = VALUES_OF_A_DICT if container == "dict" else ELEMENTS_OF_A_LIST
    return template.format(once=f"{stacked}.tolist()", **fields)


def _iterated_a_tensor(context: AnalysisContext, frame_id: int | None, lines: range) -> bool:
    """Whether iterating what the loop takes its elements from ran `unbind` at the loop's header lines (`for row in
    t` iterates a tensor), so it is a tensor, not a list of tensors."""
    if frame_id is None:
        return False
    op_sids = [sid for (sid,) in context.trace.sql(
        "SELECT id FROM strings WHERE text = ? OR substr(text, 1, ?) = ?",
        (ITERATES_A_TENSOR, len(ITERATES_A_TENSOR) + 1, ITERATES_A_TENSOR + "."))]
    return bool(op_sids) and bool(context.trace.sql(
        "SELECT 1 FROM ops o JOIN frames f ON f.id = o.frame_id JOIN frames sf ON sf.id = ? WHERE o.rank = ? "
        f"AND o.op_sid IN {in_list(op_sids)} AND f.file_sid = sf.file_sid AND f.line BETWEEN ? AND ? LIMIT 1",
        (frame_id, context.rank, *op_sids, lines.start, lines.stop - 1),
    ))


_CHECKED_READS = 32  # the first reads of the step whose gaps are checked


def _elements_only(context: AnalysisContext, frame_id: int | None, line: int, reads: ElementLoop) -> bool:
    """Whether a `for` loop's reads at `line` came one after another with nothing dispatched between them but ops at
    that line and the loop's header (taking the elements out, working on each): in most gaps of the step that read
    the most there. A loop doing other work between its reads (a training or evaluation loop) is no element loop."""
    rows = context.trace.sql(
        "SELECT step, COUNT(*) FROM syncs WHERE rank = ? AND frame_id IS ? GROUP BY step ORDER BY 2 DESC, 1 DESC LIMIT 1",
        (context.rank, frame_id))
    if not rows or rows[0][1] < 2:
        return False
    step = rows[0][0]
    starts = [start for (start,) in context.trace.sql(
        "SELECT start_ns FROM syncs WHERE rank = ? AND frame_id IS ? AND step IS ? ORDER BY start_ns LIMIT ?",
        (context.rank, frame_id, step, _CHECKED_READS))]
    others = [start for (start,) in context.trace.sql(
        "SELECT o.start_ns FROM ops o JOIN frames f ON f.id = o.frame_id JOIN frames sf ON sf.id = ? WHERE o.rank = ? "
        "AND o.start_ns > ? AND o.start_ns < ? AND NOT (f.file_sid = sf.file_sid AND (f.line = ? OR f.line BETWEEN ? AND ?)) "
        "ORDER BY o.start_ns",
        (frame_id, context.rank, starts[0], starts[-1], line, reads.header_lines.start, reads.header_lines.stop - 1))]
    busy = sum(bisect.bisect_left(others, later) > bisect.bisect_right(others, earlier)
               for earlier, later in zip(starts, starts[1:]))
    return 2 * busy < len(starts) - 1
