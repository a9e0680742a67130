"""The recording window a trace was recorded with (`meta.recording_window`, written by `tputrace run --steps`,
`--schedule` or `--from-code`), and the one sentence every view shows of it: "this trace records steps 2-3 of
the run (--schedule wait=1,warmup=1,active=2)"."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tputrace.schema import RECORDING_WINDOW_META_KEY

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

_KINDS = ("steps", "schedule", "from_code")


@dataclass(frozen=True)
class RecordingWindow:
    """Which steps a trace keeps: `kind` (steps, schedule or from_code), the options that asked for it
    (`spec`, as `tputrace run` takes them) and the recorded steps as (first, last) runs, in order."""

    kind: str
    spec: str
    recorded_steps: tuple[tuple[int, int], ...]

    @property
    def step_count(self) -> int:
        """How many steps were recorded (each in part, for a window opened or closed inside a step)."""
        return sum(last - first + 1 for first, last in self.recorded_steps)

    @property
    def text(self) -> str:
        """The sentence every view shows."""
        if not self.recorded_steps:
            return f"this trace records no step of the run: the recording window ({self.spec}) never opened"
        return f"this trace records {steps_text(self.recorded_steps)} of the run ({self.spec}); the other steps ran unrecorded"

    def plain_data(self) -> dict[str, Any]:
        """The window as JSON data (`tputrace report --json`)."""
        return {"kind": self.kind, "spec": self.spec, "recorded_steps": [list(run) for run in self.recorded_steps], "text": self.text}


def steps_text(runs: tuple[tuple[int, int], ...]) -> str:
    """`step 4`, `steps 2-3`, `steps 2-3 and 6`, `steps 0-1, 4-5 and 8`."""
    parts = [str(first) if first == last else f"{first}-{last}" for first, last in runs]
    single = len(runs) == 1 and runs[0][0] == runs[0][1]
    listed = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    return f"{'step' if single else 'steps'} {listed}"


def recording_window(trace: Trace) -> RecordingWindow | None:
    """The trace's recording window; None when it records the whole run (or its `meta` entry is not one
    this reader understands: the file comes from someone else and is only read, never trusted)."""
    text = trace.meta.get(RECORDING_WINDOW_META_KEY)
    if not text:
        return None
    try:
        fields = json.loads(text)
    except ValueError:
        return None
    if not isinstance(fields, dict) or fields.get("kind") not in _KINDS or not isinstance(fields.get("spec"), str):
        return None
    runs = fields.get("recorded_steps")
    if not isinstance(runs, list):
        return None
    recorded = []
    for run in runs:
        if not (isinstance(run, list) and len(run) == 2 and all(type(step) is int for step in run) and run[0] <= run[1]):
            return None
        recorded.append((run[0], run[1]))
    return RecordingWindow(fields["kind"], fields["spec"], tuple(recorded))
