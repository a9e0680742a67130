"""Writes one benchmark's section of bench/RESULTS.md, replacing that section only."""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(title: str, body: str) -> None:
    """Replace (or append) the `## title` section of RESULTS.md with `body` and a dated footer."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nEach section is written by the script it names.\n"
    stamp = f"_Measured {time.strftime('%Y-%m-%d %H:%M')} on {platform.machine()}, {platform.python_implementation()} {platform.python_version()}._"
    section = f"## {title}\n\n{body.strip()}\n\n{stamp}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip() + "\n\n" + section
    RESULTS.write_text(text.rstrip() + "\n")
