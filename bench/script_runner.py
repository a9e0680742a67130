"""Runs the script named on the command line as `__main__`, for bench wrappers that change the backend first.

A wrapper is itself run by `tputrace run WRAPPER SCRIPT [ARGS ...]`; it patches what it measures, then calls
`run_named_script()` to hand the rest of the command line to SCRIPT as if it had been run directly.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def run_named_script() -> None:
    """Run `sys.argv[1]` as `__main__` with `sys.argv[2:]` as its arguments and its folder first on `sys.path`."""
    script = Path(sys.argv[1]).resolve()
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path[0] = str(script.parent)
    runpy.run_path(str(script), run_name="__main__")
