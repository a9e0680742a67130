"""Errors that tputrace reports to people as one sentence (the CLI turns them into exit code 2)."""

from __future__ import annotations


class TputraceError(Exception):
    """Base of every error whose message is meant for the user: one sentence, no traceback."""


class TraceError(TputraceError):
    """A trace file cannot be read: missing, not a trace, corrupt, truncated, or too new."""


class TraceWriteError(TputraceError):
    """A trace file cannot be written, or rows handed to the writer could not be stored."""


class QueryError(TputraceError):
    """An SQL query, or a `where`/`order_by` fragment given to the reader, is not valid."""
