"""The Textual app: a tab per view, global keys from the action registry, and the messages that cross views.

The app owns little: which view is on show, the rank (through the session), the theme and the
keymap. Each view loads and shows its own data.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import events
from textual.app import App
from textual.binding import BindingType
from textual.content import Content
from textual.theme import Theme
from textual.widgets import Footer, Static, TabbedContent, TabPane

from tputrace.tui.actions import APP, SHORT_TITLES, VIEW_ORDER, bindings, view_key
from tputrace.tui.compare import NO_BASELINE
from tputrace.tui.render import display_path
from tputrace.tui.views import VIEW_CLASSES, TraceView
from tputrace.tui.view import GoToSource
from tputrace.tui.source import SourceView
from tputrace.tui.widgets import ActionCommands, HelpScreen

if TYPE_CHECKING:
    from textual.app import ComposeResult

    from tputrace.tui.session import Session

TERMINAL_THEME = Theme(
    name="tputrace",
    ansi=True,
    primary="ansi_blue",
    secondary="ansi_cyan",
    accent="ansi_magenta",
    warning="ansi_magenta",
    error="ansi_red",
    success="ansi_green",
    foreground="ansi_default",
    background="ansi_default",
    surface="ansi_default",
    panel="ansi_default",
    boost="ansi_default",
    dark=True,
    variables={
        "ansi-background": "ansi_default",
        "ansi-foreground": "ansi_default",
        "border": "ansi_blue",
        "border-blurred": "ansi_bright_black",
        "block-cursor-foreground": "ansi_bright_white",
        "block-cursor-background": "ansi_blue",
        "block-cursor-text-style": "bold",
        "block-cursor-blurred-foreground": "ansi_default",
        "block-cursor-blurred-background": "ansi_default",
        "block-cursor-blurred-text-style": "reverse",
        "block-hover-background": "ansi_default",
        "input-cursor-text-style": "reverse",
        "input-selection-background": "ansi_cyan",
        "footer-key-foreground": "ansi_blue",
        "footer-description-foreground": "ansi_default",
        "footer-background": "ansi_default",
        "footer-item-background": "ansi_default",
        "scrollbar": "ansi_bright_black",
        "scrollbar-hover": "ansi_blue",
        "scrollbar-active": "ansi_blue",
        "scrollbar-background": "ansi_default",
        "scrollbar-corner-color": "ansi_default",
    },
)
"""The default theme: the terminal's own colours (its background and its palette), so it reads the
same on light and dark terminals. `T` switches to Textual's light and dark themes."""

THEMES: tuple[str, ...] = ("tputrace", "textual-light", "textual-dark")
"""The themes `T` cycles through."""


def theme_names() -> list[str]:
    """Every theme `--theme` accepts."""
    from textual.theme import BUILTIN_THEMES

    return sorted({TERMINAL_THEME.name, *BUILTIN_THEMES})


def tab_label(key: str, title: str) -> Content:
    """A view's tab: its key in bold and underlined against its title (`1Overview`, as htop labels its keys),
    so that every tab fits a 100-column terminal."""
    return Content.assemble((key, "bold underline"), title)


TAB_GAP = 1
"""Columns between two tabs (`#views Tab`'s left padding in theme.tcss)."""


def tabs_width(titles: list[tuple[str, str]]) -> int:
    """Columns the tab bar needs for these (key, title) labels."""
    return sum(TAB_GAP + len(key) + len(title) for key, title in titles)


class TraceApp(App[None]):
    """`tputrace tui`: the views of one trace."""

    CSS_PATH = str(Path(__file__).with_name("theme.tcss"))
    TITLE = "tputrace"
    BINDINGS: ClassVar[list[BindingType]] = bindings(APP)
    COMMANDS = App.COMMANDS | {ActionCommands}

    def __init__(self, session: Session, *, keymap: dict[str, str] | None = None, theme: str | None = None,
                 initial_view: str = "overview") -> None:
        super().__init__()
        self.session = session
        self.user_keymap = dict(keymap or {})
        self.initial_view = initial_view
        self.register_theme(TERMINAL_THEME)
        self.theme = theme or "tputrace"

    def compose(self) -> ComposeResult:
        yield Static(self._title_text(), id="topbar")
        with TabbedContent(id="views", initial=self.initial_view):
            for index, (view_id, title) in enumerate(VIEW_ORDER, start=1):
                if view_id == "compare" and self.session.baseline_path is None:
                    continue
                with TabPane(tab_label(view_key(index), title), id=view_id):
                    # Other views are mounted when first shown (see `ensure_view`): a quicker first paint.
                    if view_id == self.initial_view:
                        yield VIEW_CLASSES[view_id](self.session)
        yield Footer()

    def on_mount(self) -> None:
        if self.user_keymap:
            self.set_keymap(self.user_keymap)
        self._fit_tab_labels(self.size.width)

    def on_resize(self, event: events.Resize) -> None:
        self._fit_tab_labels(event.size.width)

    def _fit_tab_labels(self, width: int) -> None:
        """Whole titles where they fit the width, else the short ones (`SHORT_TITLES`), so that every tab shows
        without scrolling the tab bar."""
        shown = [(index, view_id, title) for index, (view_id, title) in enumerate(VIEW_ORDER, start=1)
                 if next(iter(self.query(f"#{view_id}").results(TabPane)), None) is not None]
        short = tabs_width([(view_key(index), title) for index, _, title in shown]) > width
        tabs = self.query_one("#views", TabbedContent)
        for index, view_id, title in shown:
            tabs.get_tab(view_id).label = tab_label(view_key(index), SHORT_TITLES[view_id] if short else title)

    def _title_text(self) -> Text:
        trace = self.session.trace
        run = trace.run
        text = Text("tputrace ", style="bold")
        text.append(os.path.basename(run.script or "") or "(unknown script)")
        ranks = trace.ranks
        if len(ranks) > 1:
            text.append(f" · rank {self.session.rank} of {len(ranks)} (R: next)")
        text.append(f" · {display_path(trace.path)}", style="dim")
        text.no_wrap = True
        text.overflow = "ellipsis"
        return text

    # -- views ------------------------------------------------------------------------------------

    def views(self) -> list[TraceView]:
        return list(self.query(TraceView))

    def view(self, view_id: str) -> TraceView:
        return self.query_one(f"#view-{view_id}", TraceView)

    def mounted_view(self, view_id: str) -> TraceView | None:
        """The view, or None if it has not been shown yet (views are mounted when first needed)."""
        views = self.query(f"#view-{view_id}").results(TraceView)
        return next(iter(views), None)

    async def ensure_view(self, view_id: str) -> TraceView | None:
        """The view, mounting it into its tab first if it has not been shown yet (None while the
        app is closing and its tabs are gone)."""
        view = self.mounted_view(view_id)
        if view is None:
            pane = next(iter(self.query(f"#{view_id}").results(TabPane)), None)
            if pane is None or not pane.is_attached:
                return None
            view = VIEW_CLASSES[view_id](self.session)
            await pane.mount(view)
        return view

    def current_view(self) -> TraceView | None:
        active = self.query_one("#views", TabbedContent).active
        return self.mounted_view(active) if active else None

    def action_show_view(self, view_id: str) -> None:
        tabs = self.query_one("#views", TabbedContent)
        if next(iter(self.query(f"#{view_id}").results(TabPane)), None) is None:
            self.notify(NO_BASELINE if view_id == "compare" else f"no {view_id} view", markup=False)
            return
        if tabs.active == view_id:
            self._focus_view(view_id)
        else:
            # Let go of focus first: when a focused widget is hidden, Textual focuses a sibling in
            # the tab being left, and TabbedContent, which follows focus, would switch back to it.
            self.screen.set_focus(None)
            tabs.active = view_id

    async def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id:
            await self.ensure_view(event.pane.id)
            self._focus_view(event.pane.id)

    def _focus_view(self, view_id: str) -> None:
        view = self.mounted_view(view_id)
        if view is None:
            return
        view.ensure_loaded()
        primary = view.primary()
        # Focus at once, and only while the view's tab is the active one: a deferred focus landing
        # in a tab the user has just left would switch back to it (TabbedContent follows focus).
        if primary is not None and self.query_one("#views", TabbedContent).active == view_id:
            self.screen.set_focus(primary)

    async def on_go_to_source(self, message: GoToSource) -> None:
        source = await self.ensure_view("source")
        if isinstance(source, SourceView):
            source.show_location(message.file, message.line)
        if message.switch:
            self.action_show_view("source")

    # -- global actions ---------------------------------------------------------------------------

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_next_rank(self) -> None:
        ranks = self.session.trace.ranks
        if len(ranks) < 2:
            self.notify("this trace has one rank", markup=False)
            return
        self.session.rank = ranks[(ranks.index(self.session.rank) + 1) % len(ranks)] if self.session.rank in ranks else ranks[0]
        self.query_one("#topbar", Static).update(self._title_text())
        for view in self.views():
            view.rank_changed()
        self.notify(f"showing rank {self.session.rank}", markup=False)

    def watch_theme(self) -> None:
        if self.is_running and self.screen_stack:
            for view in self.views():
                view.restyle()

    def action_next_theme(self) -> None:
        self.theme = THEMES[(THEMES.index(self.theme) + 1) % len(THEMES)] if self.theme in THEMES else THEMES[0]
