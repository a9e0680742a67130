"""Random state: a seed and a counter, one per chip (the default generator, `torch.tpu.manual_seed`)
and one per explicit generator (`torch.Generator(device="tpu")`). Each random op draws from a
counter-based Philox stream (XLA's `RngBitGenerator`, through JAX's `unsafe_rbg` keys) keyed by the
seed, the op's counter selecting its own block of the stream, so sequences are reproducible and no
lowering holds a fixed key; seed and counter arrive in the program as inputs, so drawing again
compiles nothing new. Philox compiles several times faster on XLA:CPU than JAX's default threefry
keys, whose hash XLA unrolls at every draw."""

from __future__ import annotations

import struct
from collections import defaultdict

import jax
import jax.numpy as jnp

DEFAULT_SEED = 67280421310721  # torch's default seed (CPU and CUDA), so an unseeded run is deterministic like torch's
_UINT64 = 0xFFFF_FFFF_FFFF_FFFF
_PROGRAM_SEED_MASK = 0x7FFF_FFFF_FFFF_FFFF  # the seed input is an int64
STATE_BYTES = 16


class RngState:
    """A seed and the number of random ops drawn since it was set."""

    __slots__ = ("counter", "seed")

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        self.seed = seed
        self.counter = 0

    def reseed(self, seed: int) -> None:
        self.seed = int(seed) & _UINT64
        self.counter = 0

    def next_seed_and_counter(self, draws: int = 1) -> tuple[int, int]:
        """The (seed, counter) pair for the next random op; passed to the program as inputs. With
        `draws`, the counter is the first of that many, each one random op's."""
        counter = self.counter
        self.counter = counter + draws
        return self.seed & _PROGRAM_SEED_MASK, counter

    def pack(self) -> bytes:
        return struct.pack("<QQ", self.seed, self.counter)

    def unpack(self, state: bytes) -> None:
        if len(state) != STATE_BYTES:
            raise ValueError(f"a tpu RNG state is {STATE_BYTES} bytes (seed and counter), got {len(state)}")
        self.seed, self.counter = struct.unpack("<QQ", state)


_chip_states: defaultdict[int, RngState] = defaultdict(RngState)
_initial_seed = DEFAULT_SEED


def manual_seed(chip: int, seed: int) -> None:
    global _initial_seed
    _chip_states[chip].reseed(seed)
    _initial_seed = int(seed)


def initial_seed() -> int:
    return _initial_seed


def next_seed_and_counter(chip: int, draws: int = 1) -> tuple[int, int]:
    """The (seed, counter) pair for the next random op drawn from `chip`'s default generator (the
    first counter of the next `draws` random ops)."""
    return _chip_states[chip].next_seed_and_counter(draws)


KEY_IMPL = "unsafe_rbg"
_LOW_WORD = 0xFFFF_FFFF


def key_from(seed: jax.Array, counter: jax.Array) -> jax.Array:
    """The PRNG key for one random op, made inside the program from traced seed and counter.

    The key's four 32-bit words are the generator state XLA's Philox reads as two 64-bit words: the
    seed as Philox's key, and a block counter whose high half is the op's counter, so each op draws
    from its own run of 2**32 blocks (2**34 32-bit values) and no two ops' streams overlap. A counter
    past 2**32 changes the key's high word instead."""
    seed_bits = seed.astype(jnp.uint64)
    counter_bits = counter.astype(jnp.uint64)
    words = jnp.stack([
        seed_bits & _LOW_WORD,
        (seed_bits >> 32) ^ (counter_bits >> 32),
        jnp.zeros((), jnp.uint64),
        counter_bits & _LOW_WORD,
    ]).astype(jnp.uint32)
    return jax.random.wrap_key_data(words, impl=KEY_IMPL)


def get_state(chip: int) -> bytes:
    return _chip_states[chip].pack()


def set_state(chip: int, state: bytes) -> None:
    _chip_states[chip].unpack(state)
