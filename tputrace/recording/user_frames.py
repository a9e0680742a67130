"""The user's source line of each record: the first frame of the user's code on the stack, interned once per call
site, with the file's digest the first time a file is seen. A mixin of the `Recorder`, which sets the attributes it
reads in its `__init__`."""

from __future__ import annotations

import bisect
import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from types import CodeType
from typing import Literal

from tputrace import source_digests, sourceloc
from tputrace.store.writer import TraceWriter

_getframe = sys._getframe
_thread_id = threading.get_ident
# The callers of `_user_frame_id` that start from the backend's dispatch: each keeps where the dispatch entry
# lay below it, on the main thread and on others (autograd's stack has a frame more).
OP_RAN, OP_DEFERRED, VIEW_OP = 1, 2, 3
_SITES = 4
# The depths of the dispatch entry kept per site: the backend's paths to a record are few.
_DEPTHS_KEPT = 6


class UserFrames:
    """Source lines of records: `frame_id()` and what it needs."""

    writer: TraceWriter
    rank: int
    main_thread: int
    last_frame_id: int | None
    backward_frame: int | None
    backward_call_frame: int | None
    _library_roots: tuple[str, ...]
    _traced_lines: dict[int, int]
    _user_code: dict[int, dict[int, int] | Literal[False]]
    _seen_code: list[CodeType]
    _call_frame_ids: dict[tuple[int, int], int]
    _frame_texts: dict[int, str]
    _location_frame_ids: dict[tuple[str, int, str], int]
    _digested_files: set[str]
    _dispatch_entry: CodeType | None
    _entry_depths: list[list[int]]

    def dispatches_through(self, entry: CodeType) -> None:
        """The code of the backend's dispatch entry (its `__torch_dispatch__`): every frame between it and an op's
        or view's record is the backend's own, so those records' line lookups start above it."""
        self._dispatch_entry = entry
        self._entry_depths = [[] for _ in range(2 * _SITES)]

    def frame_id(self, by_call: bool = False) -> int | None:
        """Interned id of the first frame in the user's code (outside torch, tputrace and libraries).

        `by_call` tells apart the calls on one line: the frame also has the column span of the calling
        instruction (compiles use it, so a line with two calls of one op gives two compile sites).
        The result is kept as `last_frame_id`: an op's output buffer takes its op's line from it."""
        frame_id = self.last_frame_id = self._user_frame_id(by_call)
        return frame_id

    def _user_frame_id(self, by_call: bool, depth: int = 3, site: int = 0) -> int | None:
        """The walk behind `frame_id`, from `depth` frames above this one (3: `frame_id`'s caller's caller).

        A `site` (`OP_RAN`, `OP_DEFERRED`, `VIEW_OP`) starts where that caller found the dispatch entry before, when
        the entry is at one of those depths: Python makes a frame object for each frame a walk passes, and the
        dispatch's frames are new for every op. A caller reaches the entry along a few paths of the backend, each
        at its own depth: each depth found is kept, and tried from the shallowest. Elsewhere the walk goes from
        `depth` and notes where it passes the entry. A user frame's line is found by its code and instruction
        offset, kept per code object (`_user_code`)."""
        if self._traced_lines:
            traced = self._traced_lines.get(_thread_id())
            if traced is not None:
                return traced
        entry = self._dispatch_entry
        learning = 0
        frame = None
        elsewhere: bool | None = None  # whether this is a thread other than the main one, once read
        if site and entry is not None:
            elsewhere = _thread_id() != self.main_thread
            if elsewhere:
                site += _SITES
            try:
                for guess in self._entry_depths[site]:
                    above = _getframe(guess)
                    if above.f_code is entry:
                        frame = above.f_back
                        break
                else:
                    learning = site
            except ValueError:  # a shallower stack than before
                learning = site
        if frame is None and (learning or not site or entry is None):
            frame = _getframe(depth)
        walked = depth
        user_code = self._user_code
        while frame is not None:
            code = frame.f_code
            line_sites = user_code.get(id(code))
            if line_sites is False:
                if learning and code is entry:
                    depths = self._entry_depths[learning]
                    if walked not in depths and len(depths) < _DEPTHS_KEPT:
                        bisect.insort(depths, walked)  # the shallowest first: a nested dispatch's inner entry
                    learning = 0
                frame = frame.f_back
                walked += 1
                continue
            if line_sites is None:
                self._seen_code.append(code)  # kept alive, so its id is never another code object's
                user_code[id(code)] = {} if self._is_user_file(code.co_filename) else False
                continue  # looked at again, now known
            lasti = frame.f_lasti
            if by_call:
                frame_id = self._call_frame_ids.get((id(code), lasti))
                if frame_id is None:
                    frame_id = self._call_frame_ids[(id(code), lasti)] = self._site_frame_id(code, lasti, frame.f_lineno, True)
                return frame_id
            frame_id = line_sites.get(lasti)
            if frame_id is None:
                frame_id = line_sites[lasti] = self._site_frame_id(code, lasti, frame.f_lineno, False)
            return frame_id
        if elsewhere or (elsewhere is None and _thread_id() != self.main_thread):
            return self.backward_call_frame if by_call else self.backward_frame
        return None

    def library_frame_id(self) -> int | None:
        """Where the user's code called into a library (not torch, not tputrace) that is doing the work now: the
        innermost frame of such a library below the first user frame (a Trainer's training loop reading a loss);
        None when no library frame lies between. Walked only for rare records (syncs), not per op."""
        frame = sys._getframe(2)
        innermost: tuple[str, int, str] | None = None
        while frame is not None:
            code = frame.f_code
            line_sites = self._user_code.get(id(code))
            if line_sites is None:
                self._seen_code.append(code)
                line_sites = self._user_code[id(code)] = {} if self._is_user_file(code.co_filename) else False
            if line_sites is not False:
                break
            if innermost is None and sourceloc.is_third_party_library(code.co_filename):
                innermost = (code.co_filename, frame.f_lineno, code.co_name)
            frame = frame.f_back
        return None if innermost is None else self._location_frame_id(innermost)

    def _site_frame_id(self, code: CodeType, lasti: int, line: int, by_call: bool) -> int:
        """The frame id of the call at instruction `lasti` of `code` (on `line`): its line, or with `by_call`
        also the calling instruction's column span (compiles use it, so a line with two calls of one op
        gives two compile sites). Computed once per call site (`_user_frame_id` keeps it)."""
        if line == code.co_firstlineno:  # maybe an instruction torch.compile added
            line = sourceloc.dynamo_line(code, lasti, line)
        if by_call:
            col, end_line, end_col = sourceloc.call_columns(code, lasti, line)
            return self._intern_frame(code.co_filename, line, code.co_name, col, end_col, end_line)
        frame_id = self._intern_frame(code.co_filename, line, code.co_name)
        self._frame_texts[frame_id] = f"{os.path.basename(code.co_filename)}:{line}"
        return frame_id

    @contextlib.contextmanager
    def recording_at(self, location: tuple[str, int, str] | None) -> Iterator[None]:
        """Record what this thread does inside at `location` (file, line, function): the line a graph's node
        was traced from, for code that runs a traced graph (whose stack holds only the compiled call)."""
        if location is None:
            yield
            return
        frame_id = self._location_frame_id(location)
        thread = threading.get_ident()
        previous = self._traced_lines.get(thread)
        self._traced_lines[thread] = frame_id
        try:
            yield
        finally:
            if previous is None:
                del self._traced_lines[thread]
            else:
                self._traced_lines[thread] = previous

    def _location_frame_id(self, location: tuple[str, int, str]) -> int:
        """The frame id of a (file, line, function), interned once: a graph run op by op asks for each node of
        each call, a transfer for the line that made each batch."""
        frame_id = self._location_frame_ids.get(location)
        if frame_id is None:
            frame_id = self._location_frame_ids[location] = self._intern_frame(*location)
        return frame_id

    def _intern_frame(self, file: str, line: int, function: str, col: int | None = None, end_col: int | None = None,
                      end_line: int | None = None) -> int:
        """The frame id of a user source location (of one call starting on its line with `col`, `end_col` and
        `end_line`); the first location in a file also records the file's digest (`source_files`), as the run saw it.
        A relative path (code compiled from one) is stored absolute, against the current directory."""
        if not file.startswith("<"):
            file = os.path.abspath(file)
        if file not in self._digested_files:
            self._digested_files.add(file)
            digest = source_digests.digest_file(file)
            if digest is not None:
                self.writer.append("source_files", (self.rank, self.writer.intern(file), digest.sha256, digest.size))
        return self.writer.frame(file, line, function, col, end_col, end_line)

    def frame_text(self, frame_id: int | None) -> str | None:
        """'file.py:LINE' for an interned frame id (recorded in this session); None for None."""
        return None if frame_id is None else self._frame_texts.get(frame_id)

    def _is_user_file(self, filename: str) -> bool:
        return sourceloc.is_user_file(filename, self._library_roots)
