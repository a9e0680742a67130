"""The line the launcher names for a rank that failed first: the script's, not tputrace's own frames below it."""

from __future__ import annotations

import os

from tputrace.cli.launch import _failing_line
from tputrace.sourceloc import TPUTRACE_DIR


def test_a_collective_error_raised_in_the_backend_names_the_scripts_line() -> None:
    backend = os.path.join(os.path.dirname(TPUTRACE_DIR), "backend", "distributed", "process_group.py")
    traceback = f'''Traceback (most recent call last):
  File "/home/me/train.py", line 12, in <module>
    dist.all_reduce(total)
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper
    return func(*args, **kwargs)
  File "{backend}", line 358, in wait
    raise self._failure(error) from None
  File "{os.path.join(TPUTRACE_DIR, "recording", "recorder.py")}", line 10, in hook
    raise
CollectiveError: all_reduce on the tpu process group failed: Connection reset by peer.
'''
    assert _failing_line(traceback) == "train.py:12"
