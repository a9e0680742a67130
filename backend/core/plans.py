"""Compiled programs for single ops: argument templates, output metadata from torch's meta kernels,
and one cached XLA executable per (op, constant arguments, input signature, chip).

A call's arguments are split into a *template* (the constants, hashable, part of the cache key) and
*dynamic inputs* (tensors' arrays and `Scalar` values, passed to the executable). Torch's own meta
kernels give each output's shape and dtype, so a lowering's result is cast to exactly what torch
would return.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import torch

from tputrace.backend.core import chips, compile_cache, matmul_precision
from tputrace.backend.core.dtypes import short_name, to_jax
from tputrace.backend.core.hlo_module import instruction_count
from tputrace.backend.core.memory_formats import contiguous_strides, storage_order
from tputrace.backend.core.signatures import InputSpec, signature_text
from tputrace.backend.core.views import Geometry, geometry


class Slot:
    """Marks where a dynamic input goes in an argument template. There is one Slot per index, so
    templates compare and hash by identity: a plan-cache key is hashed on every op."""

    __slots__ = ("index",)
    index: int

    def __new__(cls, index: int) -> "Slot":
        slot = _SLOTS.get(index)
        if slot is None:
            slot = _SLOTS[index] = object.__new__(cls)
            slot.index = index
        return slot

    def __reduce__(self) -> tuple:
        return Slot, (self.index,)

    def __repr__(self) -> str:
        return f"Slot({self.index})"


_SLOTS: dict[int, Slot] = {}


class TensorList(tuple):
    """A list of tensors in an argument template: hashable for the plan key, rebuilt as a list."""

    __slots__ = ()


class LoweringError(RuntimeError):
    """A lowering produced something other than what torch's meta kernel says the op returns."""


@dataclass(frozen=True)
class OutSpec:
    """Shape and dtype of one tensor output; for a channels-last output (`memory_formats`), its
    strides and the order in which its buffer holds its dims."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    jax_dtype: Any
    nbytes: int
    strides: tuple[int, ...] | None = None
    storage_order: tuple[int, ...] | None = None
    # (shape, dtype) as a plan key reads the output when an op takes it: one tuple shared by every
    # buffer made for this output, so no op allocates it and keys compare it by identity.
    buffer_spec: tuple = field(init=False, repr=False, compare=False)
    # By chip, the interned geometry of the contiguous tensor made for this output (`dense_geometry`).
    geometries: dict[int, Geometry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "buffer_spec", (self.shape, self.dtype))
        object.__setattr__(self, "geometries", {})

    def dense_geometry(self, chip: int) -> Geometry:
        """The geometry of a contiguous tensor of this output on `chip`, kept per chip: an output's tensor
        starts with it, so a view of the output reads no tensor metadata (`tensor.geometry_of`)."""
        geom = self.geometries.get(chip)
        if geom is None:
            geom = self.geometries[chip] = geometry(self.shape, contiguous_strides(self.shape), 0, self.dtype, chip)
        return geom


@dataclass
class Program:
    """A compiled XLA executable and what the trace says about it."""

    executable: Callable
    name: str
    flops: float
    bytes_accessed: float
    compile_ns: int
    hlo_text: str | None
    program_id: int | None = None
    temp_bytes: int = 0  # XLA's temporaries while it runs (a fused step's activations live here)
    output_bytes: int = 0  # outputs not aliased to donated inputs
    loaded_from_disk: bool = False  # read from the on-disk compile cache (`compile_cache`), not compiled
    hlo_ops: int | None = None  # instructions in the optimized HLO, where it was read (`keep_hlo`, `count_hlo`)


# Names of the dispatcher's own programs, which run no op of the user's: a view read, a write through a
# view, a reorder to a channels-last storage, an on-chip index check. Op counts leave them out.
VIEW_READ = "view"
VIEW_WRITE = "view_write"
STORAGE_ORDER = "storage_order"
INDEX_CHECK = "index_check"
INTERNAL_PLANS = frozenset({VIEW_READ, VIEW_WRITE, STORAGE_ORDER, INDEX_CHECK})


@dataclass
class Plan:
    """How to run one op for one signature: the array-level function and its executable."""

    op_name: str
    fn: Callable[..., tuple]
    out_specs: tuple[OutSpec | None, ...]
    out_structure: str | tuple[int | None, ...]  # "single", "tuple", "list", or list lengths (`regroup`)
    in_specs: tuple[InputSpec, ...]
    chip: int
    structure_key: Any
    program: Program | None = None
    trace_ids: dict[str, int] = field(default_factory=dict)
    matmul_precision: str | None = None  # the float32 matmul precision setting its products were traced at
    # The spec of a plan's one output when that output is a plain tensor (not channels-last): how
    # `Dispatcher.compute` wraps an op's result with one attribute read (every op's hot path).
    single_output: OutSpec | None = field(init=False, repr=False, compare=False)
    # The inputs that are Python numbers (a scalar's spec is its type's name alone, a tensor's is
    # (shape, dtype)): strict eager passes them to the program as arrays on the chip (`executor`).
    scalar_inputs: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        only = self.out_specs[0] if self.out_structure == "single" and len(self.out_specs) == 1 else None
        self.single_output = only if only is not None and only.storage_order is None else None
        self.scalar_inputs = tuple(index for index, spec in enumerate(self.in_specs) if len(spec) == 1)

    @property
    def inputs_text(self) -> str:
        return signature_text(self.in_specs)

    @property
    def outputs_text(self) -> str:
        return ", ".join(
            "None" if spec is None else f"{short_name(spec.dtype)}[{','.join(map(str, spec.shape))}]"
            for spec in self.out_specs
        )


def rebuild(template: Any, dynamic: Sequence[Any]) -> Any:
    """The template with each Slot replaced by its dynamic input."""
    if type(template) is Slot:
        return dynamic[template.index]
    template_type = type(template)
    if template_type is tuple:
        return tuple(rebuild(item, dynamic) for item in template)
    if template_type is TensorList or template_type is list:
        return [rebuild(item, dynamic) for item in template]
    if template_type is dict:
        return {name: rebuild(value, dynamic) for name, value in template.items()}
    return template


def out_specs_from_meta(result: Any) -> tuple[tuple[OutSpec | None, ...], str]:
    """Flatten a meta kernel's result into output specs plus the structure to rebuild."""
    if isinstance(result, torch.Tensor):
        return (_spec(result),), "single"
    if isinstance(result, (tuple, list)):
        if isinstance(result, tuple) and any(isinstance(item, (tuple, list)) for item in result):
            return _nested_specs(result)
        specs = tuple(_spec(item) if isinstance(item, torch.Tensor) else None for item in result)
        return specs, "tuple" if isinstance(result, tuple) else "list"
    raise LoweringError(f"unsupported op result type {type(result).__name__}")


def _nested_specs(result: tuple) -> tuple[tuple[OutSpec | None, ...], tuple[int | None, ...]]:
    """Specs of a result that holds lists (`(Tensor[] self_out, Tensor found_inf_out)`), flattened; the
    structure gives each item's list length, None for a lone tensor."""
    specs: list[OutSpec | None] = []
    groups: list[int | None] = []
    for item in result:
        items = list(item) if isinstance(item, (tuple, list)) else [item]
        groups.append(len(items) if isinstance(item, (tuple, list)) else None)
        specs.extend(_spec(value) if isinstance(value, torch.Tensor) else None for value in items)
    return tuple(specs), tuple(groups)


def flatten_nested(values: Sequence[Any]) -> list[Any]:
    """A result's items with each list in it spliced in place (the order of `_nested_specs`)."""
    flat: list[Any] = []
    for value in values:
        if isinstance(value, (tuple, list)):
            flat.extend(value)
        else:
            flat.append(value)
    return flat


def regroup(flat: Sequence[Any], groups: tuple[int | None, ...]) -> tuple:
    """The inverse of `flatten_nested` for a structure from `_nested_specs`."""
    result: list[Any] = []
    position = 0
    for length in groups:
        if length is None:
            result.append(flat[position])
            position += 1
        else:
            result.append(list(flat[position : position + length]))
            position += length
    return tuple(result)


def _spec(meta: torch.Tensor) -> OutSpec:
    shape = tuple(meta.shape)
    numel = 1
    for size in shape:
        numel *= size
    strides = tuple(meta.stride())
    order = storage_order(shape, strides)
    if order is None:
        return OutSpec(shape, meta.dtype, to_jax(meta.dtype), numel * meta.element_size())
    return OutSpec(shape, meta.dtype, to_jax(meta.dtype), numel * meta.element_size(), strides, order)


def array_function(lowering: Callable, template_args: Any, template_kwargs: Any, out_specs: Sequence[OutSpec | None], op_name: str, extra_kwargs: Callable[[Sequence[Any]], dict] | None = None, precision: str | None = None) -> Callable[..., tuple]:
    """A function of the dynamic inputs that runs the lowering and casts to torch's output dtypes; its
    products are traced at float32 matmul precision setting `precision` (None: full precision)."""

    def run(*dynamic: Any) -> tuple:
        args = rebuild(template_args, dynamic)
        kwargs = rebuild(template_kwargs, dynamic)
        if extra_kwargs is not None:
            kwargs = {**kwargs, **extra_kwargs(dynamic)}
        with jax.named_scope(op_name), matmul_precision.scope(precision):
            result = lowering(*args, **kwargs)
        results = result if isinstance(result, (tuple, list)) else (result,)
        if any(isinstance(value, (tuple, list)) for value in results):
            results = flatten_nested(results)
        if len(results) != len(out_specs):
            raise LoweringError(f"{op_name}: lowering returned {len(results)} outputs, torch returns {len(out_specs)}")
        outputs = []
        for value, spec in zip(results, out_specs):
            if spec is None or value is None:
                outputs.append(None)
                continue
            value = jnp.asarray(value)
            if value.dtype != spec.jax_dtype:
                value = value.astype(spec.jax_dtype)
            if value.shape != spec.shape:
                if value.size == _numel(spec.shape):
                    value = value.reshape(spec.shape)
                else:
                    raise LoweringError(f"{op_name}: lowering returned shape {value.shape}, torch returns {spec.shape}")
            outputs.append(value)
        return tuple(outputs)

    return run


def _numel(shape: Sequence[int]) -> int:
    numel = 1
    for size in shape:
        numel *= size
    return numel


def compile_program(fn: Callable[..., tuple], dynamic: Sequence[Any], chip: int, name: str, *, keep_hlo: bool = False, count_hlo: bool = False,
                    donate: tuple[int, ...] = ()) -> Program:
    """Lower and compile `fn` for these inputs on `chip`; XLA's cost analysis gives FLOPs and bytes. With
    `keep_hlo` the program keeps its optimized HLO text; with either flag it counts its instructions."""
    start = time.perf_counter_ns()
    with jax.default_device(chips.device(chip)), warnings.catch_warnings():
        # A donated input that no output can reuse (another shape) is simply not reused.
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        lowered = jax.jit(_compiled_once(fn), donate_argnums=donate).lower(*dynamic)
        outcome = compile_cache.compile_lowered(lowered)
    compiled = outcome.compiled
    compile_ns = time.perf_counter_ns() - start
    flops = bytes_accessed = 0.0
    try:
        cost = compiled.cost_analysis()
        if isinstance(cost, list):
            cost = cost[0] if cost else {}
        flops = float(cost.get("flops", 0.0) or 0.0)
        bytes_accessed = float(cost.get("bytes accessed", 0.0) or 0.0)
    except Exception:  # noqa: BLE001 - cost analysis is best effort on some platforms
        pass
    temp_bytes, output_bytes = _memory_use(compiled)
    hlo_text = None
    if keep_hlo or count_hlo:
        try:
            hlo_text = compiled.as_text()
        except Exception:  # noqa: BLE001
            hlo_text = None
    return Program(
        _direct_call(compiled), name, max(flops, 0.0), max(bytes_accessed, 0.0), compile_ns, hlo_text if keep_hlo else None,
        temp_bytes=temp_bytes, output_bytes=output_bytes, loaded_from_disk=outcome.loaded_from_disk,
        hlo_ops=instruction_count(hlo_text) if hlo_text else None,
    )


def _compiled_once(fn: Callable[..., tuple]) -> Callable[..., tuple]:
    """`fn` under a function of its own for one compile. JAX's tracing and lowering caches are keyed
    on the function and keep what they made (down to the executable) while it lives; a plan's `fn`
    lives as long as the plan, so the program would outlive its eviction (`program_cache`)."""

    @functools.wraps(fn)
    def once(*args: Any) -> tuple:
        return fn(*args)

    return once


def _memory_use(compiled: Any) -> tuple[int, int]:
    """(temporary bytes, new output bytes) of a run, from XLA's memory analysis (0s where the
    platform does not report it)."""
    try:
        stats = compiled.memory_analysis()
        return int(stats.temp_size_in_bytes), max(int(stats.output_size_in_bytes - stats.alias_size_in_bytes), 0)
    except Exception:  # noqa: BLE001 - best effort
        return 0, 0


def _direct_call(compiled: Any) -> Callable:
    """The compiled program's C++ call path (what `Compiled.__call__` builds on its first call and
    then calls through a Python frame, ~1 µs per op); the `Compiled` itself where JAX has none."""
    executable = getattr(compiled, "_executable", None)
    create = getattr(executable, "create_cpp_call", None)
    params = getattr(compiled, "_params", None)
    call = create(params) if create is not None and params is not None else None
    return call if call is not None else compiled
