"""The HTML report (`tputrace plot`), installed as `tputrace.viewers.report`.

- `report_html`: writes the page (and the before/after comparison); `page` and `findings_html` are
  its frame and its findings.
- `data` with `analysis_data`, `time_data`, `compile_data` and `chip_data`: each section's data as
  plain dataclasses (no plotly), built on `tputrace.derived` and `tputrace.analysis`.
- `figures` with `figure_style`: one Plotly figure per picture.

Submodules are imported on use.
"""
