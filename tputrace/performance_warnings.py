"""Performance warning categories, raised at the user's line once per site, and the emitter the recorder
calls where events arrive.

- `RecompileWarning`: a program was compiled again (reason `recompile` or `guard_failure`), with what changed.
- `HostSyncWarning`: the host waited for the chips because user code read a value (`.item()`, `print`,
  `bool`, `.tolist()`, `.cpu()`, `.numpy()`, a data-dependent shape) after the first step boundary.
- `TransferWarning`: a host-to-chip copy after the first step boundary (data copied inside the loop).
- `CpuFallbackWarning`: an op ran on the host CPU (raised by the backend when it first falls back on an op).

All derive from `PerformanceWarning`, itself a `RuntimeWarning` (so filters written for the CPU-fallback
`RuntimeWarning` keep working). `CpuFallbackWarning` shows by default, as it always did; the others are
hidden unless a filter asks for them: `-W error::tputrace.RecompileWarning`, `-W default::tputrace.PerformanceWarning`
or pytest's `filterwarnings`. Each is raised through `warnings.warn_explicit` at the user's file and line.
"""

from __future__ import annotations

import sys
import threading
import warnings

from tputrace.sourceloc import first_user_location


class PerformanceWarning(RuntimeWarning):
    """A performance event of a recorded run."""


class RecompileWarning(PerformanceWarning):
    """A program compiled again."""


class HostSyncWarning(PerformanceWarning):
    """The host waited for the chips in the steady loop."""


class TransferWarning(PerformanceWarning):
    """A host-to-chip copy in the steady loop."""


class CpuFallbackWarning(PerformanceWarning):
    """An op ran on the host CPU."""


HIDDEN_BY_DEFAULT: tuple[type[PerformanceWarning], ...] = (RecompileWarning, HostSyncWarning, TransferWarning)
USER_SYNC_KINDS = frozenset({"item", "cpu", "numpy", "tolist", "print", "bool", "data_dependent", "host_outputs"})

_warned_sites: set[tuple[type[Warning], str, int]] = set()
_lock = threading.Lock()
_filters_added = False
pending: list[tuple[type[PerformanceWarning], str, str, int]] = []


def _add_default_filters() -> None:
    """Append 'ignore' for the hidden categories once: appended, so filters from `-W`, `PYTHONWARNINGS`,
    pytest or the user's `warnings.filterwarnings` (all earlier in the list) take precedence."""
    global _filters_added
    if _filters_added:
        return
    _filters_added = True
    for category in HIDDEN_BY_DEFAULT:
        warnings.filterwarnings("ignore", category=category, append=True)
    _apply_command_line_options()


def _apply_command_line_options() -> None:
    """Apply the `-W` / `PYTHONWARNINGS` options that name these categories: the interpreter reads them
    before an editable install makes `tputrace` importable, and ignores them ("invalid module name")."""
    for option in sys.warnoptions:
        parts = [part.strip() for part in option.split(":")] + [""] * 5
        action, message, category_name, module, line = parts[:5]
        category = globals().get(category_name.removeprefix("tputrace.")) if category_name.startswith("tputrace.") else None
        if not (isinstance(category, type) and issubclass(category, PerformanceWarning)):
            continue
        actions = {"error", "ignore", "always", "default", "module", "once"}
        chosen = next((name for name in actions if name.startswith(action or "default")), None)
        if chosen is None:
            continue
        warnings.filterwarnings(chosen, message, category, module, int(line) if line.isdigit() else 0)  # type: ignore[arg-type]


def warn_at_user_line(category: type[PerformanceWarning], message: str, skip: int = 2) -> None:
    """Raise `message` as `category` at the innermost user line, once per category and site."""
    location = first_user_location(skip + 1)
    if location is None:
        return
    _warn_once(category, message, location[0], location[1])


def _warn_once(category: type[PerformanceWarning], message: str, file: str, line: int) -> None:
    with _lock:
        key = (category, file, line)
        if key in _warned_sites:
            return
        _warned_sites.add(key)
        _add_default_filters()
    warnings.warn_explicit(f"tputrace: {message}", category, file, line)


def recompiled(name: str, reason: str, diff: str | None) -> None:
    """The recorder saw a compile; when it is a recompile, keep its warning for `raise_pending`: the
    backend compiles inside a handler that would take a warning turned into an error for a failed lowering."""
    if reason == "first":
        return
    location = first_user_location(2)
    if location is not None:
        pending.append((RecompileWarning, f"{name} recompiled ({diff or reason})", location[0], location[1]))


def raise_pending() -> None:
    """Raise the warnings kept while the backend compiled (the recorder calls it once an op ran, a step
    ended, or the host synced or copied)."""
    while pending:
        category, message, file, line = pending.pop(0)
        _warn_once(category, message, file, line)


def synced(kind: str, step: int) -> None:
    """The recorder saw a host sync; warn when user code caused it after the first step boundary."""
    raise_pending()
    if step >= 1 and kind in USER_SYNC_KINDS:
        warn_at_user_line(HostSyncWarning, f"host sync ({kind}) in step {step}: the host waits for the chips here")


def transferred(direction: str, nbytes: int, step: int) -> None:
    """The recorder saw a transfer; warn on a host-to-chip copy after the first step boundary."""
    raise_pending()
    if step >= 1 and direction.startswith("h2d"):
        warn_at_user_line(TransferWarning, f"host-to-chip copy of {nbytes} bytes in step {step}")
