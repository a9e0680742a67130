"""`torch.Generator(device="tpu")`: explicit generators, each with its own seed and counter.

torch 2.13 makes a PrivateUse1 generator only in C++: `torch.Generator(device=...)` asks the
backend's `PrivateUse1HooksInterface::getNewGenerator`, which the Python hooks of `torch._C._acc`
do not forward (torch/csrc/acc/Module.cpp: "these is not supported from python yet"), and whose
default finds a generator only where C++ registered one (`REGISTER_GENERATOR_PRIVATEUSE1`).

So a tpu generator is a Python subclass of `torch.Generator`, which torch's argument parser accepts
wherever an op takes `generator=`. It carries a CPU generator (the only kind this torch can make),
used for its identity and to check and hold the seed; the tpu seed and counter live in an
`rng.RngState`. Inside `__torch_dispatch__` the argument arrives as a new `torch.Generator` object
around the same C++ generator, so states are found by that generator's address (`_cdata`).
`torch.Generator(device="tpu")` returns one because `install` adds a `__call__` to the metaclass
torch gives `torch.Generator` (`OpaqueBaseMeta`); every other construction passes through.

What differs from CUDA: a tpu generator passed to a CPU op is not refused (it is a CPU generator
to C++) and draws from its CPU stream.

Under torch.compile a draw with a tpu generator runs eagerly, as a draw with a CPU or CUDA generator
does: Dynamo wraps those as plain objects and graph-breaks at the op. A subclass misses that case
and becomes an opaque object whose fake stand-in (a `FakeScriptObject`) passed `isinstance(...,
torch.Generator)`, so the op's fake run failed in C++ ("GeneratorImpl with nullptr"), a hard error.
`install` makes the stand-in fail that check: torch's argument parser then raises a TypeError,
which Dynamo turns into a graph break, and the op runs eagerly and advances the generator.
"""

from __future__ import annotations

import hashlib
import struct
import weakref
from typing import Any

import torch
from torch._library.fake_class_registry import FakeScriptObject
from torch._opaque_base import OpaqueBaseMeta

from tputrace.backend.compat import device_module
from tputrace.backend.core.rng import RngState

BACKEND_NAME = "tpu"

# The RNG state of each live tpu generator, by the address of its C++ generator.
_rng_states: dict[int, RngState] = {}
_TorchGenerator = torch._C.Generator
_type_call = OpaqueBaseMeta.__call__
_opaque_instancecheck = OpaqueBaseMeta.__instancecheck__


class TpuGenerator(torch.Generator):
    """A generator for the tpu device: `torch.Generator(device="tpu")` returns one.

    A new generator starts from torch's default seed with its counter at 0; its state (16 bytes:
    seed and counter, little-endian) has the format of `torch.tpu.get_rng_state`, and a generator
    seeded like the default one draws the same values, as on CUDA."""

    __slots__ = ("_chip", "_rng")

    def __new__(cls, device: Any = None) -> TpuGenerator:
        generator = super().__new__(cls)
        generator._chip = device_module.chip_index(device)
        generator._rng = RngState()
        _rng_states[generator._cdata] = generator._rng
        weakref.finalize(generator, _rng_states.pop, generator._cdata, None)
        return generator

    @property
    def device(self) -> torch.device:
        return torch.device(BACKEND_NAME, self._chip)

    def manual_seed(self, seed: int) -> TpuGenerator:
        super().manual_seed(seed)  # torch's checks and errors for the seed's type and range
        self._rng.reseed(super().initial_seed())
        return self

    def seed(self) -> int:
        """Seed from a non-deterministic source, as torch does; returns the seed."""
        seed = super().seed()
        self._rng.reseed(seed)
        return seed

    def initial_seed(self) -> int:
        return self._rng.seed

    def get_state(self) -> torch.Tensor:
        return torch.frombuffer(bytearray(self._rng.pack()), dtype=torch.uint8)

    def set_state(self, new_state: torch.Tensor) -> TpuGenerator:
        if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
            raise TypeError("RNG state must be a torch.ByteTensor")
        self._rng.unpack(bytes(new_state.to("cpu").tolist()))
        super().manual_seed(self._rng.seed)
        return self

    def get_offset(self) -> int:
        """The number of random ops drawn since the seed was set (CUDA's Philox offset counts 32-bit draws)."""
        return self._rng.counter

    def set_offset(self, offset: int) -> TpuGenerator:
        self._rng.counter = int(offset)
        return self

    def clone_state(self) -> TpuGenerator:
        clone = TpuGenerator(self.device)
        clone.set_state(self.get_state())
        return clone

    def graphsafe_get_state(self) -> TpuGenerator:
        raise RuntimeError("graph-safe generator states are for CUDA graphs; a tpu generator has none (use get_state)")

    def graphsafe_set_state(self, state: torch.Generator) -> TpuGenerator:
        raise RuntimeError("graph-safe generator states are for CUDA graphs; a tpu generator has none (use set_state)")

    def __reduce__(self) -> tuple:
        return (torch.Generator, (self.device,), (self.get_state(),))

    def __setstate__(self, state: tuple) -> None:
        self.set_state(state[0])


def _construct(cls: type, *args: Any, **kwargs: Any) -> Any:
    """`OpaqueBaseMeta.__call__`: `torch.Generator(device="tpu")` makes a TpuGenerator."""
    if cls is _TorchGenerator and (args or kwargs) and _names_tpu(args[0] if args else kwargs.get("device")):
        return TpuGenerator(*args, **kwargs)
    return _type_call(cls, *args, **kwargs)


def _names_tpu(device: Any) -> bool:
    if isinstance(device, str):
        return device.partition(":")[0] == BACKEND_NAME
    return isinstance(device, torch.device) and device.type == BACKEND_NAME


def _instancecheck(cls: type, instance: Any) -> bool:
    """`OpaqueBaseMeta.__instancecheck__`: Dynamo's fake stand-in of a tpu generator is no
    `torch.Generator`, so an op given it refuses it with a TypeError (a graph break)."""
    if type(instance) is FakeScriptObject and type(getattr(instance, "real_obj", None)) is TpuGenerator and issubclass(cls, _TorchGenerator):
        return False
    return _opaque_instancecheck(cls, instance)


def install() -> None:
    """Let `torch.Generator(device="tpu")` make a tpu generator, and torch.compile graph-break at
    its draws (idempotent)."""
    if OpaqueBaseMeta.__dict__.get("__call__") is not _construct:
        OpaqueBaseMeta.__call__ = _construct
    if OpaqueBaseMeta.__dict__.get("__instancecheck__") is not _instancecheck:
        OpaqueBaseMeta.__instancecheck__ = _instancecheck


def next_seed_and_counter(generator: torch.Generator) -> tuple[int, int]:
    """The (seed, counter) inputs of a random op called with `generator=`. Another device's generator
    gets torch's error (`check_generator` in ATen/core/Generator.h)."""
    rng_state = _rng_states.get(generator._cdata)
    if rng_state is None:
        raise RuntimeError(f"Expected a '{BACKEND_NAME}' device type for generator but found '{generator.device.type}'")
    return rng_state.next_seed_and_counter()


def host_generator(generator: torch.Generator) -> torch.Generator:
    """A CPU generator for a random op that runs on the host (a CPU fallback), seeded from the tpu
    generator's next (seed, counter), so the fallback is reproducible and advances that generator."""
    seed, counter = next_seed_and_counter(generator)
    digest = hashlib.blake2b(struct.pack("<QQ", seed, counter), digest_size=8).digest()
    return _type_call(_TorchGenerator).manual_seed(int.from_bytes(digest, "little"))
