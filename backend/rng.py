"""Per-chip random state: a seed and a counter. Each random op folds the counter into the seed's key,
so sequences are reproducible under torch.manual_seed and no lowering holds a fixed key."""

from __future__ import annotations

import struct
from collections import defaultdict

import jax

_DEFAULT_SEED = 67280421310721  # torch's default CPU seed, so an unseeded run is deterministic like torch's

_seeds: defaultdict[int, int] = defaultdict(lambda: _DEFAULT_SEED)
_counters: defaultdict[int, int] = defaultdict(int)
_initial_seed = _DEFAULT_SEED


def manual_seed(chip: int, seed: int) -> None:
    global _initial_seed
    _seeds[chip] = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    _counters[chip] = 0
    _initial_seed = int(seed)


def initial_seed() -> int:
    return _initial_seed


def next_seed_and_counter(chip: int) -> tuple[int, int]:
    """The (seed, counter) pair for the next random op on `chip`; passed to the program as inputs."""
    counter = _counters[chip]
    _counters[chip] = counter + 1
    return _seeds[chip] & 0x7FFF_FFFF_FFFF_FFFF, counter


def key_from(seed: jax.Array, counter: jax.Array) -> jax.Array:
    """The PRNG key for one random op, derived inside the program from traced seed and counter."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), counter)


def get_state(chip: int) -> bytes:
    return struct.pack("<QQ", _seeds[chip], _counters[chip])


def set_state(chip: int, state: bytes) -> None:
    if len(state) != 16:
        raise ValueError(f"a tpu RNG state is 16 bytes (seed and counter), got {len(state)}")
    seed, counter = struct.unpack("<QQ", state)
    _seeds[chip] = seed
    _counters[chip] = counter
