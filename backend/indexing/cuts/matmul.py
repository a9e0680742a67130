"""Matrix products of cuts on their padded buffers: `mm`, `addmm`, `bmm` and `mv` with the cut along
the rows (a linear layer on `x[mask]` of any rank, its input's gradient, `torch.mv(x[mask], v)`), along
the columns (`W @ x[mask].T`, the einsum `"oh,nh->on"`), along the batch (`bmm` of two cuts alike), or
along the summed dim (a weight's gradient, `v`'s gradient of `mv`: the real rows only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.entries import bound
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.indexing.cuts.layout import cut, cut_layout, is_cut_or_view_of_one, padded_of
from tputrace.backend.indexing.cuts.steps import padded_step
from tputrace.backend.ops import padded

aten = torch.ops.aten

# op -> (the dim of its first operand's rows, the dim each operand sums over)
_DIMS = {
    aten.mm.default: (0, (1, 0)),
    aten.addmm.default: (0, (1, 0)),
    aten.bmm.default: (1, (2, 1)),
    aten.mv.default: (0, (1, 0)),
}
_OVER_CUT = {
    op: padded_step(op, padded.matmul_over_cut_padded, 2, matmul_precision=True)
    for op in (aten.mm.default, aten.bmm.default, aten.mv.default)
}


def matmul_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A matrix product whose operands include a cut (or its reshape or transpose), on the padded
    buffers: with the first operand cut along its rows, or the second along its columns (each row or
    column of the product is its own), or both along the batch (`bmm`), the product is cut in turn;
    with both cut alike along the dim they sum over, the padded entries are zeroed first
    (`ops.padded.matmul_over_cut_padded`). None (the exact path) elsewhere."""
    op = entry.op
    if op is aten.addmm.default:
        bias, mat1, mat2, _, _ = bound(op, args, kwargs)
        if is_cut_or_view_of_one(bias):
            return None
    else:
        bias, (mat1, mat2) = None, bound(op, args, kwargs)
    rows_dim, (summed1, summed2) = _DIMS[op]
    first, second = _layout(mat1), _layout(mat2)
    if first is False or second is False:
        return None  # a view of a cut that reads as no cut of its own
    if first is not None and second is None and first[0] == rows_dim:
        if bias is not None and bias.dim() == 2 and bias.shape[0] != 1:
            return None
        return _on_padded(dispatcher, entry, args, kwargs, record_as, mat1, first, rows_dim)
    columns_dim = mat2.dim() - 1
    if first is None and second is not None and second[0] == columns_dim and mat2.dim() > 1:
        if bias is not None and not (bias.dim() == 0 or (bias.dim() == 2 and bias.shape[1] == 1)):
            return None
        return _on_padded(dispatcher, entry, args, kwargs, record_as, mat2, second, mat1.dim() - 1)
    if first is None or second is None or first[1] != second[1] or first[2][first[0]] != second[2][second[0]]:
        return None
    padded1, padded2 = padded_of(mat1, first), padded_of(mat2, second)
    if op is aten.bmm.default and first[0] == second[0] == 0:  # per sample of the cut batch
        return cut(dispatcher.compute(entry, (padded1, padded2), {}, record_as), 0, first[1])
    if bias is not None or (first[0], second[0]) != (summed1, summed2):
        return None
    options = {"self_dim": summed1, "other_dim": summed2}
    return dispatcher.compute(_OVER_CUT[op], (padded1, padded2, first[1]), options, record_as or entry.name)


def _layout(value: Any) -> Any:
    """The `cut_layout` of an operand; None for a value that is no cut or view of one, False for a view
    of one that reads as no cut."""
    if not is_cut_or_view_of_one(value):
        return None
    return cut_layout(value) or False


def _on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None, operand: Any, layout: Any, out_dim: int) -> Any:
    """`entry`'s op with `operand` replaced by its padded counterpart, cut along `out_dim`."""
    padded_operand = padded_of(operand, layout)
    padded_args = [padded_operand if value is operand else value for value in args]
    padded_kwargs = {name: padded_operand if value is operand else value for name, value in kwargs.items()}
    return cut(dispatcher.compute(entry, padded_args, padded_kwargs, record_as), out_dim, layout[1])
