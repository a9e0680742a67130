"""Recording a run. Importing this package imports nothing.

- `interface`: what the backend reports through (the `Recording` protocol and `active()`); the backend
  imports nothing else from here.
- `recorder` (with `executions`): the event sink, turning what the backend reports into trace records.
- The lifecycle, the only part that loads the backend: `lifecycle` (start and stop a run's recording),
  `session` (this process's recording, `tputrace.step()` and `tputrace.annotate()`), `exits` (exit
  statuses and SIGTERM), and the processes a recorded script starts: `lineage` (who is whose parent,
  under which rank), `forking`, `spawning`, `command_exits`, `fork_merge`; `readings` is what the
  recorder reads from the backend.
"""
