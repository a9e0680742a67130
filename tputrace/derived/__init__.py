"""Figures and models computed once from a trace for every view (the TUI, the HTML report, the XProf
and Perfetto exports): run facts, step rows, timeline lanes, and the device timeline with its chip
cost model.

Headless: this layer reads a trace through `tputrace.store` and imports no plotly, Textual, torch,
jax or `tputrace.analysis` (analysis may build on it); numpy only where it is installed, to sum columns
of millions of ops (`op_columns`), with the same figures row by row without it. Submodules are imported
on use.

- `run_facts`: the run and the file (`RunFacts`), and each rank's clock offset.
- `steps`: one `StepRow` per training step, with where its time went.
- `lanes`: what a timeline row is (`Lane`) and which table each kind of lane reads.
- `timeline`: the whole-run timeline, decimated to an event budget.
- `op_cost`: the chip cost model (an op's FLOPs and bytes; roofline sharing of a program's time).
- `trace_tables`, `device_runs`: where each program execution and its ops sit on a chip.
- `op_ranking`: ops ranked by host dispatch without nested flushes and compiles, with their chip time share
  (`op_ranking_columns`: the same over the ops' columns, `op_columns`: those columns read inside SQLite).
- `text`: TEXT columns read in SQL, made printable as the reader makes its own.
"""
