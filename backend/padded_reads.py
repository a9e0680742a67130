"""Host reads of a data-dependent output without a program per length.

`nonzero`, `x[mask]`, `unique` and the like run a program compiled for a padded length (see
`length_buckets`) and return the first `length` entries of its output: a narrow view (`cut`). Read on
the chip, that view is a slice program compiled for each distinct length, which is what bucketing
avoids. Read on the host (`.cpu()`, `.tolist()`, `.item()`, `print`), it needs no program: the padded
buffer is copied (at most a quarter more bytes, see `length_buckets`) and cut on the host. Only an op
on the chip that reads the view needs the exact shape, and compiles for it as the op itself does.
"""

from __future__ import annotations

from typing import Any


def cut(padded: Any, dim: int, length: int) -> Any:
    """The first `length` entries along `dim` of `padded` (an output compiled for a padded length): a
    view whose chain is marked, so that a host read of any tensor seen through it copies the buffer
    and cuts it there (`host_cut`)."""
    if padded.shape[dim] == length:
        return padded
    view = padded.narrow(dim, 0, length)
    if padded._view is None:
        view._view.host_cut = (dim, length)
    return view


def host_cut(tensor: Any) -> tuple[int, int] | None:
    """(dim, length) when `tensor` is the first `length` entries along `dim` of its buffer's array and
    is read by cutting that array on the host, else None."""
    view = tensor._view
    return None if view is None else view.host_cut
