"""Importing the backend turns glibc's fastbins off (`backend/host_allocator.py`): small freed chunks
are merged when freed, not all at once in the middle of a later op. Read back from glibc itself
(`mallinfo2().smblks`, the chunks held in fastbins) in fresh processes."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the fastbins are glibc's")

# Frees 2,000 chunks of 48 bytes (past the per-thread cache's 7 per size), then prints how many chunks
# glibc's fastbins hold.
_FASTBIN_CHUNKS = """
import ctypes
{setup}
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = MallInfo2
libc.mallinfo2()  # ctypes' first call of it allocates: a large request would merge the fastbins first
chunks = [libc.malloc(48) for _ in range(2000)]
for chunk in chunks[::2]:  # every other one: freed neighbours could merge whatever the setting
    libc.free(chunk)
fastbin_chunks = libc.mallinfo2().smblks  # read before print, whose first call allocates stdout's buffer
print(fastbin_chunks)
"""


def _fastbin_chunks(setup: str, env: dict[str, str] | None = None) -> int:
    completed = subprocess.run(
        [sys.executable, "-c", _FASTBIN_CHUNKS.format(setup=setup)], capture_output=True, text=True, timeout=300, env=env, check=True
    )
    return int(completed.stdout.strip().splitlines()[-1])


def test_the_backend_import_turns_fastbins_off() -> None:
    assert _fastbin_chunks("") > 500  # the check can see them: glibc's default keeps them
    assert _fastbin_chunks("import tputrace.backend") == 0


def test_a_tunable_the_user_set_is_kept() -> None:
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.mxfast=128"}
    assert _fastbin_chunks("import tputrace.backend", env) > 500
