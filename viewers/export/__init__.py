"""Exports of a trace to other profilers' viewers, installed as `tputrace.viewers.export`.

- `xplane` (with `xplane_device`, `xplane_host`, `xplane_builder`, `xplane_line`, on the messages of
  `tputrace.xplane_proto`): XProf files for TensorBoard's profile plugin (`tputrace export --tensorboard`,
  `tputrace tensorboard`).
- `perfetto` (with `perfetto_tracks`): Chrome trace-event JSON for ui.perfetto.dev
  (`tputrace export --perfetto`).
- `hosts`: the exported files' names (the target chip an export is drawn for is `tputrace.analysis.target`'s).

Both draw the device timeline of `tputrace.derived.device_runs`. Submodules are imported on use.
"""
