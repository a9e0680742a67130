"""The one registry of named actions: it feeds key bindings, the `?` help screen and the command palette.

Each action has a stable id (`view.ops`, `timeline.zoom_in`, ...). Users remap keys by id
(`tputrace tui TRACE --keys timeline.zoom_in=i`); the id is also the `Binding.id`, so Textual's
keymap does the remapping.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from textual.binding import Binding

APP = "app"


@dataclass(frozen=True)
class NamedAction:
    """One user action: where it applies (`scope`: "app" or a view id), its default keys and what it runs."""

    id: str
    keys: str
    action: str
    title: str
    help: str
    scope: str = APP
    footer: bool = True
    palette: bool = True

    @property
    def binding(self) -> Binding:
        return Binding(self.keys, self.action, self.title, show=self.footer, tooltip=self.help, id=self.id)


VIEW_ORDER: tuple[tuple[str, str], ...] = (
    ("overview", "Overview"),
    ("findings", "Findings"),
    ("ops", "Ops"),
    ("compiles", "Compiles"),
    ("fusions", "Fusions"),
    ("collectives", "Collectives"),
    ("timeline", "Timeline"),
    ("source", "Source"),
    ("sharding", "Sharding"),
    ("compare", "Compare"),
    ("memory", "Memory"),
)
"""Every view: (id, title), in tab order; view N is shown by key N (the tenth by 0), a view past the tenth by its
letter in `LETTER_KEYS`."""

SHORT_TITLES = {
    "overview": "Over", "findings": "Find", "ops": "Ops", "compiles": "Comp", "fusions": "Fuse", "collectives": "Coll",
    "timeline": "Time", "source": "Src", "sharding": "Shard", "compare": "Cmp", "memory": "Mem",
}
"""Each view's tab title where the whole titles do not fit the terminal's width (80 columns)."""

LETTER_KEYS = {"memory": "M"}


def view_key(position: int) -> str:
    """The key of the view at `position` (1-based) in `VIEW_ORDER`."""
    if position > 10:
        return LETTER_KEYS[VIEW_ORDER[position - 1][0]]
    return str(position % 10)


_VIEW_HELP = {
    "overview": "run facts, step times with compile steps marked, where the time went, top findings",
    "findings": "ranked diagnoses with explanation, evidence and suggestion",
    "ops": "op time aggregated by op, shapes, source line or module; filter, sort, drill down",
    "compiles": "every compile with its reason and old -> new signature; compiles per call site",
    "fusions": "DeferAndFuse flushes: trigger, size, cache hit, ops inside, XLA's fusions",
    "collectives": "collectives by kind and size; time and waiting per rank",
    "sharding": "meshes, parameter placements and bytes per rank, collectives by cause, module and line",
    "timeline": "host and chip lanes for a step or window; zoom and pan",
    "source": "the user's files with host time (dispatch, compiles, sync stalls, copies), ops, compiles and syncs per line",
    "compare": "with --compare BASELINE: what changed since the baseline run, as tputrace diff says it",
    "memory": "live bytes over time; at the peak, bytes by kind, module and line; lines whose buffers outlive their step",
}

ACTIONS: tuple[NamedAction, ...] = (
    *(
        NamedAction(f"view.{view_id}", view_key(index), f"show_view('{view_id}')", title,
                    f"Show the {title} view: {_VIEW_HELP[view_id]}", footer=False)
        for index, (view_id, title) in enumerate(VIEW_ORDER, start=1)
    ),
    NamedAction("app.help", "question_mark", "help", "Keys", "Show every key binding"),
    NamedAction("app.next_rank", "R", "next_rank", "Rank", "Show the next rank of a multi-rank trace", footer=False),
    NamedAction("app.theme", "T", "next_theme", "Theme", "Switch between the terminal-colour, dark and light themes", footer=False),
    NamedAction("app.quit", "q", "quit", "Quit", "Quit tputrace"),
    NamedAction("findings.source", "enter", "go_to_source", "Source", "Show the finding's line in the Source view", scope="findings"),
    NamedAction("ops.filter", "slash", "filter", "Filter", "Filter groups by text (case-insensitive, literal)", scope="ops"),
    NamedAction("ops.group", "g", "next_grouping", "Group", "Group by op, op + shapes, source line or module", scope="ops"),
    NamedAction("ops.sort", "s", "next_order", "Sort", "Sort by total time, count or mean time", scope="ops"),
    NamedAction("ops.open", "enter", "open_row", "Open", "Drill down into a group's instances; on an instance, show its source line", scope="ops"),
    NamedAction("ops.back", "escape,backspace", "back", "Back", "Back from instances to groups, or clear the filter", scope="ops"),
    NamedAction("compiles.source", "enter", "go_to_source", "Source", "Show the compile's call site in the Source view", scope="compiles"),
    NamedAction("fusions.sort", "s", "next_order", "Sort", "Sort flushes by time or by duration", scope="fusions"),
    NamedAction("fusions.source", "enter", "go_to_source", "Source", "Show the flush's trigger line in the Source view", scope="fusions"),
    NamedAction("timeline.zoom_in", "plus,equals_sign", "zoom(0.5)", "Zoom in", "Halve the window around its centre", scope="timeline"),
    NamedAction("timeline.zoom_out", "minus", "zoom(2.0)", "Zoom out", "Double the window around its centre", scope="timeline"),
    NamedAction("timeline.pan_left", "left,h", "pan(-0.25)", "Pan", "Move the window a quarter earlier", scope="timeline"),
    NamedAction("timeline.pan_right", "right,l", "pan(0.25)", "Pan", "Move the window a quarter later", scope="timeline", footer=False),
    NamedAction("timeline.prev_step", "left_square_bracket", "step(-1)", "Step", "Show the previous step", scope="timeline"),
    NamedAction("timeline.next_step", "right_square_bracket", "step(1)", "Step", "Show the next step", scope="timeline", footer=False),
    NamedAction("timeline.whole", "w", "whole_run", "Whole run", "Show the whole run", scope="timeline"),
    NamedAction("timeline.event", "enter", "open_event", "Zoom to event",
                "Zoom to the event under the cursor in the list of longest events (Enter again: its source line)", scope="timeline"),
    NamedAction("source.open", "o", "open_in_editor", "Open in $EDITOR", "Open the current line in $EDITOR", scope="source"),
    NamedAction("source.next_hot", "n", "hot_line(1)", "Next hot", "Jump to the next line with recorded activity", scope="source"),
    NamedAction("source.prev_hot", "N", "hot_line(-1)", "Prev hot", "Jump to the previous line with recorded activity", scope="source", footer=False),
    NamedAction("source.files", "f", "focus_files", "Files", "Move to the list of files", scope="source"),
)

ACTIONS_BY_ID: dict[str, NamedAction] = {action.id: action for action in ACTIONS}


def bindings(scope: str) -> list[Binding]:
    """The `BINDINGS` of the node that owns `scope`."""
    return [action.binding for action in ACTIONS if action.scope == scope]


def actions_in(scopes: Iterable[str]) -> list[NamedAction]:
    wanted = set(scopes)
    return [action for action in ACTIONS if action.scope in wanted]


def parse_keymap(entries: Iterable[str]) -> dict[str, str]:
    """`["view.ops=o", "app.quit=ctrl+q,q"]` -> a keymap by binding id; raises ValueError for an unknown id."""
    keymap: dict[str, str] = {}
    for entry in entries:
        binding_id, separator, keys = entry.partition("=")
        binding_id, keys = binding_id.strip(), keys.strip()
        if not separator or not keys:
            raise ValueError(f"key binding {entry!r} is not ID=KEYS (for example view.ops=o)")
        if binding_id not in ACTIONS_BY_ID:
            raise ValueError(f"no action with id {binding_id!r}; ids: {', '.join(ACTIONS_BY_ID)}")
        keymap[binding_id] = keys
    return keymap
