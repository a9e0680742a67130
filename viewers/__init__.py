"""Views of a trace outside the terminal, installed as `tputrace.viewers`.

- `report_html` (with `plotly_data` and `plotly_figures`): one self-contained HTML report
  (`tputrace plot`).
- `xplane` (with `xplane_proto`): XProf files for TensorBoard's profile plugin
  (`tputrace export --tensorboard`, `tputrace tensorboard`); it also holds the device timeline
  model, where each program execution and its ops sit on a chip, that both exports draw.
- `perfetto`: Chrome trace-event JSON for ui.perfetto.dev (`tputrace export --perfetto`).

Every view reads a trace through `tputrace.open` and never imports torch or jax. Submodules are
imported on use; importing this package is free.
"""
