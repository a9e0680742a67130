"""`mm` and `addmm` of a row cut (a linear layer on `x[mask]`, its input's and weight's gradients) on
the padded rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.cuts.layout import cut, cut_then, is_cut
from tputrace.backend.cuts.steps import padded_step
from tputrace.backend.op_routes import bound
from tputrace.backend.ops import padded
from tputrace.backend.tensor import whole_buffer

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
    if is_cut(mat1) and mat1.dim() == 2 and mat1._view.host_cut[0] == 0 and not is_cut(mat2):
        padded_args = [whole_buffer(value) if value is mat1 else value for value in args]
        padded_kwargs = {name: whole_buffer(value) if value is mat1 else value for name, value in kwargs.items()}
        return cut(dispatcher.compute(entry, padded_args, padded_kwargs, record_as), 0, mat1._view.host_cut[1])
    transposed = cut_then(mat1, aten.t.default)
    if bias is not None or transposed is None or not is_cut(mat2) or mat2.dim() != 2:
        return None
    cut_dim, length, _ = transposed
    if cut_dim or mat2._view.host_cut != (0, length) or mat1._buf.array.shape[0] != mat2._buf.array.shape[0]:
        return None
    return dispatcher.compute(_MM_OVER_ROWS, (whole_buffer(mat1), whole_buffer(mat2), length), {}, record_as or entry.name)
