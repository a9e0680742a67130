"""Recording a run: the recorder (`recorder`, the event sink that turns what the backend reports into
trace records) apart from the process lifecycle that starts and stops it (`lifecycle`, `session`, and
the processes a recorded script forks or starts: `forking`, `spawning`, `command_exits`).

The backend reports only through `interface`. Importing this package imports nothing.
"""
