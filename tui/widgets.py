"""Widgets shared by the views: a paged table, the key-binding help screen and the command palette provider."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rich.cells import cell_len
from rich.console import RenderableType
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from tputrace.tui.actions import ACTIONS, APP, VIEW_ORDER, NamedAction

if TYPE_CHECKING:
    from textual.app import ComposeResult

Row = tuple[str, Sequence[RenderableType | str]]
"""A table row: its key and its cells. String cells are shown literally (never parsed as markup)."""


HELP_MIN_DESCRIPTION = 24
"""The help screen's descriptions wrap to at least this many cells; below it the action title column drops."""

HELP_SCROLLBAR_CELLS = 2
"""Cells the help table leaves for its vertical scrollbar."""

WIDTH_SAMPLE_ROWS = 5000
"""Column widths are measured over at most this many rows."""

MIN_TEXT_WIDTH = 8
"""A text column narrowed to fit the table's width keeps at least this many cells (and its label's width)."""


def cell_width(cell: Any) -> int:
    """The width in cells of a table cell's first line."""
    if isinstance(cell, Text):
        return max((cell_len(line) for line in cell.plain.splitlines()), default=0)
    return cell_len(str(cell)) if cell is not None else 0


def is_text_cell(cell: Any) -> bool:
    """Whether a cell is left-aligned text, which may end in `…` when its column is narrowed (numbers are
    right-aligned, and never narrowed)."""
    return isinstance(cell, str) or (isinstance(cell, Text) and cell.justify != "right")


def fitted_widths(natural: Sequence[int], minimums: Sequence[int], narrowable: Sequence[bool], budget: int) -> list[int]:
    """Column widths within `budget` cells: the narrowable columns are capped at one width (the widest
    cut first, none below its minimum); the others keep their natural width."""
    widths = list(natural)
    if sum(widths) <= budget or not any(narrowable):
        return widths

    def total(cap: int) -> int:
        return sum(max(min(width, cap), low) if narrow else width for width, low, narrow in zip(natural, minimums, narrowable))

    low_cap, high_cap = 0, max(width for width, narrow in zip(natural, narrowable) if narrow)
    while low_cap < high_cap:  # the largest cap that fits (or the smallest, when none does)
        middle = (low_cap + high_cap + 1) // 2
        if total(middle) <= budget:
            low_cap = middle
        else:
            high_cap = middle - 1
    return [max(min(width, low_cap), low) if narrow else width for width, low, narrow in zip(natural, minimums, narrowable)]


def literal(value: Any) -> RenderableType:
    """A cell for any value: renderables pass through; everything else becomes plain `Text`."""
    if isinstance(value, Text) or (hasattr(value, "__rich_console__") and not isinstance(value, str)):
        return value
    return Text("" if value is None else str(value))


class TraceTable(DataTable, inherit_bindings=False):
    """A row-cursor table that shows rows a page at a time, as wide as the space it has.

    Columns are as wide as their label and widest cell. When they are wider together than the table,
    its text columns are narrowed, the widest first, and their cells end in `…` (the detail panes and
    the Source view show them whole); numbers and bars are never narrowed, so that no number is cut
    and no horizontal scrollbar appears mid-view. Where even that is too wide, the `optional` columns
    (keys, the first given first) are left out until the rest fit. `fit_width=False` keeps natural widths
    and scrolls (the Source view's code).

    `show(rows, more=...)` replaces the rows; the first page is added at once and the next page when
    the cursor nears the end. When the rows given are exhausted and `more` was True, the table posts
    `NeedMore` so its view can fetch the next page from the trace (`extend` adds it).

    Enter is not bound here, so it reaches the view's own (remappable) binding.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "cursor_up", "Up", show=False),
        Binding("down,j", "cursor_down", "Down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown,space", "page_down", "Page down", show=False),
        Binding("home,ctrl+home", "scroll_top", "Top", show=False),
        Binding("end,ctrl+end", "scroll_bottom", "Bottom", show=False),
        Binding("left", "scroll_left", "Left", show=False),
        Binding("right", "scroll_right", "Right", show=False),
    ]

    class NeedMore(Message):
        """The cursor reached the last loaded row and the view said more rows exist."""

        def __init__(self, table: TraceTable, loaded: int) -> None:
            super().__init__()
            self.table = table
            self.loaded = loaded

        @property
        def control(self) -> TraceTable:
            return self.table

    def __init__(self, *columns: str | tuple[str, str], page_size: int = 100, max_column_width: int = 80, fit_width: bool = True,
                 optional: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.max_column_width = max_column_width
        self.fit_width = fit_width
        self.optional = tuple(optional)
        # Per column given (shown or not): its natural width, whether it may be narrowed, its minimum width.
        self._natural_widths: list[int] = []
        self._narrowable: list[bool] = []
        self._minimums: list[int] = []
        self._shown: list[int] = []  # the indices of the columns on show
        self._all_rows: list[Row] = []  # every row given (added or waiting), to add again when columns are left out
        self._column_specs = columns
        self.page_size = page_size
        self._waiting: list[Row] = []
        self._more = False
        self._requested = False
        self.loaded = 0
        self._centred_row: int | None = None

    def on_mount(self) -> None:
        self._add_columns([])

    def _add_columns(self, rows: Sequence[Row]) -> None:
        """(Re)create the columns, each as wide as its label and widest cell among `rows`, then fit them.

        Widths are set here rather than measured by DataTable when idle: that measurement does
        not invalidate rows already rendered, which could leave cells cropped to the label's width.
        """
        widths = [0] * len(self._column_specs)
        texts = [True] * len(self._column_specs)
        for _, cells in rows[:WIDTH_SAMPLE_ROWS]:
            for index, cell in enumerate(cells[: len(widths)]):
                widths[index] = max(widths[index], cell_width(cell))
                texts[index] = texts[index] and is_text_cell(cell)
        self._natural_widths, self._narrowable, self._minimums = [], [], []
        for index, spec in enumerate(self._column_specs):
            label, key = spec if isinstance(spec, tuple) else (spec, spec)
            width = min(max(widths[index], cell_len(label)), self.max_column_width)
            self._natural_widths.append(width)
            self._narrowable.append(texts[index] and key != "bar")
            self._minimums.append(min(width, max(cell_len(label), MIN_TEXT_WIDTH)) if self._narrowable[-1] else width)
        self._shown = self._columns_to_show()
        for index in self._shown:
            spec = self._column_specs[index]
            label, key = spec if isinstance(spec, tuple) else (spec, spec)
            self.add_column(Text(label), key=key, width=self._natural_widths[index])
        self._fit_columns()

    def _available_width(self) -> int:
        """The cells the columns may take (0 before the table is laid out)."""
        available = self.scrollable_content_region.width
        rows = max(self.row_count, len(self._all_rows))  # the rows given, also while they are being added again
        if available > 0 and not self.show_vertical_scrollbar and rows + self.header_height > self.scrollable_content_region.height:
            available -= self.styles.scrollbar_size_vertical  # the scrollbar the rows will need
        return available

    def _columns_to_show(self) -> list[int]:
        """Every column, less the optional ones (in their order) while the rest cannot fit at their minimum widths."""
        shown = list(range(len(self._column_specs)))
        available = self._available_width()
        if not self.fit_width or not self.optional or available <= 0:
            return shown
        keys = [spec[1] if isinstance(spec, tuple) else spec for spec in self._column_specs]
        for key in self.optional:
            if sum(self._minimums[index] + 2 * self.cell_padding for index in shown) <= available:
                break
            if key in keys:
                shown.remove(keys.index(key))
        return shown

    def _fit_columns(self) -> None:
        """Narrow the text columns so that the columns fit the table's width (or widen them back), leaving out
        optional columns (or bringing them back) first when needed."""
        if not self.fit_width or len(self.columns) != len(self._shown):
            return
        available = self._available_width()
        if available <= 0:
            return
        if self._columns_to_show() != self._shown:
            self._rebuild()
            return
        natural = [self._natural_widths[index] for index in self._shown]
        padding = 2 * self.cell_padding * len(self._shown)
        widths = fitted_widths(natural, [self._minimums[index] for index in self._shown],
                               [self._narrowable[index] for index in self._shown], available - padding)
        self._set_widths(widths)
        # Fitted, the table needs no horizontal scrollbar; saying so also makes Textual look at its scrollbars again
        # (it does not when only the columns' width changes).
        self.styles.overflow_x = "hidden" if sum(widths) + padding <= available else "auto"

    def _rebuild(self) -> None:
        """Recreate the columns (another set of them fits now) and add again the rows already added."""
        cursor_row, added = self.cursor_row, self._all_rows[: self.loaded]
        self.clear(columns=True)
        self._add_columns(self._all_rows)
        for key, cells in added:
            self.add_row(*self._shown_cells(cells), key=key)
        if added:
            self.move_cursor(row=min(cursor_row, len(added) - 1), animate=False)

    def _shown_cells(self, cells: Sequence[RenderableType | str]) -> list[RenderableType]:
        return [self._fitted(literal(cells[index])) if index < len(cells) else Text("") for index in self._shown]

    def _set_widths(self, widths: Sequence[int]) -> None:
        columns = list(self.columns.values())
        if [column.width for column in columns] == list(widths):
            return
        for column, width in zip(columns, widths):
            column.width = width
        # DataTable has no public way to resize a column: drop its rendered cells and let it measure again.
        self._clear_caches()
        self._require_update_dimensions = True
        self.refresh()

    def show(self, rows: Sequence[Row], *, more: bool = False, columns: Sequence[str | tuple[str, str]] | None = None) -> None:
        """Replace the rows (and the columns, if given); `more` says the view can fetch rows past these."""
        self.clear(columns=True)
        if columns is not None:
            self._column_specs = tuple(columns)
        self._all_rows = list(rows)
        self._add_columns(rows)
        self.loaded = 0
        self._waiting = list(rows)
        self._more = more
        self._requested = False
        self._add_page()

    def extend(self, rows: Sequence[Row], *, more: bool) -> None:
        """Add rows fetched after a `NeedMore`."""
        self._all_rows.extend(rows)
        self._waiting.extend(rows)
        self._more = more
        self._requested = False
        self._add_page()

    @property
    def has_more(self) -> bool:
        return bool(self._waiting) or self._more

    def load_more(self) -> None:
        """Add the next page, from rows already given or by asking the view for more."""
        if self._waiting:
            self._add_page()
        elif self._more and not self._requested:
            self._requested = True
            self.post_message(self.NeedMore(self, self.loaded))

    def ensure_rows(self, count: int) -> None:
        """Add pages of the rows already given until at least `count` rows are in the table."""
        while self.row_count < count and self._waiting:
            self._add_page()

    def _add_page(self) -> None:
        page, self._waiting = self._waiting[: self.page_size], self._waiting[self.page_size:]
        self._widen_for(page)
        for key, cells in page:
            self.add_row(*self._shown_cells(cells), key=key)
        self.loaded += len(page)

    def _fitted(self, cell: RenderableType) -> RenderableType:
        """Text ends in `…` where its column is too narrow for it, rather than being cut without a sign."""
        if isinstance(cell, Text) and cell.justify != "right" and (not cell.no_wrap or cell.overflow != "ellipsis"):
            fitted = cell.copy()
            fitted.no_wrap = True
            fitted.overflow = "ellipsis"
            return fitted
        return cell

    def _widen_for(self, page: Sequence[Row]) -> None:
        """Widen the columns whose cells in `page` (rows fetched after the widths were set) are wider,
        so that no number is cut ("1,62" for 1,622)."""
        widened = False
        for _, cells in page:
            for index, cell in enumerate(cells[: len(self._natural_widths)]):
                needed = min(cell_width(cell), self.max_column_width)
                if needed > self._natural_widths[index]:
                    self._natural_widths[index] = needed
                    widened = True
                if self._narrowable[index] and not is_text_cell(cell):
                    self._narrowable[index] = False
                    widened = True
        if widened:
            for index, narrowable in enumerate(self._narrowable):
                if not narrowable:
                    self._minimums[index] = self._natural_widths[index]
            if self.fit_width:
                self._fit_columns()
            else:
                self._set_widths([self._natural_widths[index] for index in self._shown])

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        # Handled here and still bubbling to the view.
        if event.data_table is self and event.cursor_row >= self.row_count - 3:
            self.load_more()

    def centre_on(self, row: int) -> None:
        """Put the cursor on `row` in the middle of the table, and keep it there through resizes
        (the view around the table may still be laying out) until the cursor moves."""
        self._centred_row = row
        self.move_cursor(row=row, animate=False)
        # After DataTable's own scroll that brings the cursor into view, which it defers to the next refresh.
        self.call_after_refresh(self._scroll_to_centre)

    def _scroll_to_centre(self) -> None:
        row = self._centred_row
        if row is None or self.cursor_row != row:
            self._centred_row = None
            return
        if self.virtual_size.height < self.header_height + self.row_count:
            # DataTable sizes itself for new rows when idle; a scroll before that is clamped to the old size.
            self.call_after_refresh(self._scroll_to_centre)
            return
        self.scroll_to(y=max(row - self.scrollable_content_region.height // 2, 0), animate=False, immediate=True)

    def on_resize(self) -> None:
        self._fit_columns()
        if self._centred_row is not None:
            self.call_after_refresh(self._scroll_to_centre)

    def current_key(self) -> str | None:
        """The key of the row under the cursor (None for an empty table)."""
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return row_key.value


class StatusLine(Static):
    """One line of plain text about a view's state; never parsed as markup."""

    def say(self, *parts: str | tuple[str, str] | Text) -> None:
        self.update(Text.assemble(*parts))


class HelpScreen(ModalScreen[None]):
    """Every key binding from the action registry (with the keys in effect after remapping)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,question_mark,q", "dismiss", "Close", id="help.close")]

    _filled_width = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="help-dialog"):
            yield Static(Text("Keys", style="bold"), id="help-title")
            table: DataTable[Any] = DataTable(id="help-table", cursor_type="row", zebra_stripes=True)
            yield table
            yield Static(
                Text("Remap any key by its id: tputrace tui TRACE --keys ID=KEYS (e.g. --keys timeline.zoom_in=i). "
                     "Ctrl+P opens the command palette. Escape closes this."),
                id="help-hint",
            )

    def on_mount(self) -> None:
        self.fill(self.app.size.width)
        self.call_after_refresh(self.fit_to_table)

    def on_resize(self, event: events.Resize) -> None:
        self.call_after_refresh(self.fit_to_table)

    def fit_to_table(self) -> None:
        width = self.query_one("#help-table", DataTable).size.width
        if width and width != self._filled_width:
            self.fill(width)

    def fill(self, width: int) -> None:
        """List the actions, wrapping each one's description to the width left by the other columns.

        Where even that leaves too little room, the action's title (which its id repeats) is dropped."""
        table = self.query_one("#help-table", DataTable)
        titles = dict(VIEW_ORDER)
        rows = [
            ("everywhere" if action.scope == APP else titles.get(action.scope, action.scope), self.keys_for(action),
             action.title, action.id, action.help, action.id)
            for action in ACTIONS
        ]
        labels = ["view", "keys", "action", "id (for --keys)"]
        widths = [max(cell_len(label), *(cell_len(row[column]) for row in rows)) for column, label in enumerate(labels)]
        padding = 2 * table.cell_padding
        room = width - HELP_SCROLLBAR_CELLS - sum(widths) - padding * (len(labels) + 1)
        keep = [0, 1, 2, 3]
        if room < HELP_MIN_DESCRIPTION:
            keep.remove(2)
            room += widths[2] + padding
        description_width = max(room, HELP_MIN_DESCRIPTION)
        cursor = table.cursor_row
        table.clear(columns=True)
        wrapped_help = ["\n".join(textwrap.wrap(row[4], description_width)) or row[4] for row in rows]
        # Each column is added at its final width, so no cell (the header's above all) is ever drawn at another one:
        # a width the table grew to as rows came in could leave the header at the labels' widths on a loaded host.
        for column in keep:
            table.add_column(Text(labels[column]), width=widths[column], key=("scope", "keys", "title", "id")[column])
        help_width = max([cell_len("what it does"), *(cell_len(line) for text in wrapped_help for line in text.split("\n"))])
        table.add_column(Text("what it does"), width=help_width, key="help")
        for row, wrapped in zip(rows, wrapped_help):
            table.add_row(*(Text(row[column]) for column in keep), Text(wrapped), key=row[5], height=None)
        if table.row_count:
            table.move_cursor(row=min(cursor, table.row_count - 1))
        self._filled_width = width

    def keys_for(self, action: NamedAction) -> str:
        keymap: dict[str, str] = getattr(self.app, "user_keymap", {})
        keys = keymap.get(action.id, action.keys)
        displays = []
        for key in keys.split(","):
            key = key.strip()
            displays.append(self.app.get_key_display(Binding(key, action.action)))
        return " ".join(displays)


class ActionCommands(Provider):
    """Command palette entries for every named action of the app and of the view on show."""

    def _commands(self) -> list[tuple[NamedAction, Any]]:
        app: Any = self.app
        view = app.current_view() if hasattr(app, "current_view") else None
        commands: list[tuple[NamedAction, Any]] = []
        for action in ACTIONS:
            if action.scope == APP:
                commands.append((action, app))
            elif view is not None and action.scope == getattr(view, "VIEW_ID", None):
                commands.append((action, view))
        return commands

    def _run(self, action: NamedAction, node: Any) -> Any:
        async def run() -> None:
            await self.app.run_action(action.action, node)

        return run

    async def discover(self) -> Hits:
        for action, node in self._commands():
            if action.palette:
                yield DiscoveryHit(Text(action.title if action.scope != APP or not action.id.startswith("view.") else f"Show {action.title}"),
                                   self._run(action, node), text=action.help, help=action.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for action, node in self._commands():
            if not action.palette:
                continue
            title = f"Show {action.title}" if action.id.startswith("view.") else action.title
            text = f"{title}: {action.help}"
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), self._run(action, node), text=text, help=action.id)
