"""The line an out-of-memory error failed at, read from the traceback a run recorded."""

from __future__ import annotations

from tputrace.analysis.memory_oom import failing_line

TRACEBACK = '''Traceback (most recent call last):
  File "/home/me/train.py", line 40, in <module>
    main()
  File "/home/me/train.py", line 31, in main
    out = model(batch)
  File "/home/me/models/net.py", line 12, in forward
    return self.proj(x)
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125, in forward
    return F.linear(input, self.weight, self.bias)
  File "/venv/lib/python3.11/site-packages/tputrace/backend/core/kernels.py", line 37, in _zeros
    buf = allocate()
RuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.
'''


def test_the_innermost_frame_outside_libraries_is_the_failing_line() -> None:
    assert failing_line(TRACEBACK, "/home/me/train.py") == ("/home/me/models/net.py", 12)


def test_a_script_inside_a_library_path_still_names_its_line() -> None:
    traceback = TRACEBACK.replace("/home/me/", "/opt/lib/python3.11/site-packages/job/")
    assert failing_line(traceback, "/opt/lib/python3.11/site-packages/job/train.py") == ("/opt/lib/python3.11/site-packages/job/train.py", 31)


def test_a_message_without_a_traceback_names_no_line() -> None:
    assert failing_line("RESOURCE_EXHAUSTED: Out of memory", "/home/me/train.py") is None
