"""Which optimizer steps end a loop iteration, for scripts that step several optimizers per iteration.

A step of the trace ends at an optimizer step. A loop that steps two optimizers in turn (a GAN's discriminator and
generator, an actor and a critic, a sparse and a dense optimizer) would otherwise count two steps per iteration.
The steps of one iteration are learnt as they run: an iteration is over once every optimizer that stepped in the
previous iteration (at first: every optimizer made so far that updates tpu tensors) has stepped again; an optimizer
stepping twice before that means the loop changed what it steps (a second training phase, an optimizer made but
never used), and ends the iteration there.
"""

from __future__ import annotations

import weakref
from typing import Any


class IterationEnds:
    """Tells, at each optimizer step, whether it ends the loop's iteration."""

    def __init__(self) -> None:
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()
        self._previous: weakref.WeakSet[Any] | None = None
        self._since_end: weakref.WeakSet[Any] = weakref.WeakSet()

    def reset(self) -> None:
        """A recording starts: what earlier runs in this process made and stepped counts no more (an optimizer made
        before it is learnt from the steps alone)."""
        self._made, self._previous, self._since_end = weakref.WeakSet(), None, weakref.WeakSet()

    def optimizer_made(self, optimizer: Any) -> None:
        """An optimizer that updates tpu tensors was constructed."""
        self._made.add(optimizer)

    def ends_iteration(self, optimizer: Any) -> bool:
        """`optimizer` just stepped: whether that ends the iteration (the step boundary is then taken)."""
        expected = self._made if self._previous is None else self._previous
        stepped_again = optimizer in self._since_end
        self._since_end.add(optimizer)
        if not stepped_again and not all(other in self._since_end for other in expected):
            return False
        self._previous, self._since_end = self._since_end, weakref.WeakSet()
        return True
