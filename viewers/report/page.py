"""The report page's frame: figures collected as JSON blocks, HTML tables and sections, and the page's
own CSS and scripts.

Figure JSON sits in `<script type="application/json">` blocks with `<`, `>` and `&` written as JSON
escapes, so no trace text can close a tag or start a script. The page records its own errors
(`window.onerror`, unhandled rejections, `console.error`) in `#tputrace-errors` and marks each figure
`data-rendered="true"` once plotly has drawn it, so a headless browser can check it; `<body>` gets
`data-report-done`, the figure counts and `data-render-ms` (ms from navigation until everything was drawn).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import plotly.graph_objects as go

from tputrace.viewers.report.figure_style import esc

PlotlyJsMode = Literal["inline", "cdn"]
PLOTLYJS_MODES: tuple[str, ...] = ("inline", "cdn")
MAX_TABLE_ROWS = 15

SECTION_TITLES: dict[str, str] = {
    "timeline": "1 · Timeline",
    "steps": "2 · Step times",
    "where": "3 · Where time goes",
    "recompilations": "4 · Recompilations",
    "shapes": "5 · Shapes and padding",
    "roofline": "6 · Roofline",
    "collectives": "7 · Collectives",
    "memory": "8 · Memory",
    "sharding": "9 · Sharding",
}



class Page:
    """Collects figures (as JSON blocks) while the body is written, then assembles the document."""

    def __init__(self) -> None:
        self.figure_json: list[tuple[str, str]] = []

    def figure(self, name: str, figure: go.Figure) -> str:
        element_id = f"fig-{name}"
        self.figure_json.append((element_id, _safe_json(figure.to_json())))
        return f'<div class="tp-figure" id="{element_id}" data-figure="{esc(name)}"></div>'

    def document(self, title: str, body: str, plotlyjs: PlotlyJsMode) -> str:
        data_blocks = "\n".join(
            f'<script type="application/json" id="{element_id}-data">{payload}</script>'
            for element_id, payload in self.figure_json
        )
        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<meta name=\"generator\" content=\"tputrace plot\">\n<title>{esc(title)}</title>\n"
            f"<style>{_CSS}</style>\n<script>{_ERROR_CAPTURE_JS}</script>\n{_plotlyjs_tag(plotlyjs)}\n</head>\n"
            f"<body>\n<pre id=\"tputrace-errors\" hidden></pre>\n{body}\n{data_blocks}\n"
            f"<script>{_RENDER_JS}</script>\n</body>\n</html>\n"
        )


def _safe_json(text: str) -> str:
    """JSON that cannot end its `<script>` block or be read as markup (same value once parsed)."""
    return (
        text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    )


def _plotlyjs_tag(mode: PlotlyJsMode) -> str:
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    if mode == "cdn":
        return f'<script src="https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js" charset="utf-8"></script>'
    if mode != "inline":
        raise ValueError(f"plotly.js mode must be one of {', '.join(PLOTLYJS_MODES)}, not {mode!r}")
    return f"<script>{get_plotlyjs()}</script>"


def html_table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Sequence[bool] | None = None,
           caption: str | None = None, narrow: bool = False) -> str:
    """An HTML table; cells must already be escaped (headers are escaped here)."""
    numeric = numeric or [False] * len(headers)
    head = "".join(f'<th class="{"num" if is_number else ""}">{esc(header)}</th>' for header, is_number in zip(headers, numeric))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"num" if is_number else ""}">{cell}</td>' for cell, is_number in zip(row, numeric)) + "</tr>"
        for row in rows
    )
    caption_html = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f'<table class="tp-table{" tp-narrow" if narrow else ""}">{caption_html}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def note_html(text_html: str) -> str:
    return f'<p class="tp-note">{text_html}</p>'


def section_html(key: str, content: str, aside: str, *, title: str | None = None) -> str:
    return (
        f'<section id="{key}" class="tp-section"><h2>{esc(title or SECTION_TITLES[key])}</h2>'
        f'<div class="tp-row"><div class="tp-main">{content}</div><aside class="tp-findings">{aside}</aside></div></section>'
    )


# -- page assets ----------------------------------------------------------------------------------------

_CSS = """
:root { --fg: #1f2328; --muted: #667085; --line: #e4e7ec; --bg: #fff; --soft: #f6f8fa;
        --critical: #c0392b; --warning: #d98c00; --info: #2f6fb0; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: var(--bg); }
header { padding: 16px 24px 8px; border-bottom: 1px solid var(--line); background: var(--soft); }
h1 { font-size: 20px; margin: 0 0 8px; } h2 { font-size: 17px; margin: 0 0 10px; } h3 { font-size: 14px; margin: 0 0 8px; }
nav { display: flex; flex-wrap: wrap; gap: 4px 14px; margin-top: 10px; }
nav a { color: var(--info); text-decoration: none; } nav a:hover { text-decoration: underline; }
main { padding: 0 24px 24px; }
footer { padding: 12px 24px; font-size: 12px; }
.tp-muted { color: var(--muted); font-weight: normal; }
.tp-facts { border-collapse: collapse; font-size: 13px; }
.tp-facts th { text-align: left; padding: 1px 14px 1px 0; color: var(--muted); font-weight: 500; white-space: nowrap; vertical-align: top; }
.tp-facts td { padding: 1px 16px 1px 0; word-break: break-all; }
.tp-narrow { max-width: 760px; }
.tp-section { padding: 18px 0 8px; border-bottom: 1px solid var(--line); }
.tp-row { display: flex; gap: 20px; align-items: flex-start; }
.tp-main { flex: 3 1 0; min-width: 0; }
.tp-findings { flex: 1 1 0; min-width: 260px; max-width: 420px; font-size: 13px; background: var(--soft); border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px; }
@media (max-width: 1000px) { .tp-row { flex-direction: column; } .tp-findings { max-width: none; width: 100%; } }
.tp-grid2 { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 3fr); gap: 12px; }
@media (max-width: 1000px) { .tp-grid2 { grid-template-columns: minmax(0, 1fr); } }
.tp-figure { width: 100%; min-height: 120px; }
.tp-note { color: var(--muted); font-size: 12.5px; margin: 4px 0 10px; max-width: 110ch; }
.tp-table { border-collapse: collapse; font-size: 12.5px; margin: 8px 0 4px; width: 100%; }
.tp-table caption { text-align: left; color: var(--muted); padding-bottom: 4px; }
.tp-table th, .tp-table td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
.tp-table th { background: var(--soft); font-weight: 600; }
.tp-table .num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.tp-finding { border-left: 4px solid var(--info); background: var(--bg); padding: 6px 10px; margin-bottom: 10px; border-radius: 0 4px 4px 0; }
.tp-finding p { margin: 4px 0; }
.tp-critical { border-color: var(--critical); } .tp-warning { border-color: var(--warning); } .tp-info { border-color: var(--info); }
.tp-badge { display: inline-block; font-size: 11px; text-transform: uppercase; letter-spacing: .03em; padding: 0 5px; border-radius: 3px; color: #fff; background: var(--info); }
.tp-critical .tp-badge { background: var(--critical); } .tp-warning .tp-badge { background: var(--warning); }
.tp-cost { color: var(--muted); font-size: 12px; }
.tp-evidence { margin: 4px 0 0; padding-left: 18px; font-size: 12px; }
.tp-where { color: var(--muted); font-family: ui-monospace, monospace; }
.tp-overview { margin: 0; padding-left: 20px; } .tp-overview li { margin: 3px 0; list-style-position: outside; }
.tp-overview a { color: var(--fg); }
details { margin: 6px 0; } summary { cursor: pointer; color: var(--info); }
pre { white-space: pre-wrap; font-size: 12px; }
#tputrace-errors { margin: 0; padding: 8px 24px; background: #fde8e8; color: #8a1c1c; }
"""

_ERROR_CAPTURE_JS = """
(function () {
  var errors = [];
  function show() {
    var box = document.getElementById('tputrace-errors');
    if (box && errors.length) { box.textContent = 'This page hit errors:\\n' + errors.join('\\n'); box.hidden = false; }
    document.documentElement.setAttribute('data-errors', String(errors.length));
  }
  function record(message) { errors.push(String(message)); show(); }
  window.__tputraceErrors = errors;
  window.__tputraceRecord = record;
  window.__tputraceShowErrors = show;
  window.addEventListener('error', function (event) {
    var where = event.filename ? ' (' + event.filename.split('/').pop() + ':' + event.lineno + ')' : '';
    record('error: ' + (event.message || (event.target && event.target.tagName ? 'failed to load ' + event.target.tagName : event.type)) + where);
  }, true);
  window.addEventListener('unhandledrejection', function (event) {
    var reason = event.reason;
    record('unhandled rejection: ' + (reason && reason.message ? reason.message : reason));
  });
  var consoleError = console.error;
  console.error = function () {
    record('console.error: ' + Array.prototype.map.call(arguments, String).join(' '));
    return consoleError.apply(console, arguments);
  };
})();
"""

_RENDER_JS = """
(function () {
  var record = window.__tputraceRecord;
  var divs = Array.prototype.slice.call(document.querySelectorAll('div.tp-figure'));
  var config = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ['lasso2d', 'select2d'],
                 toImageButtonOptions: { format: 'png', scale: 2 } };
  var jobs = [];
  function finish() {
    var rendered = document.querySelectorAll('div.tp-figure[data-rendered="true"]').length;
    document.body.setAttribute('data-figures-expected', String(divs.length));
    document.body.setAttribute('data-figures-rendered', String(rendered));
    document.body.setAttribute('data-render-ms', String(Math.round(performance.now())));
    document.body.setAttribute('data-report-done', 'true');
    window.__tputraceShowErrors();
  }
  if (typeof Plotly === 'undefined') {
    record('plotly.js did not load (a report written with --plotlyjs cdn needs the network)');
    finish();
    return;
  }
  divs.forEach(function (div) {
    try {
      var spec = JSON.parse(document.getElementById(div.id + '-data').textContent);
      jobs.push(Plotly.newPlot(div, spec.data, spec.layout || {}, config).then(function () {
        div.setAttribute('data-rendered', 'true');
      }, function (error) { record('figure ' + div.id + ': ' + error); }));
    } catch (error) {
      record('figure ' + div.id + ': ' + error);
    }
  });
  Promise.all(jobs).then(finish, finish);
})();
"""
