"""Which route runs an op of cuts on their padded buffers (`on_padded`), and the ops that take a
cut's route from the process's first cut on (`route_through_cuts`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tputrace.backend.indexing.cuts import layout
from tputrace.backend.indexing.cuts.backward_views import expand_in_backward, squeeze_in_backward
from tputrace.backend.indexing.cuts.in_place import in_place_on_cut, masked_fill_on_cut, pointwise_in_place_ops
from tputrace.backend.indexing.cuts.index_put import index_put_on_padded
from tputrace.backend.indexing.cuts.losses import (
    ENTRY_BY_ENTRY_LOSSES,
    entry_by_entry_loss_on_padded,
    mse_loss_backward_on_padded,
    mse_loss_on_padded,
    nll_loss_backward_on_padded,
    nll_loss_on_padded,
)
from tputrace.backend.indexing.cuts.matmul import matmul_on_padded
from tputrace.backend.indexing.cuts.norms import layer_norm_backward_on_padded, layer_norm_on_padded
from tputrace.backend.indexing.cuts.pointwise import pointwise_on_padded
from tputrace.backend.indexing.cuts.reductions import IDENTITIES, MEANS, logsumexp_on_padded, reduction_on_padded, vector_norm_on_padded
from tputrace.backend.indexing.cuts.rows import (
    NEW_OPS,
    PREFIX_OPS,
    SOFTMAX_OPS,
    flip_on_padded,
    new_on_padded,
    prefix_on_padded,
    rowwise_on_padded,
    unsafe_view_on_padded,
)
from tputrace.backend.core import routing
from tputrace.backend.core.routing import DispatcherApi

aten = torch.ops.aten

# (dispatcher, entry, args, kwargs, record_as) -> the op's result on the padded buffers, or None for its exact path
Route = Callable[[Any, Any, Sequence[Any], dict, str | None], Any | None]
# (dispatcher, op, args, kwargs) -> the op's result on a cut, or None for its plain route
CutRoute = Callable[[Any, Any, Sequence[Any], dict], Any | None]

_ROUTES: dict[Any, Route] = {
    **{op: reduction_on_padded for op in (*IDENTITIES, *MEANS)},
    aten.linalg_vector_norm.default: vector_norm_on_padded,
    aten.logsumexp.default: logsumexp_on_padded,
    **{op: rowwise_on_padded for op in SOFTMAX_OPS},
    **{op: new_on_padded for op in NEW_OPS},
    **{op: prefix_on_padded for op in PREFIX_OPS},
    aten.flip.default: flip_on_padded,
    aten._unsafe_view.default: unsafe_view_on_padded,
    **{op: matmul_on_padded for op in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.mv.default)},
    **{op: nll_loss_on_padded for op in (aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)},
    **{op: nll_loss_backward_on_padded for op in (aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)},
    aten.mse_loss.default: mse_loss_on_padded,
    aten.native_layer_norm.default: layer_norm_on_padded,
    aten.native_layer_norm_backward.default: layer_norm_backward_on_padded,
    aten.mse_loss_backward.default: mse_loss_backward_on_padded,
    **{op: entry_by_entry_loss_on_padded for op in ENTRY_BY_ENTRY_LOSSES},
    **{op: index_put_on_padded for op in (aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)},
}
_CUT_ROUTES: dict[Any, CutRoute] = {
    aten.expand.default: expand_in_backward,
    aten.squeeze.dim: squeeze_in_backward,
    aten.masked_fill_.Scalar: masked_fill_on_cut,
    aten.masked_fill_.Tensor: masked_fill_on_cut,
}


def on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`entry`'s op on the padded buffers of the cuts among its inputs, its result cut in turn where
    it keeps the cut dim; None when the op needs the exact shape (see the package's note)."""
    route = _ROUTES.get(entry.op)
    if route is not None:
        return route(dispatcher, entry, args, kwargs, record_as)
    return pointwise_on_padded(dispatcher, entry, args, kwargs, record_as)


def route_through_cuts() -> None:
    """From the process's first cut on, `expand` tries `expand_in_backward` first, `squeeze(dim)`
    `squeeze_in_backward`, `masked_fill_` `masked_fill_on_cut` and the other in-place pointwise ops
    `in_place_on_cut`; until then they take their plain routes, at no cost to processes that never cut."""
    dispatcher = routing.active()
    cut_routes = {**dict.fromkeys(pointwise_in_place_ops(), in_place_on_cut), **_CUT_ROUTES}
    for op, on_cut in cut_routes.items():
        handler, entry = dispatcher.routes.get(id(op)) or dispatcher._route(op)
        routing.register_special(op, _first_on_cut(dispatcher, op, on_cut, handler, entry))


def _first_on_cut(dispatcher: DispatcherApi, op: Any, on_cut: CutRoute, handler: Any, entry: Any) -> Callable[[Sequence[Any], dict], Any]:
    """A route of `op` that tries `on_cut` first, then its plain `handler`."""

    def route(args: Sequence[Any], kwargs: dict) -> Any:
        result = on_cut(dispatcher, op, args, kwargs)
        return handler(entry, args, kwargs) if result is None else result

    return route


def install() -> None:
    """Take the routes through cuts from the process's first cut on (`layout.FIRST_CUT_CALLBACKS`)."""
    if route_through_cuts not in layout.FIRST_CUT_CALLBACKS:
        layout.FIRST_CUT_CALLBACKS.append(route_through_cuts)
