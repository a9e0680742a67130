"""Settings the backend reads from environment variables, checked with the standard library only (the
CLI checks them before it imports the backend, so that a bad value is a one-line error)."""

from __future__ import annotations

import os

CHIPS = ("TPUTRACE_CHIPS", 1, "the number of chips")
MAX_PROGRAMS = ("TPUTRACE_MAX_PROGRAMS", 4096, "how many compiled programs to keep")
COUNTS = (CHIPS, MAX_PROGRAMS)
COMPILE_CACHE = "TPUTRACE_COMPILE_CACHE"
HOST_ORIGINS = "TPUTRACE_HOST_ORIGINS"  # 0: do not record the line that made each batch copied to the chip
STEP_REPLAY = "TPUTRACE_STEP_REPLAY"  # 0: DeferAndFuse records every graph op by op, never replaying a repeated one
BACKEND_FRAMES = "TPUTRACE_BACKEND_FRAMES"  # 1: a script's traceback keeps the tpu backend's frames


class SettingError(ValueError):
    """An environment variable's value that the backend cannot use."""


def positive_int(setting: tuple[str, int, str], error: type[Exception] = SettingError) -> int:
    """The whole number of at least 1 that `setting`'s (name, default, meaning) variable holds, or its
    default when unset; `error` says what to set otherwise."""
    name, default, meaning = setting
    raw = os.environ.get(name, str(default))
    try:
        count = int(raw)
    except ValueError:
        raise error(f"{name}={raw!r} is not a number; set it to {meaning}, e.g. {default if default > 1 else 4}") from None
    if count < 1:
        raise error(f"{name}={count} must be at least 1")
    return count


def compile_cache_path() -> str | None:
    """The absolute path `TPUTRACE_COMPILE_CACHE` names, or None when it is unset or empty; nothing is
    checked or created (the recorder notes it in the trace this way)."""
    raw = os.environ.get(COMPILE_CACHE, "").strip()
    return os.path.abspath(os.path.expanduser(raw)) if raw else None


def compile_cache_directory(error: type[Exception] = SettingError) -> str | None:
    """The directory `TPUTRACE_COMPILE_CACHE` names for compiled programs (created if missing), or None
    when it is unset or empty; `error` when it cannot be used."""
    path = compile_cache_path()
    if path is None:
        return None
    raw = os.environ[COMPILE_CACHE].strip()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as failure:
        raise error(f"{COMPILE_CACHE}={raw!r} cannot be used as a directory ({failure.strerror}); set it to a writable directory or unset it") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise error(f"{COMPILE_CACHE}={raw!r} is not writable; set it to a writable directory or unset it")
    return path


def host_origins_enabled(error: type[Exception] = SettingError) -> bool:
    """Whether the recording notes the line that made each host tensor copied to the chip (`TPUTRACE_HOST_ORIGINS`:
    1, the default, or 0); `error` for another value."""
    raw = os.environ.get(HOST_ORIGINS, "1").strip()
    if raw not in ("0", "1"):
        raise error(f"{HOST_ORIGINS}={raw!r} must be 0 (off) or 1 (on, the default)")
    return raw == "1"


def step_replay_enabled(error: type[Exception] = SettingError) -> bool:
    """Whether DeferAndFuse replays a graph that repeats the previous occurrence's (`TPUTRACE_STEP_REPLAY`: 1, the
    default, or 0); `error` for another value."""
    raw = os.environ.get(STEP_REPLAY, "1").strip()
    if raw not in ("0", "1"):
        raise error(f"{STEP_REPLAY}={raw!r} must be 0 (off) or 1 (on, the default)")
    return raw == "1"


def backend_frames_shown(error: type[Exception] = SettingError) -> bool:
    """Whether `tputrace run` prints a script's traceback with the tpu backend's frames below the user's call
    (`TPUTRACE_BACKEND_FRAMES`: 0, the default, or 1); `error` for another value."""
    raw = os.environ.get(BACKEND_FRAMES, "0").strip()
    if raw not in ("0", "1"):
        raise error(f"{BACKEND_FRAMES}={raw!r} must be 0 (hidden, the default) or 1 (shown)")
    return raw == "1"


def check() -> None:
    """Raise `SettingError` for the first setting whose value is not usable."""
    for setting in COUNTS:
        positive_int(setting)
    compile_cache_directory()
    host_origins_enabled()
    step_replay_enabled()
    backend_frames_shown()
