"""The host's C allocator, tuned so that recording an op never stalls on it.

glibc keeps small freed chunks that overflow its per-thread cache in "fastbins", unmerged, and merges
all of them at once (`malloc_consolidate`) when a larger request comes. The strict ops' and XLA's small
host allocations leave them by the thousand, and the merge then lands on one op's call: 1 to 4 ms of
main-thread CPU at an unpredictable point. In `bench/eager_overhead.py` it made every other 500-op
DeferAndFuse round of `x * 2` cost 14 to 16 µs per op instead of 7 to 8. With fastbins off (`M_MXFAST`
0) such a chunk is merged when it is freed; the per-thread cache still serves the common small sizes.
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_MXFAST = 1  # mallopt's parameter for the largest fastbin chunk size; 0 turns fastbins off
_TUNABLE = "glibc.malloc.mxfast"


def disable_fastbins() -> bool:
    """Turn glibc's fastbins off for this process; False where that does not apply: not glibc, or the
    process's `GLIBC_TUNABLES` sets `glibc.malloc.mxfast` itself (the user's choice is kept)."""
    if platform.libc_ver()[0] != "glibc" or _TUNABLE in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MXFAST, 0) == 1
