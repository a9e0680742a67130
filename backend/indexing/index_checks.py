"""Index checks in the default eager modes: an index out of range raises at the next host sync, as
CUDA's device-side assert does, instead of XLA's silent clamp.

XLA clamps an out-of-range gather index and drops an out-of-range scatter; the CPU refuses it at
once, and CUDA asserts on the chip and raises at the next sync. Each checked op (`embedding`,
`index_select`, `gather`, `x[idx]`, `take`, `nll_loss`'s target, `one_hot`'s classes, the scatters
and index writes; and the values the CPU refuses in `multinomial`, `bernoulli`,
`binary_cross_entropy` and `histc`: a negative or nan probability, an input outside [0, 1], an inf
or nan value where the histogram's range is the data's)
also runs a tiny program that folds "some index is out of range" into one int32 per chip: 0, or the
site of the first such op (the op, the user's line, the range). In DEFER_AND_FUSE that program is
one more node of the pending graph; in DEFER_NEVER, one more launch. Nothing waits for it: the next
host read (`item`, `cpu`, `tolist`, print, `bool`, `torch.tpu.synchronize`) reads the int32, in one
transfer and only if a check ran since the last read, and raises that site's error. A value still
pending in DEFER_AND_FUSE is read at a later sync, as its op has not run yet. A
`torch.compile(backend="tpu")` program folds its checked ops into one more output of its own,
handed to `note_flag` (see `compile.index_flags`).

`TPUTRACE_INDEX_CHECKS=0` turns the checks off (XLA's clamping, as on a TPU without tputrace).
DEFER_NEVER_AND_LAUNCH_BLOCKING checks on host copies instead, at the op (see `arg_checks`), and
records the same `index_check` annotation, at the op's line, before torch's own error is raised.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tputrace.backend.core import chips, routing
from tputrace.backend.core.plans import INDEX_CHECK, OutSpec, Plan
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.core.tensor import TpuTensor
from tputrace.backend.eager.deferred import LazyValue
from tputrace.backend.indexing.cuts.layout import cut_layout, padded_of
from tputrace.sourceloc import is_user_file, library_roots
from tputrace.recording.interface import Recording

aten = torch.ops.aten

ENV_VARIABLE = "TPUTRACE_INDEX_CHECKS"
enabled = os.environ.get(ENV_VARIABLE, "1") != "0"

UNBOUNDED = 2**62  # an IndexRange's `high` where only `low` bounds the values (one_hot with no class count)
_FLAG_SPEC = OutSpec((), torch.int32, np.dtype(np.int32), 4)
_NOT_INDICES = (torch.bool, torch.uint8)  # masks: `x[mask]` selects, it does not index
_NO_CUTS = (None,)  # the cut dims of one index that is not cut


class IndexRange(NamedTuple):
    """The values an index may take: low <= index < high, or `exempt` (nll_loss's ignore_index).
    A tuple: made and hashed on every checked call."""

    low: int
    high: int
    exempt: int | None = None

    def text(self, noun: str) -> str:
        bounds = f"{noun} < {self.low}" if self.high == UNBOUNDED else f"{noun} >= {self.high} or < {self.low}"
        return bounds if self.exempt is None else f"{bounds} other than ignore_index {self.exempt}"


class ValueCheck(NamedTuple):
    """Values an op's CPU kernel refuses that are not indices: `kind` names the predicate (see
    `_VALUE_PREDICATES`); the chip folds it as it folds an index range."""

    kind: str

    def text(self, noun: str) -> str:
        return _VALUE_TEXTS[self.kind]


Bounded = list[tuple[Any, "IndexRange | ValueCheck"]]  # tensors and the range (or check) each must pass
Rule = Callable[[Sequence[Any], dict], Bounded]


class _Flag:
    """A chip's out-of-range site (int32: 0 for none). It stands where a buffer would for a
    DeferAndFuse flush, which fills in `array` (its 4 bytes are not counted as a tensor's)."""

    __slots__ = ("array", "chip", "later", "nbytes", "unread", "__weakref__")

    def __init__(self, chip: int) -> None:
        self.chip = chip
        self.nbytes = _FLAG_SPEC.nbytes
        self.array: Any = _zero(chip)
        self.later: list[Any] = []  # compiled programs' flags since `array`, in call order (see `note_flag`)
        self.unread = False


def _zero(chip: int) -> Any:
    """A flag with no site: a transfer (`jnp.zeros` would compile a program, seen in the trace)."""
    return jax.device_put(np.zeros((), np.int32), chips.device(chip))


_flags: dict[int, _Flag] = {}
_zeros: dict[int, Any] = {}  # a zero flag per chip: the filler of a combine program's unused inputs
_COMBINED = 16  # compiled programs' flags that one combine program folds
_plans: dict[tuple, Plan] = {}
_site_ids: dict[tuple, int] = {}
_site_messages: list[str] = []
_user_code: dict[Any, bool] = {}
_lock = threading.Lock()


def checker(op: Any, dispatcher: DispatcherApi) -> Callable[[Sequence[Any], dict], None] | None:
    """The check of `op`'s indices (None if it has none): records the flag's update for a call."""
    rule = rule_of(op)
    if rule is None:
        return None
    op_name = str(op.overloadpacket)

    def check(args: Sequence[Any], kwargs: dict) -> None:
        if enabled:
            _record(dispatcher, op_name, rule(args, kwargs))

    return check


def rule_of(op: Any) -> Rule | None:
    """The rule that names which of a call's values `op` checks, and against what (None: no check)."""
    build = _RULES.get(op.overloadpacket)
    return None if build is None else build(op)


def check(op_name: str, bounded: Bounded) -> None:
    """Check the indices of an op routed by hand (`one_hot`: see `op_routes`) as `checker`'s checks do,
    in the default eager modes; DEFER_NEVER_AND_LAUNCH_BLOCKING checks them at the op."""
    dispatcher = routing.active()
    if enabled and not getattr(dispatcher.executor, "launch_blocking", False):
        _record(dispatcher, op_name, bounded)


def forget_plans() -> None:
    """Drop the checks' compiled programs (see `executor.forget_compiled_programs`); sites and flags stay."""
    _plans.clear()


def raise_if_out_of_range(recorder: Recording | None, chip: int | None = None) -> None:
    """Raise the error of the first out-of-range index that ran on `chip` (every chip if None) since
    the last check, recorded in the trace as an `index_check` annotation at the syncing line; a flag
    whose value is still pending waits for a later sync."""
    flags = _flags.values() if chip is None else [_flags[chip]] if chip in _flags else []
    for flag in flags:
        if not flag.unread:
            continue
        array = flag.array
        if type(array) is LazyValue:
            if array.concrete is None:
                continue
            array = array.concrete
        site = int(np.asarray(array))  # np.asarray: a tenth of jax.device_get's cost for one scalar
        for later in flag.later:  # compiled programs' flags, read here rather than combined per call
            if site:
                break
            site = int(np.asarray(later))
        flag.unread = False
        flag.later.clear()
        if site:
            flag.array = _zero(flag.chip)
            message = _site_messages[site - 1]
            if recorder is not None:
                recorder.annotation(message, "index_check", recorder.now(), 0, recorder.frame_id())
            raise RuntimeError(message)


def record_host_refusal(recorder: Recording | None, op: Any, refusal: BaseException) -> None:
    """Record an index op that the host refused (DEFER_NEVER_AND_LAUNCH_BLOCKING checks indices on
    host copies, at the op) as an `index_check` annotation at the op's line, naming the op as the
    chip checks' message does; torch's own error is what the script gets."""
    if recorder is None:
        return
    code, line = _user_frame()
    where = _where(None if code is None else code.co_filename, line)
    cpu_message = (str(refusal).splitlines() or [""])[0]
    what = "invalid values" if op.overloadpacket in _VALUE_RULES else "index out of range"
    recorder.annotation(
        f"{what} in {op.overloadpacket} at {where} ({type(refusal).__name__}: {cpu_message}); raised at the op by "
        f"--mode blocking",
        "index_check", recorder.now(), 0, recorder.frame_id(),
    )


def _record(dispatcher: DispatcherApi, op_name: str, bounded: Bounded) -> None:
    if any(type(tensor) is TpuTensor and tensor._traced is not None for tensor, _ in bounded):
        return  # traced by torch.compile or export: no values to check here (`compile.index_flags` checks the program's)
    if len(bounded) == 1 and type(bounded[0][0]) is TpuTensor and bounded[0][0]._view is None:
        # One index tensor that is no view (nll_loss's target, embedding's indices): its array as it
        # is, with no cut (what the general path below reads of it, built with less per call).
        tensor, index_range = bounded[0]
        if tensor.numel():
            ranges = (index_range,)
            site = _site(op_name, ranges)
            buf = tensor._buf
            with dispatcher.thread_lock:
                _fold(dispatcher, site, ranges, buf.chip, [buf.array], ((tuple(tensor.shape), tensor.dtype),), _NO_CUTS)
        return
    checked = [(tensor, index_range) for tensor, index_range in bounded if tensor.numel()]
    if not checked:
        return
    on_host = [(tensor, index_range) for tensor, index_range in checked if type(tensor) is not TpuTensor]
    if on_host:  # host indices (`x[cpu_idx]`): checked at once, as the CPU does, with no sync
        for tensor, index_range in on_host:
            if _out_of_range_on_host(tensor, index_range):
                raise RuntimeError(_site_messages[_site(op_name, (index_range,)) - 1])
        checked = [pair for pair in checked if type(pair[0]) is TpuTensor]
        if not checked:
            return
    ranges = tuple(index_range for _, index_range in checked)
    site = _site(op_name, ranges)
    chip = checked[0][0]._buf.chip
    with dispatcher.thread_lock:
        read = [_checked_values(dispatcher, tensor, index_range) for tensor, index_range in checked]
        lengths = [jax.device_put(np.int32(length), chips.device(chip)) for _, _, _, length in read if length is not None]
        specs = tuple((shape, tensor.dtype) for (_, shape, _, _), (tensor, _) in zip(read, checked))
        cut_dims = tuple(cut_dim for _, _, cut_dim, _ in read)
        _fold(dispatcher, site, ranges, chip, [*(value for value, _, _, _ in read), *lengths], specs, cut_dims)


def _fold(dispatcher: DispatcherApi, site: int, ranges: tuple, chip: int, values: list[Any], specs: tuple, cut_dims: tuple[int | None, ...]) -> None:
    """Record the program that folds `site` into the chip's flag if a value is out of its range
    (`values`: the checked arrays, then the cut lengths); the caller holds the dispatcher's thread lock."""
    executor = dispatcher.executor
    flag = _flags.get(chip)
    if flag is None:
        flag = _flags[chip] = _Flag(chip)
    if flag.later:
        _combine(executor, flag)
    dynamic = [flag.array, *values]
    key = (site, specs, cut_dims, chip, executor.deferred)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _plan(site, ranges, specs, cut_dims, chip)
        executor.prepare(plan, dynamic)
    flag.array = executor.run(plan, dynamic)[0]
    flag.unread = True
    if executor.deferred:
        executor.track(flag)


def _checked_values(dispatcher: DispatcherApi, tensor: Any, index_range: IndexRange | ValueCheck) -> tuple[Any, tuple[int, ...], int | None, int | None]:
    """(array, shape, cut dim, length) of a checked index: for a data-dependent result cut from a
    padded buffer (`cuts.layout.cut`), or reshaped from one (`labels.reshape(-1)`), the padded
    counterpart and where its real entries end, so that the check compiles per padded length rather
    than per count; else (and for a value check) the tensor's value, with no cut."""
    layout = None if type(index_range) is ValueCheck else cut_layout(tensor)
    if layout is None:
        return dispatcher.read(tensor), tuple(tensor.shape), None, None
    cut_dim, length, _ = layout
    padded = padded_of(tensor, layout)
    return dispatcher.read(padded), tuple(padded.shape), cut_dim, length


def _plan(site: int, ranges: tuple[IndexRange, ...], index_specs: tuple, cut_dims: tuple[int | None, ...], chip: int) -> Plan:
    """The program that folds `site` into the flag if any index is outside its range (of a cut
    index, any of its first `length` entries along the cut dim: the lengths follow the indices). The
    site is a constant of the program: as an argument it would be one more host-to-chip copy per call."""

    def fold(flag: Any, *arrays: Any) -> tuple:
        indices, lengths = arrays[:len(ranges)], iter(arrays[len(ranges):])
        outside = jnp.zeros((), jnp.bool_)
        for index, index_range, cut_dim in zip(indices, ranges, cut_dims):
            real = None if cut_dim is None else jax.lax.broadcasted_iota(jnp.int32, index.shape, cut_dim) < next(lengths)
            outside = outside | refused(index, index_range, real)
        return (folded(flag, outside, site),)

    length_specs = tuple(((), torch.int32) for cut_dim in cut_dims if cut_dim is not None)
    in_specs = (((), torch.int32), *index_specs, *length_specs)
    return Plan(INDEX_CHECK, fold, (_FLAG_SPEC,), "single", in_specs, chip, ("index check", site))


def refused(values: Any, check: IndexRange | ValueCheck, real: Any = None) -> Any:
    """Whether any of `values` (an array, or a tracer in a program) fails `check` (of an index, only
    where `real` holds when given): a bool scalar."""
    if type(check) is ValueCheck:
        return _VALUE_PREDICATES[check.kind](values)
    bad = (values < check.low) | (values >= check.high)
    if check.exempt is not None:
        bad = bad & (values != check.exempt)
    return jnp.any(bad if real is None else bad & real)


def folded(flag: Any, outside: Any, site: int) -> Any:
    """The flag with `site` folded in where `outside` holds and no earlier site is set (int32)."""
    return jnp.where((flag == 0) & outside, site, flag).astype(jnp.int32)


def note_flag(chip: int, array: Any) -> None:
    """Fold a flag that a compiled program returned (an int32 site, or 0) into `chip`'s flag: it becomes
    the flag where no check ran since the last read, else it waits in the flag's `later` list, which the
    next read scans on the host; every `_COMBINED` flags, one tiny program keeps the first site."""
    dispatcher = routing.active()
    with dispatcher.thread_lock:
        flag = _flags.get(chip)
        if flag is None:
            flag = _flags[chip] = _Flag(chip)
        if flag.unread:
            flag.later.append(array)
            if len(flag.later) == _COMBINED:
                _combine(dispatcher.executor, flag)
        else:
            flag.array = array
        flag.unread = True


def _combine(executor: Any, flag: _Flag) -> None:
    """Fold the flags waiting in `flag.later` (at most `_COMBINED`; the rest of the program's inputs are
    zero flags) into `flag.array`, keeping the first site; the caller holds the dispatcher's thread lock."""
    zero = _zeros.get(flag.chip)
    if zero is None:
        zero = _zeros[flag.chip] = _zero(flag.chip)
    dynamic = [flag.array, *flag.later, *[zero] * (_COMBINED - len(flag.later))]
    flag.later.clear()
    key = ("combine", flag.chip, executor.deferred, _COMBINED)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = Plan(
            INDEX_CHECK, _first_site, (_FLAG_SPEC,), "single", (((), torch.int32),) * (1 + _COMBINED), flag.chip,
            ("index check", "combine"),
        )
        executor.prepare(plan, dynamic)
    flag.array = executor.run(plan, dynamic)[0]
    if executor.deferred:
        executor.track(flag)


def _first_site(first: Any, *later: Any) -> tuple[Any]:
    """The first non-zero of flags in call order (int32 scalars), or 0."""
    for flag in later:
        first = folded(first, flag != 0, flag)
    return (first,)


def _out_of_range_on_host(tensor: torch.Tensor, index_range: IndexRange | ValueCheck) -> bool:
    if type(index_range) is ValueCheck:
        return bool(_VALUE_PREDICATES[index_range.kind](jnp.asarray(tensor.detach().double().numpy())))
    bad = (tensor < index_range.low) | (tensor >= index_range.high)
    if index_range.exempt is not None:
        bad &= tensor != index_range.exempt
    return bool(bad.any())


def _site(op_name: str, ranges: tuple[IndexRange, ...]) -> int:
    """The id (from 1) of this op at the user's current line with these ranges; its message is made once."""
    code, line = _user_frame()
    filename = None if code is None else code.co_filename
    return _site_id((op_name, filename, line, ranges), op_name, filename, line, ranges)


def site_at(op_name: str, filename: str | None, line: int, ranges: tuple[IndexRange | ValueCheck, ...]) -> int:
    """The id (from 1) of this op at `filename:line` (None: no user line) with these ranges: the site of
    a check that a compiled program makes, whose line comes from the traced node's stack."""
    return _site_id((op_name, filename, line, ranges), op_name, filename, line, ranges)


def _site_id(key: tuple, op_name: str, filename: str | None, line: int, ranges: tuple) -> int:
    site = _site_ids.get(key)
    if site is None:
        with _lock:
            site = _site_ids.get(key)
            if site is None:
                where = _where(filename, line)
                noun = _NOUNS.get(op_name.split(".")[1], "an index")
                bounds = "; ".join(index_range.text(noun) for index_range in ranges)
                if any(type(index_range) is ValueCheck for index_range in ranges):
                    message = (
                        f"invalid values in {op_name} at {where} ({bounds}); the CPU refuses them and CUDA raises a "
                        f"device-side assert: fix the values, or run with --mode blocking to stop at the op ({ENV_VARIABLE}=0 "
                        f"turns the checks off)"
                    )
                else:
                    message = (
                        f"index out of range in {op_name} at {where} ({bounds}); XLA would have clamped it, CUDA raises a "
                        f"device-side assert: fix the index, or run with --mode blocking to stop at the op ({ENV_VARIABLE}=0 keeps "
                        f"XLA's clamping)"
                    )
                _site_messages.append(message)
                site = _site_ids[key] = len(_site_messages)
    return site


def _where(filename: str | None, line: int) -> str:
    """`file.py:line` of a user line, or what stands for none."""
    return f"{os.path.basename(filename)}:{line}" if filename is not None else "a line outside the user's code (autograd's backward?)"


def _user_frame() -> tuple[Any, int]:
    """The code object and line of the innermost frame in the user's code, or (None, 0)."""
    frame = sys._getframe(3)
    user_code = _user_code
    while frame is not None:
        code = frame.f_code
        try:
            is_user = user_code.get(code)
            if is_user is None:
                is_user = user_code[code] = is_user_file(code.co_filename, library_roots())
        except TypeError:  # code Dynamo rewrote can hold a dict among its constants: it does not hash
            is_user = is_user_file(code.co_filename, library_roots())
        if is_user:
            return code, frame.f_lineno
        frame = frame.f_back
    return None, 0


def _reader(op: Any, name: str) -> Callable[[Sequence[Any], dict], Any]:
    """Reads argument `name` of a call of `op`, positional or keyword (None if the schema has none)."""
    position = next((index for index, argument in enumerate(op._schema.arguments) if argument.name == name), None)
    if position is None:
        return lambda args, kwargs: None
    return lambda args, kwargs: args[position] if position < len(args) else kwargs.get(name)


def _dim_size(tensor: Any, dim: Any) -> int | None:
    if type(dim) is not int:
        return None  # a named dim
    return tensor.shape[dim] if tensor.dim() else 1


def _along_dim(wraps: bool) -> Callable[[Any], Rule]:
    """`index` along `dim` of `self` (index_select, gather, the scatters, index_add/copy/fill)."""

    def build(op: Any) -> Rule:
        read_self, read_dim, read_index = _reader(op, "self"), _reader(op, "dim"), _reader(op, "index")

        def rule(args: Sequence[Any], kwargs: dict) -> Bounded:
            size = _dim_size(read_self(args, kwargs), read_dim(args, kwargs))
            if size is None:
                return []
            return [(read_index(args, kwargs), IndexRange(-size if wraps else 0, size))]

        return rule

    return build


def _embedding(op: Any) -> Rule:
    read_weight, read_indices = _reader(op, "weight"), _reader(op, "indices")
    return lambda args, kwargs: [(read_indices(args, kwargs), IndexRange(0, read_weight(args, kwargs).shape[0]))]


def _flat(op: Any) -> Rule:
    """`take`/`put`: an index into the flattened tensor, counting from the end when negative."""
    read_self, read_index = _reader(op, "self"), _reader(op, "index")

    def rule(args: Sequence[Any], kwargs: dict) -> Bounded:
        numel = read_self(args, kwargs).numel()
        return [(read_index(args, kwargs), IndexRange(-numel, numel))]

    return rule


def _advanced(op: Any) -> Rule:
    """`x[idx]`, `x[idx] = v`: one index tensor per dim (None skips a dim, a mask covers its dims)."""
    read_self, read_indices = _reader(op, "self"), _reader(op, "indices")

    def rule(args: Sequence[Any], kwargs: dict) -> Bounded:
        shape = read_self(args, kwargs).shape
        bounded: Bounded = []
        dim = 0
        for index in read_indices(args, kwargs):
            if index is None:
                dim += 1
            elif index.dtype in _NOT_INDICES:
                dim += index.dim()
            else:
                bounded.append((index, IndexRange(-shape[dim], shape[dim])))
                dim += 1
        return bounded

    return rule


def _target(op: Any) -> Rule:
    """nll_loss's target: a class in [0, C), or ignore_index."""
    read_self, read_target, read_ignore = _reader(op, "self"), _reader(op, "target"), _reader(op, "ignore_index")

    def rule(args: Sequence[Any], kwargs: dict) -> Bounded:
        scores = read_self(args, kwargs)
        classes = scores.shape[0] if scores.dim() == 1 else scores.shape[1]
        return [(read_target(args, kwargs), IndexRange(0, classes, read_ignore(args, kwargs)))]

    return rule


def _bad_probabilities(probabilities: Any) -> Any:
    """multinomial's refusal: a weight < 0, inf or nan, or a distribution (row) that sums to 0."""
    invalid = jnp.any((probabilities < 0) | ~jnp.isfinite(probabilities))
    return invalid | jnp.any(jnp.sum(probabilities, axis=-1) <= 0)


def _outside_unit_interval(values: Any) -> Any:
    """bernoulli's and binary_cross_entropy's refusal: a value outside [0, 1], or nan."""
    return ~jnp.all((values >= 0) & (values <= 1))


def _not_finite(values: Any) -> Any:
    """histc's refusal when its range is the data's: an inf or nan value."""
    return ~jnp.all(jnp.isfinite(values))


_VALUE_PREDICATES: dict[str, Callable[[Any], Any]] = {
    "probabilities": _bad_probabilities, "probability": _outside_unit_interval, "input": _outside_unit_interval,
    "data range": _not_finite,
}
_VALUE_TEXTS = {
    "probabilities": "a probability < 0, inf or nan, or a distribution summing to 0",
    "probability": "a probability outside [0, 1]",
    "input": "an input outside [0, 1]",
    "data range": "an inf or nan value, where min == max makes the data's range the histogram's",
}


def _values(name: str, kind: str) -> Callable[[Any], Rule]:
    """Argument `name`'s values pass the check `kind` (an overload without that tensor argument has no check)."""

    def build(op: Any) -> Rule:
        read = _reader(op, name)
        takes_tensor = any(argument.name == name and isinstance(argument.type, torch.TensorType) for argument in op._schema.arguments)
        if not takes_tensor:
            return lambda args, kwargs: []
        return lambda args, kwargs: [(read(args, kwargs), ValueCheck(kind))]

    return build


def _histc(op: Any) -> Rule:
    """histc takes the data's range when min == max (both 0 by default): its values must be finite then."""
    read_self, read_min, read_max = _reader(op, "self"), _reader(op, "min"), _reader(op, "max")

    def rule(args: Sequence[Any], kwargs: dict) -> Bounded:
        if (read_min(args, kwargs) or 0) != (read_max(args, kwargs) or 0):
            return []
        return [(read_self(args, kwargs), ValueCheck("data range"))]

    return rule


# The ops whose checked values are not indices (their errors say "invalid values").
_VALUE_RULES: dict[Any, Callable[[Any], Rule]] = {
    aten.multinomial: _values("self", "probabilities"), aten.binary_cross_entropy: _values("self", "input"),
    aten.histc: _histc,
    aten.bernoulli: lambda op: _values("p" if op is aten.bernoulli.Tensor else "self", "probability")(op),
    aten.bernoulli_: _values("p", "probability"),
}
_NOUNS = {"nll_loss_forward": "a target", "nll_loss2d_forward": "a target", "one_hot": "a class value"}

_RULES: dict[Any, Callable[[Any], Rule]] = {
    aten.embedding: _embedding,
    aten.take: _flat, aten.put: _flat, aten.put_: _flat,
    aten.index: _advanced, aten.index_put: _advanced, aten.index_put_: _advanced, aten._index_put_impl_: _advanced,
    aten.nll_loss_forward: _target, aten.nll_loss2d_forward: _target,
    **_VALUE_RULES,
    aten.index_fill: _along_dim(wraps=True), aten.index_fill_: _along_dim(wraps=True),
    **{
        packet: _along_dim(wraps=False)
        for packet in (
            aten.index_select, aten.gather, aten.scatter, aten.scatter_, aten.scatter_add, aten.scatter_add_,
            aten.scatter_reduce, aten.scatter_reduce_, aten.index_add, aten.index_add_, aten.index_copy, aten.index_copy_,
        )
    },
}
