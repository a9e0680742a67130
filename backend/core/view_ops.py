"""View ops: a view is a chain of ATen view ops over its base's buffer, read and written through plans.

A view's value is computed from its buffer when the buffer's version has moved; a write through a view
is scattered back into the buffer. Read and write plans are shared by every chain of the same steps.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import torch

from tputrace.backend.core import arg_checks
from tputrace.backend.core.buffers import Buffer
from tputrace.backend.core.dtypes import to_jax, to_torch
from tputrace.backend.core.entries import OpEntry
from tputrace.backend.core.executor import Executor
from tputrace.backend.core.plan_building import RUNS_ON_HOST
from tputrace.backend.core.plans import VIEW_READ, VIEW_WRITE, OutSpec, Plan
from tputrace.backend.core.tensor import TpuTensor, geometry_of, view_tensor
from tputrace.backend.core.views import ViewChain, ViewStep, geometry, storage_as
from tputrace.backend.eager.deferred import LazyValue
from tputrace.backend.indexing import padded_reads
from tputrace.recording.interface import Recording

aten = torch.ops.aten
_VIEW_DTYPE = aten.view.dtype  # bound once: every view op compares its op with it
_INTS_ONLY = frozenset({int})
# A view is made in the mode of its base, so it is an inference tensor exactly when its base is one: a wrapper made
# under `torch.inference_mode()` is an inference tensor, and torch refuses to give the view of a normal tensor its
# base's version counter ("Cannot set version_counter for inference tensor"), as `mask[:, -1]` in `generate` does.
_is_inference = torch._C.TensorBase.is_inference  # without the subclass's Python dispatch
_inference_mode_enabled = torch.is_inference_mode_enabled


class ViewOps:
    """The Dispatcher's reads, writes and view ops (a mixin)."""

    executor: Executor
    recorder: Recording | None
    plans: dict[Any, Any]
    plan_lock: threading.RLock
    view_plans: dict[Any, Any]

    def read(self, tensor: TpuTensor) -> Any:
        """The tensor's current array (a view is recomputed when its buffer has been written).

        A view's value is kept until its buffer changes; in DeferAndFuse a pending value is reused
        while its graph is pending or once the flush kept it, so a view read N times is one op."""
        view = tensor._view
        buf = tensor._buf
        if view is None:
            return buf.array
        if tensor._cached_version == buf.version:
            cached = tensor._cached
            if type(cached) is not LazyValue:
                return cached
            if cached.concrete is not None:
                return cached.concrete
            if not cached.graph.flushed:
                return cached
        value = self.executor.run(self._chain_plan(view, buf), (buf.array,))[0]
        tensor._cached = value
        tensor._cached_version = buf.version
        return value

    def write(self, tensor: TpuTensor, value: Any) -> None:
        """Replace the tensor's data; a write to a view is scattered into its buffer."""
        buf = tensor._buf
        view = tensor._view
        replaced = buf.array
        if view is None:
            buf.write(value)
        else:
            buf.write(self.executor.run(self._scatter_plan(view, buf), (buf.array, value))[0])
            tensor._cached = value
            tensor._cached_version = buf.version
        if self.executor.deferred:
            self.executor.track(buf, replaced)

    def _view(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
        base = args[0]
        if entry.op is _VIEW_DTYPE and (args[1] if len(args) > 1 else kwargs["dtype"]) == base.dtype:
            entry, args, kwargs = self._entry(aten.alias.default), (base,), {}  # a view as its own dtype is an alias
        geom = base._geom or geometry_of(base)
        key = (entry, _static_args(args), tuple((name, _static(value)) for name, value in kwargs.items()) if kwargs else (), geom)
        cached = self.view_plans.get(key)
        if cached is None:
            cached = self.view_plans[key] = self._build_view(entry, args, kwargs, base)
        if cached is RUNS_ON_HOST:
            return self.fallback(entry, args, kwargs)
        buf = base._buf
        parent = base._view
        if parent is not None and cached and cached[0][0].absolute:
            # `as_strided` of a cut's own strides addresses its value, not its buffer; of a dtype view, the
            # storage read as its dtype
            source = padded_reads.own_strides_cut(base) if padded_reads.cuts_made else None
            if source is None and to_torch(buf.array.dtype) != base.dtype:
                source = storage_as(base.dtype)
            if source is not None:
                parent, cached = source, tuple((_relative(step), root, out_geom) for step, root, out_geom in cached)
        if _is_inference(base) == _inference_mode_enabled():
            results = _view_tensors(buf, cached, parent)
        else:
            with torch.inference_mode(_is_inference(base)):
                results = _view_tensors(buf, cached, parent)
        if self.recorder is not None:
            self.recorder.view_op(entry.name, base, results, key)
        if len(results) == 1 and not isinstance(cached, list):
            return results[0]
        return results

    def _build_view(self, entry: OpEntry, args: Sequence[Any], kwargs: dict, base: TpuTensor) -> Any:
        """The outputs of a view op on a base of this geometry: (step, its chain from the buffer, geometry) each."""
        storage_numel = max(storage_elements(base), base.storage_offset() + 1)
        meta_base = torch.empty(storage_numel, dtype=base.dtype, device="meta").as_strided(base.shape, base.stride(), base.storage_offset())
        if entry.op is aten.as_strided.default:
            offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
            if offset is None:  # torch's default is the base's own offset; the lowering's is 0
                offset = base.storage_offset()
                args, kwargs = (*args[:3], offset), {}
            arg_checks.check_strided_within_storage(args[1], args[2], offset, base.element_size(), base.untyped_storage().nbytes())
        try:
            result = entry.op(meta_base, *args[1:], **kwargs)
        except RuntimeError:
            raise  # torch's own refusal (e.g. a view the strides do not allow)
        except Exception:  # noqa: BLE001 - no meta kernel: the op runs on the host
            return RUNS_ON_HOST
        outputs = result if isinstance(result, (list, tuple)) else [result]
        lowering = entry.lowering.fn
        static_args = tuple(args[1:])
        static_kwargs = dict(kwargs)
        absolute = entry.op is aten.as_strided.default
        chip = base._buf.chip
        layout = []
        for index, meta in enumerate(outputs):
            step = ViewStep(
                lowering,
                static_args,
                static_kwargs,
                index if isinstance(result, (list, tuple)) else None,
                (entry.op, tuple(_static(a) for a in static_args), tuple((k, _static(v)) for k, v in static_kwargs.items()), index),
                absolute,
            )
            out_geom = geometry(tuple(meta.shape), tuple(meta.stride()), meta.storage_offset(), meta.dtype, chip)
            layout.append((step, ViewChain.root(step), out_geom))
        return layout if isinstance(result, (list, tuple)) else tuple(layout)

    def _chain_plan(self, chain: ViewChain, buf: Buffer) -> Plan:
        return self._chain_memo(chain, buf, "chain", self._shared_chain_plan)

    def _scatter_plan(self, chain: ViewChain, buf: Buffer) -> Plan:
        return self._chain_memo(chain, buf, "scatter", self._shared_scatter_plan)

    @staticmethod
    def _chain_memo(chain: ViewChain, buf: Buffer, kind: str, build: Callable[[ViewChain, Buffer], Plan]) -> Plan:
        """A chain's read or write plan for a buffer of this signature, kept on the chain."""
        array = buf.array
        memo_key = (kind, array.shape, array.dtype, buf.chip)
        plan = chain.plans.get(memo_key)
        if plan is None:
            plan = chain.plans[memo_key] = build(chain, buf)
        return plan

    def _shared_chain_plan(self, chain: ViewChain, buf: Buffer) -> Plan:
        """The read plan of every chain with this chain's steps, on a buffer of this signature."""
        key = ("chain", chain.key, buf.array.shape, buf.array.dtype, buf.chip)
        plan = self.plans.get(key)
        if plan is None:
            with self.plan_lock:
                fn = chain.function()
                out = jax.eval_shape(fn, jax.ShapeDtypeStruct(buf.array.shape, buf.array.dtype))[0]
                spec = OutSpec(tuple(out.shape), torch.float32, out.dtype, 0)
                plan = Plan(VIEW_READ, fn, (spec,), "single", ((tuple(buf.array.shape), to_torch(buf.array.dtype)),), buf.chip, ("chain", chain.key))
                self.executor.prepare(plan, [buf.array])
                self.plans[key] = plan
        return plan

    def _shared_scatter_plan(self, chain: ViewChain, buf: Buffer) -> Plan:
        """The write plan of every chain with this chain's steps, into a buffer of this signature."""
        key = ("scatter", chain.key, buf.array.shape, buf.array.dtype, buf.chip)
        plan = self.plans.get(key)
        if plan is None:
            with self.plan_lock:
                fn = chain.scatter_function(tuple(buf.array.shape), buf.array.dtype)
                nbytes = int(np.prod(buf.array.shape, dtype=np.int64)) * np.dtype(buf.array.dtype).itemsize
                spec = OutSpec(tuple(buf.array.shape), to_torch(buf.array.dtype), buf.array.dtype, nbytes)
                view = jax.eval_shape(chain.function(), jax.ShapeDtypeStruct(buf.array.shape, buf.array.dtype))[0]
                plan = Plan(VIEW_WRITE, fn, (spec,), "single", ((tuple(buf.array.shape), to_torch(buf.array.dtype)),), buf.chip, ("scatter", chain.key))
                self.executor.prepare(plan, [buf.array, view])  # the value as a shape: no program compiles to make it
                self.plans[key] = plan
        return plan

    def _alias(self, args: Sequence[Any], kwargs: dict) -> TpuTensor:
        tensor = args[0]
        if _is_inference(tensor) == _inference_mode_enabled():
            alias = view_tensor(tensor._buf, tensor._geom or geometry_of(tensor), tensor._view)
        else:
            with torch.inference_mode(_is_inference(tensor)):
                alias = view_tensor(tensor._buf, tensor._geom or geometry_of(tensor), tensor._view)
        cached = tensor._cached
        if cached is not None:
            alias._cached = cached
            alias._cached_version = tensor._cached_version
        return alias


_RELATIVE_STEPS: dict[int, ViewStep] = {}  # id(step) -> its relative step (steps live as long as the view plans)


def _relative(step: ViewStep) -> ViewStep:
    """`step` (an `as_strided`) applied to the value of the chain before it instead of the buffer; one
    shared step per step, so that the chains it ends are shared too."""
    relative = _RELATIVE_STEPS.get(id(step))
    if relative is None:
        relative = _RELATIVE_STEPS[id(step)] = dataclasses.replace(step, absolute=False)
    return relative


def _view_tensors(buf: Buffer, cached: Sequence[tuple[ViewStep, ViewChain, Any]], parent: ViewChain | None) -> list[TpuTensor]:
    """The tensors of a view op's outputs (`_build_view`'s layout) over `buf`, whose base sees it through
    `parent`. A dense output of the buffer's shape and dtype through layout views only (`w.t().t()`, a
    weight's gradient) is the buffer's array as it is: it reads and writes the array with no program."""
    results = []
    array = buf.array
    for step, root, out_geom in cached:
        chain = root if parent is None else parent.then(step)
        if out_geom.dense and chain.layout_only and out_geom.shape == tuple(array.shape) and to_jax(out_geom.dtype) == array.dtype:
            chain = None
        results.append(view_tensor(buf, out_geom, chain))
    return results


def storage_elements(tensor: TpuTensor) -> int:
    """The number of the tensor's own elements its buffer's storage holds (a dtype view of another
    width holds more or fewer than the buffer's array)."""
    array = tensor._buf.array
    numel = int(np.prod(_root_shape(tensor)))
    dtype = getattr(array, "dtype", None)
    if dtype is None or to_torch(dtype) == tensor.dtype:
        return numel
    return numel * np.dtype(dtype).itemsize // tensor.element_size()


def _root_shape(tensor: TpuTensor) -> tuple[int, ...]:
    return tuple(tensor._buf.array.shape) if hasattr(tensor._buf.array, "shape") else tuple(tensor.shape)


def _static(value: Any) -> Any:
    if type(value) is int:
        return value
    if isinstance(value, list):
        items = tuple(value)
        if _INTS_ONLY.issuperset(map(type, items)):  # sizes or dims (`view(B, T, nh, hs)`): one pass in C
            return items
        return tuple(_static(item) for item in items)
    if isinstance(value, torch.Tensor):
        raise TypeError("tensor argument in a view op")
    return value


def _static_args(args: Sequence[Any]) -> tuple:
    """A view op's arguments after its base, hashable (lists as tuples); as they are when all ints."""
    if len(args) == 2:
        value = args[1]
        if type(value) is list and _INTS_ONLY.issuperset(map(type, value)):  # `view(B, T, nh, hs)`, `permute(0, 2, 1, 3)`
            return (tuple(value),)
    values = tuple(args[1:])
    for value in values:
        if type(value) is not int:
            return tuple([_static(item) for item in values])
    return values
