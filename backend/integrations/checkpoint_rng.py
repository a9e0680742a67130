"""The tpu generators' states in Hugging Face checkpoints, so dropout after a resume draws the masks an
uninterrupted run would.

accelerate's `save_state`/`load_state` and `transformers.Trainer`'s checkpoints save and restore the RNG
states of the devices they know (cpu, cuda, xla, npu, ...) in their own RNG file; accelerate from 1.16
also keeps the current chip's state there, but not the other chips'. Here each also writes every chip's
state (`torch.tpu.get_rng_state_all()`) to one more file next to it, `tpu_<their file>`,
and restores the chips from that file when it is there: a checkpoint written without it loads as
before and leaves the tpu generators as they are. A file of its own, rather than a key added to
theirs, leaves their files as they wrote them and loads with `weights_only=True` (a list of byte
tensors) without the allowlists their numpy states need.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tputrace.backend.compat import device_module

_PREFIX = "tpu_"


def save_chip_states(path: Path) -> None:
    """Write every chip's default-generator state to `path`."""
    torch.save(device_module.get_rng_state_all(), path)


def restore_chip_states(path: Path) -> None:
    """Set the chips' default generators from `path`, when the checkpoint has it."""
    if path.is_file():
        device_module.set_rng_state_all(torch.load(path, weights_only=True))


def _accelerate_file(directory: Any, rng_state_name: str, process_index: int) -> Path:
    return Path(directory) / f"{_PREFIX}{rng_state_name}_{process_index}.pkl"


def saving_chip_states(save_accelerator_state: Callable[..., Path], rng_state_name: str) -> Callable[..., Path]:
    """accelerate's `save_accelerator_state`, which then saves the chips' states next to its RNG file."""
    signature = inspect.signature(save_accelerator_state)

    @functools.wraps(save_accelerator_state)
    def wrapper(*args: Any, **kwargs: Any) -> Path:
        output_dir = save_accelerator_state(*args, **kwargs)
        process_index = signature.bind(*args, **kwargs).arguments["process_index"]
        save_chip_states(_accelerate_file(output_dir, rng_state_name, process_index))
        return output_dir

    return wrapper


def restoring_chip_states(load_accelerator_state: Callable[..., dict], rng_state_name: str) -> Callable[..., dict]:
    """accelerate's `load_accelerator_state`, which then restores the chips' states saved next to its RNG file."""
    signature = inspect.signature(load_accelerator_state)

    @functools.wraps(load_accelerator_state)
    def wrapper(*args: Any, **kwargs: Any) -> dict:
        override_attributes = load_accelerator_state(*args, **kwargs)
        arguments = signature.bind(*args, **kwargs).arguments
        restore_chip_states(_accelerate_file(arguments["input_dir"], rng_state_name, arguments["process_index"]))
        return override_attributes

    return wrapper


def _trainer_file(trainer: Any, directory: str) -> Path:
    """Named as the Trainer names its `rng_state.pth` (one per process in a distributed run)."""
    arguments = trainer.args
    name = "rng_state.pth" if arguments.world_size <= 1 else f"rng_state_{arguments.process_index}.pth"
    return Path(directory) / f"{_PREFIX}{name}"


def adapt_trainer(trainer_class: type) -> None:
    """Make `trainer_class`'s checkpoints (and its subclasses') save and restore the chips' states."""
    save_rng_state = trainer_class._save_rng_state  # type: ignore[attr-defined]
    load_rng_state = trainer_class._load_rng_state  # type: ignore[attr-defined]

    @functools.wraps(save_rng_state)
    def _save_rng_state(self: Any, output_dir: str) -> None:
        save_rng_state(self, output_dir)
        save_chip_states(_trainer_file(self, output_dir))

    @functools.wraps(load_rng_state)
    def _load_rng_state(self: Any, checkpoint: str | None) -> None:
        load_rng_state(self, checkpoint)
        if checkpoint is not None:
            restore_chip_states(_trainer_file(self, checkpoint))

    trainer_class._save_rng_state = _save_rng_state  # type: ignore[attr-defined]
    trainer_class._load_rng_state = _load_rng_state  # type: ignore[attr-defined]
