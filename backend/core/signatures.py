"""Input signatures of compiled programs, as text, and what differs between two of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tputrace.backend.core.dtypes import short_name

# One input of a program: (shape, torch dtype) for a tensor, (shape, torch dtype, memory format name)
# for a channels-last one, (type name,) for a scalar.
InputSpec = tuple


def is_tensor_spec(spec: InputSpec) -> bool:
    return len(spec) >= 2


def spec_text(spec: InputSpec) -> str:
    if is_tensor_spec(spec):
        shape, dtype = spec[0], spec[1]
        text = f"{short_name(dtype)}[{','.join(str(size) for size in shape)}]"
        return text if len(spec) == 2 else f"{text} {spec[2]}"
    return spec[0]


def signature_text(specs: Sequence[InputSpec]) -> str:
    """E.g. 'f32[64,128], f32[128], float'."""
    return ", ".join(spec_text(spec) for spec in specs)


def signature_diff(old: Sequence[InputSpec], new: Sequence[InputSpec], names: Sequence[str] | None = None) -> str:
    """What changed from `old` to `new`, e.g. 'input 0 dim 1: 128 -> 256; input 2 dtype: f32 -> bf16'."""
    if len(old) != len(new):
        return f"number of inputs: {len(old)} -> {len(new)}"
    changes = []
    for index, (before, after) in enumerate(zip(old, new)):
        label = names[index] if names and index < len(names) else f"input {index}"
        if before == after:
            continue
        if is_tensor_spec(before) != is_tensor_spec(after) or not is_tensor_spec(before):
            changes.append(f"{label}: {spec_text(before)} -> {spec_text(after)}")
            continue
        old_shape, old_dtype = before[0], before[1]
        new_shape, new_dtype = after[0], after[1]
        if before[2:] != after[2:]:
            changes.append(f"{label} memory format: {_format_name(before)} -> {_format_name(after)}")
        if old_dtype != new_dtype:
            changes.append(f"{label} dtype: {short_name(old_dtype)} -> {short_name(new_dtype)}")
        if len(old_shape) != len(new_shape):
            changes.append(f"{label} rank: {len(old_shape)} -> {len(new_shape)} ({spec_text(before)} -> {spec_text(after)})")
            continue
        for dim, (old_size, new_size) in enumerate(zip(old_shape, new_shape)):
            if old_size != new_size:
                changes.append(f"{label} dim {dim}: {old_size} -> {new_size}")
    return "; ".join(changes) if changes else "same signature"


def nearest_signature(candidates: Sequence[Sequence[InputSpec]], new: Sequence[InputSpec]) -> Sequence[InputSpec] | None:
    """The earlier signature with the fewest differing dims and dtypes (latest wins ties)."""
    best = None
    best_score = None
    for candidate in candidates:
        score = _distance(candidate, new)
        if best_score is None or score <= best_score:
            best, best_score = candidate, score
    return best


def _distance(old: Sequence[InputSpec], new: Sequence[InputSpec]) -> int:
    if len(old) != len(new):
        return 1_000_000
    distance = 0
    for before, after in zip(old, new):
        if before == after:
            continue
        if is_tensor_spec(before) != is_tensor_spec(after) or not is_tensor_spec(before):
            distance += 100
            continue
        distance += int(before[1] != after[1]) * 10 + int(before[2:] != after[2:])
        if len(before[0]) != len(after[0]):
            distance += 100
        else:
            distance += sum(1 for a, b in zip(before[0], after[0]) if a != b)
    return distance


def _format_name(spec: InputSpec) -> str:
    return spec[2] if len(spec) > 2 else "contiguous"


def key_change(old: Any, new: Any, limit: int = 60) -> str:
    """The first part of two plan keys that differs, as `old -> new`."""
    while isinstance(old, tuple) and isinstance(new, tuple) and len(old) == len(new):
        differing = next((index for index, (a, b) in enumerate(zip(old, new)) if a != b), None)
        if differing is None:
            break
        old, new = old[differing], new[differing]
    return f"{repr(old)[:limit]} -> {repr(new)[:limit]}"
