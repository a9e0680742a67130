"""Helpers shared by the backend tests: load the device once, switch eager modes safely, compare a result on
tpu with the same computation on the CPU."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.compat.device_module import EagerMode, eager_mode, set_eager_mode

_FALLBACK_WARNING = re.compile(r"tputrace: (\S+) runs on the host CPU")


@contextlib.contextmanager
def eager(mode: EagerMode) -> Iterator[None]:
    """Run a block in one eager mode and restore the previous one (flushing pending work)."""
    previous = eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(previous)


def host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu")


# Absolute and relative tolerance of a comparison with the CPU, by dtype: XLA and torch's CPU kernels sum and
# fuse in different orders, so floating results agree to a few units in the last place of their dtype.
# Integer and boolean results are exact.
CPU_TOLERANCES: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.complex128: 1e-9,
    torch.float32: 1e-5,
    torch.complex64: 1e-5,
    torch.float16: 1e-3,
    torch.bfloat16: 1.6e-2,
}


def assert_matches_cpu(
    actual: object,
    expected: object,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    device: str | None = None,
    equal_nan: bool = True,
    what: str = "output",
) -> None:
    """`actual`, a result on tpu (tensors in any nesting of lists, tuples and dicts, on tpu or copied to the host),
    matches `expected`, the same computation on the CPU: the same structure, and each tensor the same shape and
    dtype with values within its dtype's CPU_TOLERANCES (or `atol`/`rtol` where given), Python numbers within
    float32's, anything else equal; NaN matches NaN. With `device`, each tensor of `actual` must be on that device
    type. Failures name the leaf as `what` and its index."""
    actual_leaves, actual_structure = pytree.tree_flatten(actual)
    expected_leaves, expected_structure = pytree.tree_flatten(expected)
    assert actual_structure == expected_structure, f"structure {actual_structure} != the CPU's {expected_structure}"
    for index, (got, want) in enumerate(zip(actual_leaves, expected_leaves)):
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), f"{what} {index}: {type(got).__name__}, the CPU gives a tensor"
            if device is not None:
                assert got.device.type == device, f"{what} {index} is on {got.device}, not {device}"
            got, tolerance = host(got), CPU_TOLERANCES.get(want.dtype, 0.0)
        elif isinstance(want, (float, complex)):
            tolerance = CPU_TOLERANCES[torch.float32]
        else:
            assert got == want, f"{what} {index}: {got!r} != the CPU's {want!r}"
            continue
        torch.testing.assert_close(
            got,
            want,
            atol=tolerance if atol is None else atol,
            rtol=tolerance if rtol is None else rtol,
            equal_nan=equal_nan,
            check_device=False,
            msg=lambda message, index=index: f"{what} {index}: {message}",
        )


@contextlib.contextmanager
def recorded_fallbacks() -> Iterator[list[str]]:
    """The names of the ops that run on the host CPU inside the block, one per call (an op whose
    lowering fails is named twice), taken from the dispatcher's fallback warning as it is made; the
    dispatcher otherwise warns once per op and process, and caches routes, so no method wrapper
    would see every call."""
    from tputrace.backend.core.dispatch import dispatcher

    names: list[str] = []
    warn_once = dispatcher._warn_once

    def warn_and_record(key: str, message: str, category: type[Warning] = RuntimeWarning) -> None:
        match = _FALLBACK_WARNING.match(message)
        if match:
            names.append(match.group(1))
        warn_once(key, message, category)

    dispatcher._warn_once = warn_and_record
    try:
        yield names
    finally:
        del dispatcher._warn_once


@contextlib.contextmanager
def recorded_host_reads() -> Iterator[list[str]]:
    """The sync kinds of the dispatcher's host reads inside the block."""
    from tputrace.backend.core.dispatch import dispatcher

    kinds: list[str] = []
    to_host = dispatcher.to_host

    def counted(tensor: torch.Tensor, sync_kind: str) -> torch.Tensor:
        kinds.append(sync_kind)
        return to_host(tensor, sync_kind)

    dispatcher.to_host = counted
    try:
        yield kinds
    finally:
        del dispatcher.to_host


class OpNames(TorchDispatchMode):
    """The ATen ops that reach dispatch inside the block, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))
