"""Numerics recordings: per-module digests of a run's outputs and gradients on `tpu`, their CPU replay, and the
first module whose values leave the reference (`tputrace numerics`, docs/numerics-tool.md).

`store` (the SQLite file) and `findings` (the report) import neither torch nor jax; `recording` (the module
hooks and the CPU replay) and `digests` run inside the recorded process.
"""
