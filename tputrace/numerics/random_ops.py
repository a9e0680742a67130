"""The tpu's random values replayed on the CPU: the tpu's generator is not the CPU's, so a module that draws random
numbers (dropout, random masks, noise) is replayed with the values the tpu drew.

`RandomLog` (a dispatch mode during the replayed steps) keeps a host copy of the output of every random op that
runs on the tpu; each module call takes the slice of the log its forward made. `RandomReplay` runs the call's CPU
replay with those values: each random op on the CPU takes the next recorded one instead of drawing. The tpu runs
dropout as one `native_dropout` (its output and mask) where the CPU draws the mask with `bernoulli_` and scales
the input itself; the recorded mask serves both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten
RANDOM_OPS: frozenset[Any] = frozenset({
    aten.native_dropout, aten.bernoulli, aten.bernoulli_, aten.rand, aten.rand_like, aten.randn, aten.randn_like,
    aten.randint, aten.randint_like, aten.randperm, aten.normal, aten.normal_, aten.uniform_, aten.multinomial,
    aten.exponential_, aten.geometric_, aten.cauchy_, aten.log_normal_, aten.random_,
})


class RandomReplayMismatch(RuntimeError):
    """The CPU replay drew other random numbers than the tpu run did (another op, or more draws)."""


@dataclass(frozen=True)
class RandomDraw:
    """One random op of the tpu run: its name and host copies of its tensor outputs."""

    op: str
    outputs: tuple[torch.Tensor, ...]


class RandomLog(TorchDispatchMode):
    """Keeps every random op's outputs on the tpu (not while `skip()` says the session is replaying)."""

    def __init__(self, skip: Callable[[], bool]) -> None:
        super().__init__()
        self.draws: list[RandomDraw] = []
        self._skip = skip

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if func.overloadpacket in RANDOM_OPS and not self._skip():
            tensors = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            if tensors and tensors[0].device.type != "cpu":
                self.draws.append(RandomDraw(func.overloadpacket.__name__, tuple(t.detach().cpu() for t in tensors)))
        return result


class RandomReplay(TorchDispatchMode):
    """Serves the recorded draws, in order, to the random ops of a CPU replay."""

    def __init__(self, draws: list[RandomDraw]) -> None:
        super().__init__()
        self._draws = list(draws)
        self._next = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket not in RANDOM_OPS:
            return func(*args, **kwargs)
        if self._next >= len(self._draws):
            raise RandomReplayMismatch(f"the CPU replay draws more random numbers than the tpu run ({func.overloadpacket.__name__})")
        draw = self._draws[self._next]
        self._next += 1
        return _serve(func, args, kwargs, draw)


def _serve(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], draw: RandomDraw) -> Any:
    name = func.overloadpacket.__name__
    if draw.op == "native_dropout":
        output, mask = draw.outputs
        if name == "native_dropout":
            source, probability = args[0], args[1]
            scale = 0.0 if probability >= 1 else 1.0 / (1.0 - probability)
            return source * mask.to(source.dtype) * scale, mask.clone()
        values = mask
    elif name == draw.op:
        values = draw.outputs[0] if len(draw.outputs) == 1 else None
        if values is None:
            return tree_map(lambda value: value.clone() if isinstance(value, torch.Tensor) else value, draw.outputs)
    else:
        raise RandomReplayMismatch(f"the tpu run drew with {draw.op}, the CPU replay with {name}")
    if name.endswith("_"):
        target = args[0]
        if tuple(target.shape) != tuple(values.shape):
            raise RandomReplayMismatch(f"{name} fills {tuple(target.shape)}, the tpu drew {tuple(values.shape)}")
        with torch.no_grad():
            target.copy_(values.to(target.dtype))
        return target
    return values.clone()
