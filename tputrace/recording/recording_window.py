"""The recording window: which steps of a run the trace keeps.

`tputrace run --steps N` keeps steps 0 to N-1; `--schedule wait=W,warmup=U,active=A[,repeat=R][,skip_first=S]`
keeps the steps `torch.profiler.schedule` would record (skip_first steps, then cycles of W steps not
recorded, U steps run but not kept and A steps recorded; R cycles, 0 for no end); `--from-code` keeps what
runs between the script's `tputrace.start()` and `tputrace.stop()`. Steps are numbered as the trace numbers
them, from 0. The script runs on after the window closes; it is only not recorded. `meta.recording_window`
says what was asked and which steps were kept (`WindowState.meta_json`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

STEPS = "steps"
SCHEDULE = "schedule"
FROM_CODE = "from_code"
SCHEDULE_FIELDS = ("wait", "warmup", "active", "repeat", "skip_first")


class WindowSpecError(ValueError):
    """A `--steps` or `--schedule` value that names no window; its text is the one-line message."""


@dataclass(frozen=True)
class WindowSpec:
    """What the command line asked for: `kind` (steps, schedule or from_code) and the schedule's counts
    (`--steps N` is the schedule `active=N,repeat=1`)."""

    kind: str
    wait: int = 0
    warmup: int = 0
    active: int = 0
    repeat: int = 0
    skip_first: int = 0

    def records_step(self, step: int) -> bool:
        """Whether step `step` is kept (as `torch.profiler.schedule`'s RECORD; from_code: decided by the script)."""
        if self.kind == FROM_CODE:
            return False
        if step < self.skip_first:
            return False
        cycle_length = self.wait + self.warmup + self.active
        into = step - self.skip_first
        if self.repeat > 0 and into >= self.repeat * cycle_length:
            return False
        return into % cycle_length >= self.wait + self.warmup

    @property
    def arguments(self) -> list[str]:
        """The spec as `tputrace run`'s options: `--steps 2`, `--schedule wait=1,warmup=1,active=2`, `--from-code`."""
        if self.kind == STEPS:
            return ["--steps", str(self.active)]
        if self.kind == FROM_CODE:
            return ["--from-code"]
        counts = [f"{name}={getattr(self, name)}" for name in SCHEDULE_FIELDS if name in ("wait", "warmup", "active") or getattr(self, name)]
        return ["--schedule", ",".join(counts)]

    @property
    def text(self) -> str:
        """`arguments` as one string."""
        return " ".join(self.arguments)


def spec_of_options(steps: int | None, schedule: str | None, from_code: bool) -> WindowSpec | None:
    """The window `--steps`, `--schedule` or `--from-code` names (None: every step); raises `WindowSpecError`."""
    if steps is not None:
        return steps_spec(steps)
    if schedule is not None:
        return parse_schedule(schedule)
    return WindowSpec(FROM_CODE) if from_code else None


def steps_spec(count: int) -> WindowSpec:
    """`--steps N`: the first N steps."""
    if count < 1:
        raise WindowSpecError(f"--steps must be at least 1, not {count}")
    return WindowSpec(STEPS, active=count, repeat=1)


def parse_schedule(text: str) -> WindowSpec:
    """`--schedule wait=W,warmup=U,active=A[,repeat=R][,skip_first=S]`; raises `WindowSpecError` naming the
    first thing wrong."""
    counts: dict[str, int] = {}
    for part in text.split(","):
        name, equals, value = part.strip().partition("=")
        name = name.strip()
        if not equals or name not in SCHEDULE_FIELDS:
            raise WindowSpecError(f"--schedule {text!r}: {part.strip()!r} is not one of {', '.join(f'{field}=N' for field in SCHEDULE_FIELDS)}")
        if name in counts:
            raise WindowSpecError(f"--schedule {text!r}: {name} is given twice")
        try:
            number = int(value.strip())
        except ValueError:
            raise WindowSpecError(f"--schedule {text!r}: {name} must be a whole number, not {value.strip()!r}") from None
        if number < 0:
            raise WindowSpecError(f"--schedule {text!r}: {name} must not be negative")
        counts[name] = number
    missing = [name for name in ("wait", "warmup", "active") if name not in counts]
    if missing:
        raise WindowSpecError(f"--schedule {text!r}: {', '.join(missing)} missing (wait=W,warmup=U,active=A are needed)")
    if counts["active"] < 1:
        raise WindowSpecError(f"--schedule {text!r}: active must be at least 1")
    return WindowSpec(SCHEDULE, **counts)


class WindowState:
    """The window of one recording as the run goes: whether it is open, the steps kept so far (runs of
    consecutive step numbers) and when it last closed. Without a spec it is always open and kept nowhere."""

    def __init__(self, spec: WindowSpec | None) -> None:
        self.spec = spec
        self.open = spec is None or spec.records_step(0)
        self.step_kept = self.open  # whether the window was open at some time during the current step
        self.kept_runs: list[list[int]] = []
        self.last_closed_ns = -1  # ns since the recording's start when the window last closed (-1: never)

    def step_began(self, step: int, now_ns: int) -> bool:
        """Step `step` begins at `now_ns` (step - 1 ended): note whether the ended step was kept, open or
        close the window for this one, and return whether it is open."""
        if self.step_kept:
            self._keep(step - 1)
        if self.spec is not None and self.spec.kind != FROM_CODE:
            self._set_open(self.spec.records_step(step), now_ns)
        self.step_kept = self.open
        return self.open

    def started_from_code(self) -> bool:
        """`tputrace.start()`: opens a `--from-code` window (any other window ignores it); returns whether it is open."""
        if self.spec is not None and self.spec.kind == FROM_CODE:
            self.open = self.step_kept = True
        return self.open

    def stopped_from_code(self, now_ns: int, recorded_in_step: bool) -> bool:
        """`tputrace.stop()`: closes a `--from-code` window; returns whether the window is open. A step in which
        nothing was recorded before the stop (one that began at the step boundary just before it) is not kept."""
        if self.spec is not None and self.spec.kind == FROM_CODE:
            self._set_open(False, now_ns)
            self.step_kept = self.step_kept and recorded_in_step
        return self.open

    def finished(self, step: int, last_step_written: bool) -> bool:
        """The recording ends in step `step` (`last_step_written`: its `steps` row was written); returns
        whether there is a window to write to `meta`."""
        if self.step_kept and last_step_written:
            self._keep(step)
        return self.spec is not None

    def keeps_lifetime(self, alloc_ns: int) -> bool:
        """Whether a buffer made at `alloc_ns` and freed now lived while the window was open."""
        return self.open or alloc_ns <= self.last_closed_ns

    def meta_json(self) -> str:
        """`meta.recording_window`: `{"kind", "spec", "schedule": {...}, "recorded_steps": [[first, last], ...]}`."""
        spec = self.spec
        assert spec is not None
        schedule = {name: getattr(spec, name) for name in SCHEDULE_FIELDS} if spec.kind != FROM_CODE else None
        return json.dumps({"kind": spec.kind, "spec": spec.text, "schedule": schedule, "recorded_steps": self.kept_runs})

    def _set_open(self, open_now: bool, now_ns: int) -> None:
        if self.open and not open_now:
            self.last_closed_ns = now_ns
        self.open = open_now

    def _keep(self, step: int) -> None:
        runs = self.kept_runs
        if runs and runs[-1][1] == step - 1:
            runs[-1][1] = step
        elif not runs or runs[-1][1] < step:
            runs.append([step, step])
