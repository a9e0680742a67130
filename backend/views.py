"""View chains: how a view's value is computed from its buffer, and how a write reaches the buffer.

A view is a chain of ATen view lowerings applied to the buffer's array. Writing a new value into a
view scatters it into the buffer: the same chain applied to the buffer's flat element indices says
which buffer element each view element is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp


@dataclass(frozen=True)
class ViewStep:
    """One view op: its lowering with constant arguments; `index` picks one output of a multi-view op.

    An `absolute` step (as_strided) addresses the buffer itself, so it replaces the chain before it.
    """

    lowering: Callable
    args: tuple
    kwargs: dict = field(hash=False, compare=False)
    index: int | None = None
    key: Any = None
    absolute: bool = False

    def apply(self, array: Any) -> Any:
        result = self.lowering(array, *self.args, **self.kwargs)
        return result if self.index is None else result[self.index]


class ViewChain:
    """The steps from a buffer's array to a view's value."""

    __slots__ = ("steps", "key")

    def __init__(self, steps: tuple[ViewStep, ...]) -> None:
        self.steps = steps
        self.key = tuple(step.key for step in steps)

    def function(self) -> Callable[[Any], tuple]:
        steps = self.steps

        def view_of(array: Any) -> tuple:
            for step in steps:
                array = step.apply(array)
            return (array,)

        return view_of

    def scatter_function(self, buffer_shape: tuple[int, ...]) -> Callable[[Any, Any], tuple]:
        view_of = self.function()
        size = 1
        for dim in buffer_shape:
            size *= dim

        def write_through(buffer: Any, value: Any) -> tuple:
            positions = view_of(jnp.arange(size, dtype=jnp.int64).reshape(buffer_shape))[0]
            value = jnp.broadcast_to(value.astype(buffer.dtype), positions.shape)
            flat = buffer.reshape(-1).at[positions.reshape(-1)].set(value.reshape(-1))
            return (flat.reshape(buffer_shape),)

        return write_through
