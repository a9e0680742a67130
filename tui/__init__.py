"""The terminal UI: `tputrace tui TRACE` opens a Textual app over a trace (see `tputrace.tui.app`).

Importing this package is cheap and does not import Textual; `queries` and `session` never do
(they are the headless part, tested without a terminal).
"""
