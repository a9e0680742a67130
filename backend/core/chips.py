"""The chips a process sees: JAX's TPU devices on a TPU host, else N virtual XLA CPU devices.

`TPUTRACE_CHIPS=N` (default 1) sets N. On a host without TPUs the virtual devices come from
`--xla_force_host_platform_device_count`, which must be set before JAX initialises its backends;
`configure()` does that when the backend is imported. `TPUTRACE_PLATFORM` names the XLA platform
that backs the chips instead (`cpu`, `gpu`, `tpu`): e.g. `gpu` runs the chips on a host's GPUs,
one chip per GPU.

On virtual chips `configure()` also turns off LLVM's loop unrolling in XLA:CPU's kernels
(`xla_cpu_disable_loop_unrolling`): a small loop fully unrolled (a layer norm's `rsqrt` over a
batch's rows, a transpose between layouts) is most of its kernel's compile time; without it the
programs compile in about four fifths of the CPU and run about as fast (docs/performance.md). An
`--xla_backend_extra_options` already in `XLA_FLAGS` is left as it is.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import jax

from tputrace import settings

CHIPS_ENV = settings.CHIPS[0]
PLATFORM_ENV = "TPUTRACE_PLATFORM"
_HOST_COUNT_FLAG = "--xla_force_host_platform_device_count"
_EXTRA_OPTIONS_FLAG = "--xla_backend_extra_options"
LOOP_UNROLLING_OFF = "xla_cpu_disable_loop_unrolling"


class ChipError(RuntimeError):
    """A chip index or chip count that this process cannot provide."""


def requested_chip_count() -> int:
    return settings.positive_int(settings.CHIPS, ChipError)


def configure() -> None:
    """Ask XLA for enough host devices, before JAX starts, so virtual chips exist on CPU hosts, and for
    XLA:CPU kernels without LLVM's loop unrolling when the chips are XLA:CPU devices."""
    count = requested_chip_count()
    flags = os.environ.get("XLA_FLAGS", "").split()
    existing = [flag for flag in flags if flag.startswith(_HOST_COUNT_FLAG + "=")]
    kept = flags
    try:
        enough = bool(existing) and int(existing[-1].split("=", 1)[1]) >= count
    except ValueError:
        enough = False
    if not enough:
        kept = [*(flag for flag in flags if not flag.startswith(_HOST_COUNT_FLAG + "=")), f"{_HOST_COUNT_FLAG}={count}"]
    if _chips_on_xla_cpu() and not any(flag.startswith(_EXTRA_OPTIONS_FLAG + "=") for flag in flags):
        kept = [*kept, f"{_EXTRA_OPTIONS_FLAG}={LOOP_UNROLLING_OFF}"]
    if kept != flags:
        os.environ["XLA_FLAGS"] = " ".join(kept)


def _chips_on_xla_cpu() -> bool:
    """Whether the chips will be XLA:CPU devices: `TPUTRACE_PLATFORM=cpu`, or no platform named and no libtpu."""
    requested_platform = os.environ.get(PLATFORM_ENV, "").strip().lower()
    if requested_platform:
        return requested_platform == "cpu"
    return importlib.util.find_spec("libtpu") is None


def _platform_devices(name: str) -> list[jax.Device]:
    """The named platform's devices, or a one-line error saying which platforms this JAX has."""
    try:
        return jax.devices(name)
    except RuntimeError:
        raise ChipError(
            f"{PLATFORM_ENV}={name} but this JAX has no {name} devices; unset {PLATFORM_ENV} to use TPUs "
            "where there are some and virtual chips on the CPU elsewhere"
        ) from None


@functools.cache
def devices() -> tuple[jax.Device, ...]:
    """The JAX devices that back tpu:0 .. tpu:N-1."""
    count = requested_chip_count()
    requested_platform = os.environ.get(PLATFORM_ENV, "").strip().lower()
    if requested_platform:
        available = _platform_devices(requested_platform)
    else:
        try:
            available = jax.devices("tpu")
        except RuntimeError:
            available = jax.devices("cpu")
    if len(available) < count:
        raise ChipError(
            f"{CHIPS_ENV}={count} but only {len(available)} {available[0].platform} device(s) exist; "
            f"import tputrace.backend before anything initialises JAX, or lower {CHIPS_ENV}"
        )
    return tuple(available[:count])


def platform() -> str:
    """'tpu' when chips are real TPUs, else the XLA platform name (e.g. 'cpu')."""
    return devices()[0].platform


def count() -> int:
    return len(devices())


def device(index: int) -> jax.Device:
    """The JAX device for tpu:<index>, or a one-line error naming the chip count."""
    chips = devices()
    if not 0 <= index < len(chips):
        raise ChipError(
            f"tpu:{index} does not exist: this process has {len(chips)} chip(s), tpu:0..tpu:{len(chips) - 1} "
            f"(set {CHIPS_ENV} or tputrace run --chips for more)"
        )
    return chips[index]
