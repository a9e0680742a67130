"""What every view shares: the session, loading data in workers, and the messages views send the app.

A view asks for data with `request(slot, fetch)`: `fetch(trace)` runs in a thread worker that never
touches widgets; its result comes back as a `Loaded` message, and `apply(slot, payload)` (on the
UI thread) updates widgets. Each slot ("main", "detail", ...) has one exclusive worker at a time (a
new request cancels the older one) and results of superseded requests are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.containers import Vertical
from textual.message import Message
from textual.widget import Widget
from textual.worker import Worker, WorkerState, get_current_worker

from tputrace.tui.render import Palette
from tputrace.tui.widgets import StatusLine

if TYPE_CHECKING:
    from tputrace.store.reader import Trace
    from tputrace.tui.session import Session

Fetch = Callable[["Trace"], Any]


def rich_color(color: str | None, fallback: str) -> str:
    """A theme colour as a Rich colour: `ansi_bright_blue` -> `bright_blue`, `#0178D4` as is."""
    if not color:
        return fallback
    return color.removeprefix("ansi_")


def palette_for(app: Any) -> Palette:
    """Chart styles from the app's current theme."""
    theme = app.current_theme
    return Palette(
        bar=rich_color(theme.primary, "blue"),
        compile=rich_color(theme.accent or theme.secondary, "magenta"),
        muted="dim",
        warning=rich_color(theme.error, "red"),
        accent=rich_color(theme.secondary, "cyan"),
    )


@dataclass
class GoToSource(Message):
    """Show `file:line` in the Source view (and switch to it when `switch`)."""

    file: str
    line: int
    switch: bool = True


@dataclass
class Loaded(Message):
    """A worker's result for one of a view's slots."""

    slot: str
    generation: int
    payload: Any


class TraceView(Vertical):
    """A view of the trace; subclasses set `VIEW_ID`, compose their widgets and implement `load` and `apply`."""

    VIEW_ID: ClassVar[str] = ""
    can_focus = False

    def __init__(self, session: Session) -> None:
        super().__init__(id=f"view-{self.VIEW_ID}", classes="trace-view")
        self.session = session
        self._generations: dict[str, int] = {}
        self._worker_slots: dict[Worker[Any], str] = {}
        self._loaded_rank: int | None = None
        self.pending: set[str] = set()
        """Slots with a request in flight (tests and the bench wait for this to empty)."""
        self.loaded_at: dict[str, float] = {}
        """`time.perf_counter()` when each slot's latest result was shown (for the load benchmark)."""

    # -- loading ----------------------------------------------------------------------------------

    def on_show(self) -> None:
        # After the next refresh: the first paint comes before any query, and an update never
        # races the screen's first layout.
        self.call_after_refresh(self.ensure_loaded)

    def ensure_loaded(self) -> None:
        """Load the view's data the first time it is shown, and again after the rank changed."""
        if self._loaded_rank != self.session.rank:
            self._loaded_rank = self.session.rank
            self.load()

    def rank_changed(self) -> None:
        """The app switched rank: reload now if on show, else when next shown."""
        if self.is_on_screen:
            self.ensure_loaded()

    def load(self) -> None:
        """Request the view's data (called on first show and after a rank change)."""

    def apply(self, slot: str, payload: Any) -> None:
        """Show a result that `request(slot, ...)` fetched."""

    def restyle(self) -> None:
        """The theme changed: redraw what uses the theme's colours (charts, bars)."""

    def request(self, slot: str, fetch: Fetch) -> None:
        """Run `fetch(trace)` in a worker for `slot`, superseding the slot's earlier request."""
        generation = self._generations.get(slot, 0) + 1
        self._generations[slot] = generation
        self.pending.add(slot)
        # Equivalent to @work(thread=True, exclusive=True, exit_on_error=False) with the slot as the
        # worker group, so that each slot has its own exclusive worker.
        worker = self.run_worker(
            partial(self._fetch, slot, generation, fetch),
            name=f"{self.VIEW_ID}:{slot}", group=slot, thread=True, exclusive=True, exit_on_error=False,
        )
        self._worker_slots[worker] = slot

    def prefetch(self, name: str, compute: Callable[[], Any]) -> None:
        """Run `compute()` (a `Session` method, which keeps its result) in a worker, to warm what the
        user is likely to ask for next; nothing is shown and no slot waits for it."""
        self.run_worker(compute, name=f"{self.VIEW_ID}:prefetch:{name}", group="prefetch", thread=True, exit_on_error=False)

    def _fetch(self, slot: str, generation: int, fetch: Fetch) -> None:
        with self.session.reader() as trace:
            payload = fetch(trace)
        if not get_current_worker().is_cancelled:
            self.post_message(Loaded(slot, generation, payload))

    def on_loaded(self, message: Loaded) -> None:
        message.stop()
        if message.generation != self._generations.get(message.slot):
            return
        self.pending.discard(message.slot)
        self.apply(message.slot, message.payload)
        self.loaded_at[message.slot] = time.perf_counter()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        slot = self._worker_slots.get(event.worker)
        if slot is None:
            return
        if event.state in (WorkerState.SUCCESS, WorkerState.CANCELLED, WorkerState.ERROR):
            del self._worker_slots[event.worker]
        if event.state == WorkerState.ERROR:
            self.pending.discard(slot)
            error = event.worker.error
            self.show_error(f"could not read the trace: {type(error).__name__}: {error}")

    def show_error(self, message: str) -> None:
        for status in self.query(StatusLine):
            status.say((message, "bold red"))
            return
        self.notify(message, severity="error", markup=False)

    # -- helpers ----------------------------------------------------------------------------------

    @property
    def is_loaded(self) -> bool:
        """The view has asked for its data for the rank on show, and every answer has arrived."""
        return self._loaded_rank == self.session.rank and not self.pending

    def primary(self) -> Widget | None:
        """The widget that takes focus when the view is shown."""
        return None

    def say(self, status_id: str, *parts: str | tuple[str, str] | Text) -> None:
        self.query_one(f"#{status_id}", StatusLine).say(*parts)
