"""What the dispatcher asks about the cuts of data-dependent outputs (see the `cuts` package): whether
the process has made one yet, whether a value is one, how a host read cuts it, and the route of an op
of cuts on their padded buffers."""

from __future__ import annotations

from tputrace.backend.cuts.layout import host_cut, is_cut, recent_lengths
from tputrace.backend.cuts.routes import on_padded

__all__ = ["cuts_made", "host_cut", "is_cut", "on_padded"]

# Truthy from the process's first cut on (the lengths of the latest cuts, never emptied once one is
# made): until then, no op's inputs need looking at for a cut.
cuts_made = recent_lengths
