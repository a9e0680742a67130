"""A jitted function compiled again because its arrays were placed another way: an input's sharding or the devices
it lives on changed between calls, which compiles a new program though the arrays' shapes did not change. An XProf
import's compile `detail` holds each program's `devices` and its parameters' `shardings` (`hlo_placement`); the
programs of one function and signature that differ in them name the change (`static_recompiles` words the finding)."""

from __future__ import annotations

from collections.abc import Sequence

# Each change: what changed (`arg 1 sharding`, `devices`), then its values in compile order, repeats dropped.
PlacementChanges = tuple[tuple[str, ...], ...]


def placement_changes(details: Sequence[dict[str, object]]) -> PlacementChanges:
    """What differs in the placement of a function's programs (one detail per compile, in compile order); empty where
    the details name none or it did not change."""
    changes: list[tuple[str, ...]] = []
    shardings = [_texts(detail.get("shardings")) for detail in details]
    if len({len(texts) for texts in shardings}) == 1:
        for index, column in enumerate(zip(*shardings)):
            if len(set(column)) > 1:
                changes.append((f"arg {index} sharding", *_distinct(column)))
    elif any(shardings):
        changes.append(("shardings", *_distinct([", ".join(texts) or "none" for texts in shardings])))
    devices = [f"[{','.join(_texts(detail.get('devices')))}]" for detail in details]
    if all(detail.get("devices") for detail in details) and len(set(devices)) > 1:
        changes.append(("devices", *_distinct(devices)))
    return tuple(changes)


def placement_text(changes: PlacementChanges) -> str:
    """`arg 1 sharding took {devices=[2,1]<=[2]}, {replicated}; devices took [0,1], [1,2]`."""
    return "; ".join(f"{change[0]} took {', '.join(change[1:])}" for change in changes)


def placement_what(function: str) -> str:
    return (f"The programs of {function} differ in where their arrays live: an input was placed with another "
            "sharding or on other devices than at the call before (`jax.device_put` with another sharding or device, "
            "or an array returned by a program that left it sharded another way), and JAX compiles a program for each "
            "placement, though the arrays' shapes are the same")


def placement_suggestion(function: str) -> str:
    return (f"Call {function} with its arrays placed one way: put each input with one sharding (`jax.device_put(x, "
            "sharding)` with the same `NamedSharding`, on the same devices) before every call, or give the jitted "
            "function `in_shardings` (and `out_shardings`, so that what it returns and is fed back keeps that "
            "placement); JAX then moves an input placed otherwise instead of compiling again. A `jax.pmap` given other "
            "`devices=` compiles for each list: make the pmapped function once, with one device list.")


def _texts(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def _distinct(values: Sequence[str]) -> list[str]:
    seen: list[str] = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen
