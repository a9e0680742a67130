"""What the dispatcher asks about the cuts of data-dependent outputs (see the `cuts` package): whether
the process has made one yet, whether an op's input is one (or a view of one, which a route may read
as a cut of its own), how a host read cuts it, and the route of an op of cuts on their padded buffers."""

from __future__ import annotations

from tputrace.backend.indexing.cuts.layout import host_cut, is_cut_or_view_of_one as is_cut, own_strides_cut, recent_shapes
from tputrace.backend.indexing.cuts.routes import on_padded

__all__ = ["cuts_made", "host_cut", "is_cut", "on_padded", "own_strides_cut"]

# Truthy from the process's first cut on (the shapes of the latest cuts, never emptied once one is
# made): until then, no op's inputs need looking at for a cut.
cuts_made = recent_shapes
