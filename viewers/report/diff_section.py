"""The comparison page's "What changed" section: `tputrace diff`'s result as HTML (every string escaped)."""

from __future__ import annotations

from tputrace.compare.diff import RunDiff, improvements
from tputrace.viewers.report.figure_style import esc, fmt_ns
from tputrace.viewers.report.page import html_table, note_html


def diff_content(difference: RunDiff) -> str:
    """The headline, each figure before and after, then recompiles, findings and programs new, fixed or
    changed, and the lines and modules whose op time changed most."""
    better = improvements(difference)
    parts = [f'<p class="tp-headline"><strong>{esc(difference.headline)}</strong></p>']
    if better:
        parts.append(f"<p>{esc(better)}</p>")
    if difference.note:
        parts.append(note_html(esc(difference.note)))
    parts.append(html_table(
        ["", "before → after", ""],
        [[esc(change.name), esc(change.text), "worse" if change.worse else ""] for change in difference.figures],
        narrow=True))
    events = [[esc(status), esc(what), esc(site or "–"), esc(detail)] for status, what, site, detail in difference.events()]
    if events:
        parts.append(html_table(["", "what", "where", "detail"], events))
    else:
        parts.append(note_html("No recompile, finding or program is new, fixed or changed."))
    if difference.op_time:
        parts.append(html_table(
            ["op time by", "", "before", "after"],
            [[esc(change.by), esc(change.label), esc(fmt_ns(change.before_ns)), esc(fmt_ns(change.after_ns))]
             for change in difference.op_time],
            numeric=[False, False, True, True]))
        parts.append(note_html("Host dispatch without the flushes and compiles that ran inside the ops, measured on "
                               "this host; lines and modules whose time changed most."))
    parts.append(note_html("Recompiles, findings and programs are matched by source line (its text where both runs' "
                           "copies of the file are readable), as <code>tputrace diff</code> matches them."))
    return "".join(parts)
