"""Which optimizer steps end a loop iteration, for scripts that step several optimizers per iteration.

A step of the trace ends at an optimizer step. A loop that steps two optimizers in turn (a GAN's discriminator and
generator, an actor and a critic, a sparse and a dense optimizer) would otherwise count two steps per iteration, and
a WGAN stepping its critic five times per generator step six. The steps of one iteration are learnt as they run: an
iteration is over at the step of the optimizer that closed the previous iteration, once every optimizer that stepped
in it has stepped again (in the first iteration: once every optimizer made so far that updates tpu tensors has
stepped). An optimizer that stepped several times in the previous iteration is an inner loop (a critic's); one that
steps a second time otherwise means the loop changed what it steps (a second training phase, an optimizer made but
never used), and ends the iteration there. In the first iteration a repeated step is an inner loop when an optimizer
that has not stepped yet is stepped further out in a loop around it (`loop_steps`), and a first step whose loop steps
the optimizers still waiting in a loop nested inside it (a generator's step before its critic's inner loop) ends the
iteration at once, with the waiting ones taken as that inner loop. An iteration does not wait for optimizers that the
loop steps only under an `if` (`if step % 2 == 0: opt_body.step()`), nor for those stepped only in another loop of the
function (a warm-up phase's loop stepping one optimizer, then a loop stepping another): the step ends there.
"""

from __future__ import annotations

import weakref
from typing import Any

from tputrace.backend.core import loop_steps


class IterationEnds:
    """Tells, at each optimizer step, whether it ends the loop's iteration."""

    def __init__(self) -> None:
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()
        self._previous: weakref.WeakKeyDictionary[Any, int] | None = None  # optimizer -> its steps in the iteration
        self._closer: weakref.ref[Any] | None = None  # the optimizer whose step ended the previous iteration
        self._since_end: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def reset(self) -> None:
        """A recording starts: what earlier runs in this process made and stepped counts no more (an optimizer made
        before it is learnt from the steps alone)."""
        self._made, self._previous, self._closer = weakref.WeakSet(), None, None
        self._since_end = weakref.WeakKeyDictionary()

    def optimizer_made(self, optimizer: Any) -> None:
        """An optimizer that updates tpu tensors was constructed."""
        self._made.add(optimizer)

    def ends_iteration(self, optimizer: Any) -> bool:
        """`optimizer` just stepped: whether that ends the iteration (the step boundary is then taken)."""
        since_end = self._since_end
        steps = since_end[optimizer] = since_end.get(optimizer, 0) + 1
        previous = self._previous
        expected = list(self._made if previous is None else previous.keys())
        if steps > 1 and not self._repeats(optimizer, expected):
            self._end(optimizer, {stepped: 1 for stepped in since_end})
            return True
        if not all(other in since_end for other in expected):
            inner = [other for other in expected if other not in since_end]
            if previous is None and steps == 1 and loop_steps.stepped_in_inner_loop(inner):
                # The loop steps this optimizer, then the others in an inner loop: each iteration ends at this one.
                self._end(optimizer, {optimizer: 1, **{other: 2 for other in inner}})
                return True
            if steps == 1 and (loop_steps.stepped_conditionally(inner) or loop_steps.stepped_in_other_loops(inner)):
                # The others step in some iterations only, or in another loop (a phase before or after this one).
                self._end(optimizer, dict(since_end))
                return True
            return False
        closer = self._closer() if self._closer is not None else None
        if previous is not None and optimizer is not closer and previous.get(optimizer, 0) > 1:
            return False
        self._end(optimizer, dict(since_end))
        return True

    def _repeats(self, optimizer: Any, expected: list[Any]) -> bool:
        """Whether a repeated step of `optimizer` is an inner loop of the iteration."""
        if self._previous is not None:
            return bool(self._previous.get(optimizer, 0) > 1)
        return loop_steps.stepped_later_in_loop(other for other in expected if other not in self._since_end)

    def _end(self, optimizer: Any, steps: dict[Any, int]) -> None:
        self._previous = weakref.WeakKeyDictionary(steps)
        self._closer = weakref.ref(optimizer)
        self._since_end = weakref.WeakKeyDictionary()
