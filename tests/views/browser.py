"""Headless Chromium for tests: load a local HTML page, read back its DOM, take a screenshot.

Uses the `chromium` command line only (`--dump-dom`, `--screenshot`) with a virtual-time budget, so
the page's scripts (plotly drawing every figure) finish before the DOM is read. Pages written by
`tputrace plot` record their own errors in `#tputrace-errors` and set `data-figures-rendered` /
`data-figures-expected` / `data-report-done` on `<body>` when drawing is over; `PageResult` reads those.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Software WebGL (SwiftShader) for plotly's scattergl on machines without a GPU; the page is local and trusted.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu-sandbox",
    "--enable-unsafe-swiftshader",
    "--use-angle=swiftshader",
    "--hide-scrollbars",
    "--mute-audio",
    "--no-first-run",
    "--disable-extensions",
    "--disable-background-networking",
    "--allow-file-access-from-files",
)


def find_chromium() -> str | None:
    """The Chromium executable: `$TPUTRACE_CHROMIUM`, else the first of `CHROMIUM_NAMES` on PATH."""
    configured = os.environ.get("TPUTRACE_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() or shutil.which(configured) else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageResult:
    """What a page looked like once its scripts had run."""

    dom: str
    stderr: str

    def body_attribute(self, name: str) -> str | None:
        body = re.search(r"<body([^>]*)>", self.dom)
        if body is None:
            return None
        match = re.search(rf'\s{re.escape(name)}="([^"]*)"', body.group(1))
        return match.group(1) if match else None

    @property
    def done(self) -> bool:
        return self.body_attribute("data-report-done") == "true"

    @property
    def figures_expected(self) -> int:
        return int(self.body_attribute("data-figures-expected") or -1)

    @property
    def figures_rendered(self) -> int:
        return int(self.body_attribute("data-figures-rendered") or -1)

    @property
    def render_ms(self) -> int | None:
        """Milliseconds from navigation until the page had drawn every figure (the page's own clock)."""
        value = self.body_attribute("data-render-ms")
        return int(value) if value is not None else None

    @property
    def figure_ids(self) -> list[str]:
        return re.findall(r'<div class="tp-figure[^"]*" id="([^"]+)"', self.dom)

    @property
    def unrendered_figures(self) -> list[str]:
        """Ids of figure elements that did not get `data-rendered="true"`."""
        missing = []
        for match in re.finditer(r'<div class="tp-figure[^"]*"[^>]*>', self.dom):
            tag = match.group(0)
            if 'data-rendered="true"' not in tag:
                found = re.search(r'id="([^"]+)"', tag)
                missing.append(found.group(1) if found else tag)
        return missing

    @property
    def page_errors(self) -> str:
        """The text of the page's own error box (empty when nothing went wrong)."""
        match = re.search(r'<pre id="tputrace-errors"[^>]*>(.*?)</pre>', self.dom, re.S)
        return match.group(1).strip() if match else ""


def _command(chromium: str, profile: str, extra: list[str]) -> list[str]:
    return [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra]


def load_page(
    page: Path,
    *,
    screenshot: Path | None = None,
    window: tuple[int, int] = (1400, 1000),
    budget_ms: int | None = 60_000,
    timeout_s: float = 240,
    chromium: str | None = None,
) -> PageResult:
    """Open `page` in headless Chromium, let its scripts run, return its DOM; optionally save a screenshot.

    With `budget_ms`, Chromium runs the page on a virtual clock for that long before reading it (robust:
    late timers and promises have run); with None, the DOM is read at the load event on the real clock
    (what a timing wants)."""
    executable = chromium or find_chromium()
    if executable is None:
        raise FileNotFoundError("no Chromium found (install Debian's chromium, or set TPUTRACE_CHROMIUM)")
    url = page.resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="tputrace-chromium-") as profile:
        common = [f"--window-size={window[0]},{window[1]}"]
        if budget_ms is not None:
            common.append(f"--virtual-time-budget={budget_ms}")
        dumped = subprocess.run(
            _command(executable, profile, [*common, "--dump-dom", url]),
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )
        if dumped.returncode != 0:
            raise RuntimeError(f"chromium exited with {dumped.returncode}: {dumped.stderr[-2000:]}")
        if screenshot is not None:
            shot = subprocess.run(
                _command(executable, profile, [*common, f"--screenshot={screenshot.resolve()}", url]),
                capture_output=True, text=True, timeout=timeout_s, check=False,
            )
            if shot.returncode != 0 or not screenshot.exists():
                raise RuntimeError(f"chromium could not take a screenshot ({shot.returncode}): {shot.stderr[-2000:]}")
    return PageResult(dumped.stdout, dumped.stderr)
