"""Importers: captures made by other tools (XProf `xplane.pb`, `TORCH_TRACE` logs, torch.profiler JSON)
written as a tputrace trace, with the source of every record kept in `meta.imported` (see
`docs/importing.md`). Nothing here imports torch or jax."""
