"""Writes one benchmark's section of bench/RESULTS.md, replacing that section only.

RESULTS.md holds only what the bench scripts write: one `## <title> (bench/<script>.py)` section per script
(and per platform, where a script has a `--platform`), each ending with the host it was measured on. Running a
script again rewrites its section; docs/performance.md says what the figures mean.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "RESULTS.md"
HEADER = (
    "# Benchmark results\n\n"
    "Each section is written by the bench script its title names; run the script again to rewrite it.\n"
    "What the figures mean, and what bounds them, is in [docs/performance.md](../docs/performance.md).\n"
)


def write_section(title: str, body: str) -> None:
    """Replace (or append) the section of RESULTS.md titled `title` with `body` and the host's description.

    The running script's path is added to the title unless the title names it already, so every section says
    which script writes it.
    """
    heading = _heading(title, _running_script())
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    section = f"## {heading}\n\n{body.strip()}\n\n_Measured on {host_description()}._\n"
    pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip() + "\n\n" + section
    RESULTS.write_text(text.rstrip() + "\n")


def _heading(title: str, script: str | None) -> str:
    """`title`, with `(script)` added when the title does not name the script already."""
    if script is None or script in title:
        return title
    return f"{title} ({script})"


def _running_script() -> str | None:
    """`bench/<name>.py` for the bench script this process runs, or None when it runs none."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is None:
        return None
    script = Path(main_file).resolve()
    return f"bench/{script.name}" if script.parent == BENCH else None


def host_description() -> str:
    """The machine, its processor and core count, and the Python that measured: what a figure depends on."""
    processor = _processor_name()
    cores = os.cpu_count()
    machine = platform.machine()
    core_count = f"{cores} cores" if cores else None
    hardware = ", ".join(part for part in (processor, core_count) if part)
    where = f"{machine} ({hardware})" if hardware else machine
    return f"{where}, {platform.python_implementation()} {platform.python_version()}"


def _processor_name() -> str | None:
    """The processor's model name from /proc/cpuinfo (Linux), or None where it cannot be read."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    return match.group(1).strip() if match else None
