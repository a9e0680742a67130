"""Views of a trace outside the terminal, installed as `tputrace.viewers`.

- `report`: one self-contained HTML report with Plotly figures (`tputrace plot`).
- `export`: XProf files for TensorBoard's profile plugin (`tputrace export --tensorboard`,
  `tputrace tensorboard`) and Chrome trace-event JSON for ui.perfetto.dev (`tputrace export --perfetto`).

What they draw is computed in `tputrace.derived` (run facts, steps, lanes, the device timeline).
Every view reads a trace through `tputrace.open` and never imports torch or jax. Submodules are
imported on use; importing this package is free.
"""
