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


def test_a_users_module_inside_a_clone_named_tputrace_is_the_users() -> None:
    """A project cloned into a folder named `tputrace` (its examples, a helper module beside them) is the user's code;
    the frames of tputrace's own recorder and backend below it are not."""
    traceback = '''Traceback (most recent call last):
  File "/home/me/tputrace/examples/train.py", line 9, in <module>
    loss = step(batch)
  File "/home/me/tputrace/examples/shared/steps.py", line 4, in step
    return model(batch).sum()
  File "/home/me/tputrace/backend/core/dispatch.py", line 88, in __torch_dispatch__
    return run(op)
  File "/home/me/tputrace/tputrace/recording/recorder.py", line 10, in record
    raise
RuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1024 bytes.
'''
    assert failing_line(traceback, "/home/me/tputrace/examples/train.py") == ("/home/me/tputrace/examples/shared/steps.py", 4)
