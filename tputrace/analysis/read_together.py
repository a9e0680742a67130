"""The advice for lines that read values from the chip in the same steps, each a wait: read them in one go. One
`torch.stack` takes only values of one shape (it promotes their dtypes), so scalars (`.item()`, `float(loss)`) stack,
while a tensor read beside them (`preds.cpu()`) does not: the bytes each line copies to the host tell them apart."""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext
from tputrace.wording import plural

ReadKey = tuple[int | None, str, int | None]  # (frame_id, sync kind, library frame_id)
_SCALAR_KINDS = frozenset({"item", "bool"})
_LARGEST_SCALAR_BYTES = 8


def read_bytes(context: AnalysisContext, key: ReadKey) -> int | None:
    """The most bytes one of the line's reads copied to the host in the loop, 1 for a read that is a Python number
    (`.item()`), None where no copy was recorded (an imported capture)."""
    if key[1] in _SCALAR_KINDS:
        return 1
    where, params = context.loop_line_where("t")
    ((largest,),) = context.trace.sql(
        f"SELECT MAX(t.bytes) FROM transfers t WHERE {where} AND t.direction = 'd2h' AND t.frame_id = ?", (*params, key[0]))
    return int(largest) if largest is not None else None


def together_text(context: AnalysisContext, key: ReadKey, others: tuple[ReadKey, ...]) -> str:
    """The sentence that tells the line at `key` to read its value with `others` in one go, in a form that takes
    their shapes: `torch.stack` for scalars, a flat `torch.cat` split on the host where a tensor is among them."""
    where = context.where(key[0])
    names = list(dict.fromkeys(context.where(other[0]) for other in others))
    head = f" {where} reads in the same steps as {', '.join(names)}, each waiting for the chip in turn: "
    waits = f"one wait instead of {len(names) + 1}."
    sizes = {context.where(line[0]): read_bytes(context, line) for line in (key, *others)}
    if all(size is not None and size <= _LARGEST_SCALAR_BYTES for size in sizes.values()):
        return head + f"compute those values first and read them in one go (`torch.stack([a, b]).tolist()`), {waits}"
    tensors = [line for line, size in sizes.items() if size is None or size > _LARGEST_SCALAR_BYTES]
    known = [f"{line} copies {plural(size, 'byte')} a read" for line, size in sizes.items()
             if size is not None and size > _LARGEST_SCALAR_BYTES]
    shapes = (f"the values differ in shape ({'; '.join(known)}, the others one number each)" if len(known) < len(sizes)
              and len(known) == len(tensors) else f"{', '.join(tensors)} {'reads a tensor' if len(tensors) == 1 else 'read tensors'}")
    return head + (
        f"{shapes}, and `torch.stack` takes only values of one shape, so flatten them into one tensor and copy it once "
        "(`torch.cat([a.reshape(-1).float(), b.reshape(-1).float()]).cpu()`, cast to one dtype, then split it on the host "
        f"by their sizes), or keep them on the chip and read them after the loop, {waits}")
