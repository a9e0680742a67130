"""`mm` and `addmm` of a row cut, or of a cut reshaped to rows (a linear layer on `x[mask]` of any
rank, its input's and weight's gradients), on the padded rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.cuts.layout import cut, cut_layout, is_cut, is_cut_or_view_of_one, padded_of, transposed_layout
from tputrace.backend.cuts.steps import padded_step
from tputrace.backend.op_routes import bound
from tputrace.backend.ops import padded

aten = torch.ops.aten

_MM_OVER_ROWS = padded_step(aten.mm.default, padded.mm_over_rows_padded, 2, matmul_precision=True)


def matmul_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`mm` or `addmm` of a 2-D row cut by a matrix that is not a cut (a linear layer on `x[mask]`, or
    its input's gradient): each row of the product is its row's, so it runs on the padded rows and is
    cut in turn. `mm` of a transposed row cut by a row cut of the same length (the weight's
    gradient) sums over the rows: the real rows only (`ops.padded.mm_over_rows_padded`)."""
    if entry.op is aten.mm.default:
        bias, (mat1, mat2) = None, bound(entry.op, args, kwargs)
    else:
        bias, mat1, mat2, _, _ = bound(entry.op, args, kwargs)
        if is_cut(bias) or (bias.dim() == 2 and bias.shape[0] != 1):
            return None
    rows = cut_layout(mat1) if mat1.dim() == 2 else None
    if rows is not None and rows[0] == 0 and not is_cut(mat2):
        padded_mat1 = padded_of(mat1, rows)
        padded_args = [padded_mat1 if value is mat1 else value for value in args]
        padded_kwargs = {name: padded_mat1 if value is mat1 else value for name, value in kwargs.items()}
        return cut(dispatcher.compute(entry, padded_args, padded_kwargs, record_as), 0, rows[1])
    transposed = transposed_layout(mat1)
    if bias is not None or transposed is None or not is_cut_or_view_of_one(mat2) or mat2.dim() != 2:
        return None
    cut_dim, length, padded_shape = transposed
    rows = cut_layout(mat2)
    if cut_dim or rows is None or rows[:2] != (0, length) or padded_shape[0] != rows[2][0]:
        return None
    inputs = (padded_of(mat1, transposed), padded_of(mat2, rows), length)
    return dispatcher.compute(_MM_OVER_ROWS, inputs, {}, record_as or entry.name)
