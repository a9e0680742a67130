"""Where a host tensor was made: the user's line that built a batch before it was copied to the chip.

While a run records, the host functions that typically make a batch (`torch.tensor`, `stack`, `cat`,
`zeros`, `full`, `randint`, `pad_sequence`, `F.pad`, `F.interpolate`, `Tensor.new_*`, ...) are wrapped: a plain CPU
tensor they return is remembered with the first frame outside torch, tputrace and libraries (a
`collate_fn` padding each batch to its longest item, a tokenizer-like pad). When such a tensor is copied
to `tpu`, the transfer records that line as its origin, and the recompile analysis names it as the line
that chose a changing shape. Only the wrapped functions pay (no mode over every torch call);
`TPUTRACE_HOST_ORIGINS=0` turns it off. The tensors are kept by id with a weak reference, never changed.
"""

from __future__ import annotations

import functools
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.jit._builtins
import torch.utils._device

from tputrace import settings, sourceloc

Location = tuple[str, int, str]  # file, line, function

# (owner, attribute) of each wrapped maker: module functions and Tensor methods that build a batch on the host.
_TORCH_MAKERS = (
    "tensor", "as_tensor", "from_numpy", "stack", "cat", "concat", "concatenate", "hstack", "vstack",
    "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like",
    "randint", "rand", "randn", "randperm", "where", "masked_select", "nonzero",
)
_RESIZES = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact2d",
            "upsample_linear1d", "upsample_bilinear2d", "upsample_bicubic2d", "upsample_trilinear3d",
            "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")
_TENSOR_MAKERS = ("new_tensor", "new_zeros", "new_ones", "new_full", "new_empty")
_MAKERS: tuple[tuple[Any, str], ...] = (
    *((torch, name) for name in _TORCH_MAKERS),
    *((torch.Tensor, name) for name in _TENSOR_MAKERS),
    # `F.pad` and `pad_sequence` call these at call time; TorchScript compiles the Python functions themselves.
    (torch._C._nn, "pad"),
    (torch._C._nn, "pad_sequence"),
    # `F.interpolate` (and torchvision's tensor resizes and crops through it): an image resized to a size the script chose.
    *((torch._C._nn, name) for name in _RESIZES),
)

_origins: dict[int, tuple[weakref.ref, Location]] = {}  # id(tensor) -> (a weak reference to it, its origin)
_user_file: dict[str, bool] = {}  # file name -> whether it is the user's (code objects may not hash)
_roots: tuple[str, ...] = ()
_originals: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, the function it held, its wrapper)
_is_compiling = torch.compiler.is_compiling


def install() -> None:
    """Wrap the makers (once; nothing when `TPUTRACE_HOST_ORIGINS=0`)."""
    global _roots
    if _originals or not settings.host_origins_enabled():
        return
    _roots = sourceloc.library_roots()
    # `with torch.device(...)` knows the factories by identity, from a set built once: built now, it holds the
    # functions themselves, which the wrappers call (built while wrapped, it would hold the wrappers).
    torch.utils._device._device_constructors()
    for owner, name in _MAKERS:
        original = getattr(owner, name, None)
        if original is None:
            continue
        wrapper = _remembering(original)
        _originals.append((owner, name, original, wrapper))
        builtin = torch.jit._builtins._find_builtin(original)
        if builtin is not None:  # TorchScript compiles a call of the wrapper as the op it wraps
            torch.jit._builtins._register_builtin(wrapper, builtin)
        setattr(owner, name, wrapper)


def uninstall() -> None:
    """Put the makers back and forget the origins."""
    table = torch.jit._builtins._builtin_table
    while _originals:
        owner, name, original, wrapper = _originals.pop()
        setattr(owner, name, original)
        if table is not None:
            # TorchScript knows builtins by id: once the wrapper is freed, a new function could take its id
            # and compile as the op the wrapper stood for.
            table.pop(id(wrapper), None)
    _origins.clear()


def origin_of(tensor: Any) -> Location | None:
    """The line that made `tensor` on the host, when a wrapped maker did."""
    entry = _origins.get(id(tensor))
    if entry is None or entry[0]() is not tensor:
        return None
    return entry[1]


# The wrapper's code has a file name of its own: Dynamo skips the backend's files, and a torch.compile'd function
# that calls a watched maker must trace through the wrapper to the maker (a decorator saying so costs µs per call).
_WRAPPER_SOURCE = """
def make(*args, **kwargs):
    result = maker(*args, **kwargs)
    if not is_compiling() and type(result) is tensor_type and result.is_cpu:
        remember(result)
    return result
"""
_WRAPPER_CODE = compile(_WRAPPER_SOURCE, "<tputrace host origins>", "exec")


def wrapper_code() -> types.CodeType:
    """The code of every maker's wrapper (one code object, made once)."""
    return next(const for const in _WRAPPER_CODE.co_consts if isinstance(const, types.CodeType))


def _remembering(maker: Callable[..., Any]) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"maker": maker, "is_compiling": _is_compiling, "tensor_type": torch.Tensor,
                                 "remember": _remember}
    exec(_WRAPPER_CODE, namespace)  # noqa: S102 - our own constant source, compiled once
    wrapper = functools.wraps(maker)(namespace["make"])
    # Dynamo reads this as "trace the maker itself": its table of torch functions, built at the first compile
    # (perhaps while the makers are wrapped), holds the makers, and compiled code never sees the wrapper, so a
    # compile after the recording stops still knows `torch.tensor`.
    wrapper.__dict__["_torchdynamo_inline"] = maker
    return wrapper


def _remember(tensor: torch.Tensor) -> None:
    frame = sys._getframe(2)
    user_file = _user_file
    while frame is not None:
        code = frame.f_code
        is_user = user_file.get(code.co_filename)
        if is_user is None:
            is_user = user_file[code.co_filename] = sourceloc.is_user_file(code.co_filename, _roots)
        if is_user:
            key = id(tensor)
            _origins[key] = (weakref.ref(tensor, functools.partial(_forget, key)), (code.co_filename, frame.f_lineno, code.co_name))
            return
        frame = frame.f_back


def _forget(key: int, reference: weakref.ref) -> None:
    entry = _origins.get(key)
    if entry is not None and entry[0] is reference:
        del _origins[key]
