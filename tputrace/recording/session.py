"""This process's recording (one at a time): making a recorder the active one, stopping it, and what
the script calls while it runs (`tputrace.step()`, `tputrace.annotate()`).

Starting one is `tputrace.recording.lifecycle`'s (a root recording) or `tputrace.recording.spawning`'s
(a child's). This module imports the backend only inside its functions, once a recording has loaded it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, cast

from tputrace.recording import interface, lineage
from tputrace.recording.exits import uncaught_status
from tputrace.recording.fork_merge import merge_forked
from tputrace.recording.recorder import Recorder
from tputrace.version import __version__

# What a root recording found in `interface.PARENT_ENV`, put back when it stops.
_inherited_parent: str | None = None
# The eager mode (`EagerMode` value) a root recording switched away from, which `stop` switches back to.
_eager_mode_before_start: str | None = None

_EAGER_MODES_BY_OPTION = {"defer": "DEFER_AND_FUSE", "strict": "DEFER_NEVER", "blocking": "DEFER_NEVER_AND_LAUNCH_BLOCKING"}


def current() -> Recorder | None:
    """This process's recorder (the one `interface.active()` gives the backend), or None."""
    return cast("Recorder | None", interface.active())


def begin(recorder: Recorder, *, inherited_parent: str | None = None, eager_mode_before: str | None = None) -> None:
    """Make `recorder` this process's recording and connect the backend to it. A root recording passes
    what it found in the environment and the eager mode it switched away from, for `stop` to restore."""
    global _inherited_parent, _eager_mode_before_start
    from tputrace.backend.core import hooks

    _inherited_parent = inherited_parent
    _eager_mode_before_start = eager_mode_before
    interface.activate(recorder)
    hooks.attach(recorder)


def switch_eager_mode(mode: str) -> bool:
    """Switch to the eager mode a `--mode` names; False for one that names none (`compile`)."""
    from tputrace.backend.compat.device_module import EagerMode, set_eager_mode

    eager = _EAGER_MODES_BY_OPTION.get(mode)
    if eager is None:
        return False
    set_eager_mode(EagerMode[eager])
    return True


def eager_mode_name() -> str:
    """The `EagerMode` value in effect."""
    from tputrace.backend.compat.device_module import eager_mode

    return eager_mode().value


def restore_eager_mode(previous: str | None) -> None:
    """Switch back to eager mode `previous` (None: keep the mode)."""
    if previous is None:
        return
    from tputrace.backend.compat.device_module import set_eager_mode

    set_eager_mode(previous)


def continue_in_forked_child(recorder: Recorder | None) -> None:
    """In a process just forked from a recording one: record into `recorder` (None: record nothing)
    instead of the parent's recording, whose writer this process must never use."""
    from tputrace.backend.core import hooks

    hooks.detach()
    interface.activate(recorder)
    if recorder is not None:
        hooks.attach(recorder)


def stop(exit_status: int | None, error: str | None = None) -> None:
    """Flush pending work, finish the trace (run end, exit status, error) and close it; then switch back
    to the eager mode that was active before the recording started, so a recording run in-process
    (`main(["run", ...])`, a benchmark) leaves the tpu ops that follow it running as they ran before it.

    `exit_status` None: not known (a command's recording, stopped at its interpreter's exit)."""
    global _eager_mode_before_start
    recorder = current()
    if recorder is None:
        return
    if recorder.pid != os.getpid():  # inherited through a fork that started no recording: the parent's to finish
        interface.activate(None)
        return
    if recorder.forked_from is None:
        lineage.restore(_inherited_parent)
    from tputrace.backend.core import hooks

    try:
        hooks.flush_pending("exit")
    except Exception as flush_error:  # noqa: BLE001 - a failing flush must not lose the trace
        error = error or f"flush at exit failed: {flush_error}"
    hooks.detach()
    interface.activate(None)
    try:
        _finish_trace(recorder, exit_status, error)
    finally:
        previous, _eager_mode_before_start = _eager_mode_before_start, None
        restore_eager_mode(previous)


def _finish_trace(recorder: Recorder, exit_status: int | None, error: str | None) -> None:
    """Write the run's end fields and close the trace, then merge in the traces of the processes it started."""
    from tputrace.backend.core import chips

    if recorder.forked_from is not None and not (recorder.ops or recorder.compiles):
        recorder.writer.close()  # a child process that never used the tpu: no file was created
        return
    import jax
    import torch

    try:
        chip_count, platform = chips.count(), chips.platform()
    except chips.ChipError:  # TPUTRACE_PLATFORM or TPUTRACE_CHIPS asks for chips this host lacks; the script has raised it
        chip_count, platform = None, None
    run_fields = {
        "chips": chip_count,
        "platform": platform,
        "eager_mode": "COMPILE" if recorder.mode == "compile" else eager_mode_name(),
        "torch_version": torch.__version__,
        "jax_version": jax.__version__,
        "tputrace_version": __version__,
    }
    recorder.finish(exit_status, error, run_fields)
    if recorder.path is not None and recorder.forked_from is None:
        merge_forked(recorder.path, recorder.rank)


def stop_at_interpreter_exit() -> None:
    """End a command's recording when its interpreter exits. The exit status is not known there (the
    process waiting on the command writes it, `tputrace.recording.command_exits`) except after an
    uncaught exception, whose traceback is kept: 1, or 130 for a KeyboardInterrupt (SIGINT), as a shell
    reports it."""
    import atexit
    import traceback

    uncaught: list[tuple[int, str]] = []
    previous_hook = sys.excepthook

    def remember_uncaught(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        uncaught.append((uncaught_status(kind), "".join(traceback.format_exception(kind, error, trace))))
        previous_hook(kind, error, trace)

    def stop_with_what_was_seen() -> None:
        exit_status, error = uncaught[-1] if uncaught else (None, None)
        stop(exit_status, error)

    sys.excepthook = remember_uncaught
    atexit.register(stop_with_what_was_seen)


def live_counts() -> dict[str, int]:
    """Steps, ops recorded, compiles, syncs, the last step's time in ns (-1: none yet) so far, and whether it
    records now (`recording` 0: outside the recording window) (for `tputrace run`'s status line)."""
    recorder = current()
    if recorder is None:
        return {"steps": 0, "ops": 0, "compiles": 0, "syncs": 0, "step_ns": -1, "recording": 1}
    live = recorder.live
    step_ns = -1 if live.last_step_ns is None else live.last_step_ns
    return {"steps": recorder.step_index, "ops": recorder.ops, "compiles": recorder.compiles, "syncs": live.sync_count, "step_ns": step_ns,
            "recording": int(recorder.window_open or not recorder.enabled)}


def live_compiles(after: int) -> tuple[list[str], int]:
    """The compiles (with their reasons) after the `after`-th still kept, and the number of the last one."""
    recorder = current()
    return ([], after) if recorder is None else recorder.live.compiles_after(after)


def step() -> None:
    """An explicit step boundary (`tputrace.step()`): runs the deferred ops, then ends the step."""
    recorder = current()
    from tputrace.backend.core import hooks

    hooks.flush_pending("step")
    if recorder is not None:
        recorder.explicit_step()


def window_from_code(start: bool) -> None:
    """`tputrace.start()` (`start`) or `tputrace.stop()`: open or close a `tputrace run --from-code` window."""
    recorder = current()
    if recorder is not None and recorder.pid == os.getpid():
        recorder.window_from_code(start)


class annotate(contextlib.ContextDecorator):  # noqa: N801 - used like a function: tputrace.annotate("name")
    """Records a named range: `with tputrace.annotate("data"): ...` or as a decorator (one that begins or ends
    outside the recording window is not recorded)."""

    def __init__(self, name: str) -> None:
        self.name = str(name)
        self.start = 0
        self.frame: int | None = None

    def __enter__(self) -> annotate:
        recorder = current()
        self.start = 0
        if recorder is not None and recorder.window_open:
            self.start = recorder.now()
            self.frame = recorder.frame_id()
        return self

    def __exit__(self, *exc: object) -> None:
        recorder = current()
        if recorder is not None and recorder.enabled and self.start:
            recorder.annotation(self.name, "annotate", self.start, recorder.now() - self.start, self.frame)
