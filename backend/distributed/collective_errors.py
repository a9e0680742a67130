"""The error of a collective on a tpu process group that did not complete (a peer died or hung, the transport
failed), as `wait()` raises it and as a failed call's future holds it."""

from __future__ import annotations

import re
from typing import Any


class CollectiveError(RuntimeError):
    """A collective that did not complete: a peer died or hung, or the transport failed."""


class FailedCollective(CollectiveError):
    """A failed collective's error as its future holds it.

    `Future.set_exception` does not fail the C++ future: it completes it with the exception as its
    value, and only Python's `wait()`/`value()` raise it. A C++ reader of the future takes that value
    as the result: DDP's reducer looks for a bucket's tensors in it by pickling it
    (`parseCppCommHookResult`), found none in an exception, and read past the empty list (a SIGSEGV on
    every rank that survived a peer). Pickling this error raises it instead, so such a reader fails
    with the collective's error as a C++ exception, which autograd raises from `backward()`."""

    def __reduce__(self) -> Any:
        raise CollectiveError(str(self))


_READER_PREFIX = "Cannot extract tensors from value: "  # how torch's C++ side words a value it could not read


def failed_collective(error: BaseException) -> CollectiveError | None:
    """The collective's own error behind an error that a C++ reader of a failed collective's future
    raised (DDP's reducer, from `backward()`: the sentence wrapped in torch's prefix and a Python
    traceback), or None for any other error."""
    text = str(error)
    marker = f"{_READER_PREFIX}{CollectiveError.__name__}: "
    if not text.startswith(marker):
        return None
    return CollectiveError(text.removeprefix(marker).split("\n\nAt:\n")[0].strip())


def transport_message(error: BaseException) -> str:
    """The transport's own words, without the future-callback wrapping and traceback lines."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    for prefix in ("Got the following error when running the callback: ", "RuntimeError: "):
        text = text.removeprefix(prefix)
    text = re.sub(r"^\[[^\]\s]+:\d+\] ", "", text)  # gloo's "[.../pair.cc:553] " source position
    return text.split(" This is typically caused")[0]
