"""What the dispatcher knows about an ATen overload: how it runs on a chip, derived once from its schema.

Kinds:
- `lowered`: a functional op with a lowering.
- `view`: returns an alias of its first argument (`Tensor(a)` without write).
- `inplace`: writes into its first argument (`Tensor(a!) self`): run the functional op, write the result.
- `inplace_list`: writes into a list argument (`_foreach_*_`).
- `out`: writes into keyword `out` tensors: run the functional overload, write each result.
- `decompose`: CompositeImplicit or in torch's decomposition tables.
- `fallback`: none of the above; runs on the host CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._decomp

from tputrace.backend.ops.registry import Lowering, lowering_for

OpOverload = torch._ops.OpOverload

_ALL_DECOMPOSITIONS = torch._decomp.decomposition_table

# Ops whose `Scalar` arguments decide output shapes and so must stay compile-time constants.
_STATIC_SCALAR_OPS = {"aten::arange", "aten::linspace", "aten::logspace", "aten::randint"}
# Ops whose `float` arguments are hyperparameters that change between calls (a scheduled learning
# rate): traced like Scalars, so a new value does not compile a new program.
_TRACED_FLOAT_OPS = {"aten::_fused_adam", "aten::_fused_adamw", "aten::_fused_sgd", "aten::_fused_adagrad"}
# Norms: the order picks the algorithm. A traced order makes the lowering compute every norm and
# select (|x|**p by exp/log, max, min, nonzero count): clip_grad_norm_ made the GPT step's flush ~18x slower.
_ORDER_SCALAR_OPS = {"aten::linalg_vector_norm", "aten::norm", "aten::_foreach_norm", "aten::_foreach_powsum"}
# Variances: the correction (Bessel's, 0 or 1 in practice) is a constant of the program. Traced, each call's
# divisor would be a scalar kernel of its own (a batch norm's `var_mean` in every layer).
_CORRECTION_SCALAR_OPS = {"aten::var", "aten::var_mean", "aten::std", "aten::std_mean"}
# Lowered ops whose meta kernel gives other shapes than the CPU: their outputs' shapes come from the
# lowering, which checks the arguments itself. multilabel_margin_loss_forward's is torch's
# decomposition: a 1-D or 0-d input's unreduced loss comes out (1,), the CPU's is 0-d.
_LOWERING_SHAPED_OPS = {"aten::multilabel_margin_loss_forward"}


@dataclass(eq=False)
class OpEntry:
    """One ATen overload, classified."""

    op: OpOverload
    name: str
    kind: str
    lowering: Lowering | None = None
    functional: OpOverload | None = None
    scalar_positions: frozenset[int] = frozenset()
    scalar_names: frozenset[str] = frozenset()
    scalar_list_positions: frozenset[int] = frozenset()
    scalar_list_names: frozenset[str] = frozenset()
    out_names: tuple[str, ...] = ()
    decomposition: object = None
    mutated_positions: tuple[int, ...] = ()
    extra: dict = field(default_factory=dict)

    simple_args: bool = False  # no positional Scalar lists: the fast argument path applies
    generator_arg: tuple[int, str] | None = None  # a `Generator?` argument: (position, -1 if keyword-only; name)
    typed_constants: bool = False  # constant Scalars whose Python type matters (arange(4) vs arange(4.0))
    factory_out: bool = False  # an `out=` factory (`eye.m_out`): its functional takes the out tensor's dtype and device
    shapes_from_lowering: bool = False  # an internal step (`data_dependent`) or a `_LOWERING_SHAPED_OPS` op: its outputs' shapes come from its lowering
    functional_entry: OpEntry | None = None  # a writing op's: its functional op's entry, once the dispatcher has looked it up
    bumps_versions: bool = False  # a `_foreach_*_` op: torch's kernel bumps each written tensor's version (AMP's unscale bumps none)


def _is_scalar_type(arg_type: torch._C.JitType, traced_floats: bool = False) -> bool:
    if isinstance(arg_type, torch._C.OptionalType):
        arg_type = arg_type.getElementType()
    return isinstance(arg_type, torch._C.NumberType) or (traced_floats and isinstance(arg_type, torch._C.FloatType))


def _is_tensor_type(arg_type: torch._C.JitType) -> bool:
    """Tensor arguments: a Python number passed there is a wrapped scalar, a runtime value."""
    if isinstance(arg_type, torch._C.OptionalType):
        arg_type = arg_type.getElementType()
    return isinstance(arg_type, torch._C.TensorType)


def _is_generator_type(arg_type: torch._C.JitType) -> bool:
    if isinstance(arg_type, torch._C.OptionalType):
        arg_type = arg_type.getElementType()
    return isinstance(arg_type, torch._C._GeneratorType)


def _is_scalar_list_type(arg_type: torch._C.JitType) -> bool:
    if isinstance(arg_type, torch._C.OptionalType):
        arg_type = arg_type.getElementType()
    return isinstance(arg_type, torch._C.ListType) and isinstance(arg_type.getElementType(), torch._C.NumberType)


@dataclass(frozen=True)
class WrittenArgument:
    """An argument an op writes (in place, or `out=`), from its schema's alias annotation."""

    position: int
    name: str
    kwarg_only: bool


@functools.cache
def written_arguments(op: OpOverload) -> tuple[WrittenArgument, ...]:
    """The arguments `op` writes, in schema order (read once per op: a schema read costs ~2 µs)."""
    return tuple(
        WrittenArgument(position, arg.name, arg.kwarg_only)
        for position, arg in enumerate(op._schema.arguments)
        if arg.alias_info is not None and arg.alias_info.is_write
    )


def _functional_of_inplace(op: OpOverload) -> OpOverload | None:
    """The functional overload taking arguments of the same types: `pow_.Scalar(Tensor, Scalar)` is
    `pow.Tensor_Scalar`, not `pow.Scalar(Scalar, Tensor)`; the same overload name is preferred."""
    packet_name = op._schema.name.split("::")[1]
    if not packet_name.endswith("_"):
        return None
    packet = getattr(torch.ops.aten, packet_name[:-1], None)
    if packet is None:
        return None
    wanted = [str(arg.type) for arg in op._schema.arguments]
    for overload_name in sorted(packet.overloads(), key=lambda name: name != op._overloadname):
        candidate = getattr(packet, overload_name)
        if [str(arg.type) for arg in candidate._schema.arguments] == wanted:
            return candidate
    return None


# A factory's `out=` overload drops these keyword-only arguments of its functional overload
# (`eye.m_out(n, m, *, out)` against `eye.m(n, m, *, dtype, layout, device, pin_memory)`): the out
# tensor supplies them.
_TENSOR_OPTIONS = {"dtype", "layout", "device", "pin_memory"}


def _functional_of_out(op: OpOverload) -> tuple[OpOverload | None, bool]:
    """The functional overload taking the out overload's other arguments, and whether it is a
    factory's, which also takes tensor options (`_out` passes the out tensor's dtype and device)."""
    schema = op._schema
    wanted = [(arg.name, str(arg.type)) for arg in schema.arguments if not (arg.alias_info and arg.alias_info.is_write)]
    packet = getattr(torch.ops.aten, schema.name.split("::")[1])
    factory = None
    for overload_name in packet.overloads():
        candidate = getattr(packet, overload_name)
        if candidate._schema.is_mutable:
            continue
        arguments = candidate._schema.arguments
        signature = [(arg.name, str(arg.type)) for arg in arguments]
        if signature == wanted:
            return candidate, False
        extra = arguments[len(wanted) :]
        if signature[: len(wanted)] == wanted and extra and all(arg.kwarg_only and arg.name in _TENSOR_OPTIONS for arg in extra):
            factory = candidate
    return factory, factory is not None


@functools.cache
def _core_decompositions() -> dict:
    """torch's core ATen decompositions, built at the first op that asks (~0.16 s here), not at import."""
    return torch._decomp.core_aten_decompositions()


def _decomposition(op: OpOverload) -> object:
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        return op.decompose
    return _core_decompositions().get(op) or _ALL_DECOMPOSITIONS.get(op)


def classify(op: OpOverload) -> OpEntry:
    """Work out how an overload runs on a chip from its schema, its lowering and torch's decompositions."""
    schema = op._schema
    name = str(op)
    scalar_positions, scalar_names, list_positions, list_names = set(), set(), set(), set()
    if schema.name not in _STATIC_SCALAR_OPS and schema.name not in _ORDER_SCALAR_OPS and schema.name not in _CORRECTION_SCALAR_OPS:
        for position, arg in enumerate(schema.arguments):
            if _is_scalar_type(arg.type, schema.name in _TRACED_FLOAT_OPS) or _is_tensor_type(arg.type):
                (scalar_names if arg.kwarg_only else scalar_positions).add(arg.name if arg.kwarg_only else position)
            elif _is_scalar_list_type(arg.type):
                (list_names if arg.kwarg_only else list_positions).add(arg.name if arg.kwarg_only else position)
    entry = OpEntry(
        op,
        name,
        "fallback",
        lowering=lowering_for(op),
        scalar_positions=frozenset(scalar_positions),
        scalar_names=frozenset(scalar_names),
        scalar_list_positions=frozenset(list_positions),
        scalar_list_names=frozenset(list_names),
    )
    entry.simple_args = not list_positions
    entry.generator_arg = next(
        ((-1 if arg.kwarg_only else position, arg.name) for position, arg in enumerate(schema.arguments) if _is_generator_type(arg.type)), None
    )
    entry.typed_constants = schema.name in _STATIC_SCALAR_OPS
    written = written_arguments(op)
    entry.mutated_positions = tuple(arg.position for arg in written if not arg.kwarg_only)
    returns_alias = bool(schema.returns) and schema.returns[0].alias_info is not None
    if written:
        entry.decomposition = _decomposition(op)
        if all(arg.kwarg_only for arg in written):
            entry.kind = "out"
            entry.out_names = tuple(arg.name for arg in written)
            entry.functional, entry.factory_out = _functional_of_out(op)
        elif str(schema.arguments[0].type).startswith("List[Tensor]"):
            entry.kind = "inplace_list"
            entry.functional = _functional_of_inplace(op)
            entry.bumps_versions = schema.name.startswith("aten::_foreach_")
        else:
            entry.kind = "inplace"
            entry.functional = _functional_of_inplace(op)
        if entry.lowering is None and entry.functional is None and entry.decomposition is None:
            entry.kind = "fallback"
        return entry
    if returns_alias and entry.lowering is not None:
        entry.kind = "view"
        return entry
    if entry.lowering is not None:
        entry.kind = "lowered"
        entry.shapes_from_lowering = schema.name in _LOWERING_SHAPED_OPS
        return entry
    entry.decomposition = _decomposition(op)
    entry.kind = "decompose" if entry.decomposition is not None else "fallback"
    return entry


def bound(op: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The op's arguments in schema order, defaults filled in."""
    values = list(args)
    for argument in op._schema.arguments[len(args):]:
        values.append(kwargs[argument.name] if argument.name in kwargs else argument.default_value)
    return values
