"""Waiting at interpreter exit for the programs still running.

JAX runs a launched program on XLA's own threads and returns at once. A script whose last lines
launch one (a backward pass's flush, a step whose values nobody reads) reaches the end of the
interpreter while it runs, and the teardown of XLA's C++ state under the running program crashed
the process with a segmentation fault after the script had finished.
"""

from __future__ import annotations

import atexit

import jax

_registered = False


def wait_for_running_programs() -> None:
    """Block until every array still alive is computed (the outputs of every program running)."""
    try:
        jax.block_until_ready(jax.live_arrays())
    except Exception:  # noqa: BLE001 - a program that failed has nothing left running; exit as the script asked
        pass


def register() -> None:
    """Wait for running programs at exit (idempotent)."""
    global _registered
    if not _registered:
        atexit.register(wait_for_running_programs)
        _registered = True
