"""Parameters an optimizer updates that no data-parallel wrapper holds, recorded at its first step.

DDP and FSDP2 keep every rank's copy of a parameter equal by summing its gradient over the ranks, which saw
different batches. A parameter that the same optimizer updates but neither wrapper holds (a module outside
every `fully_shard` group, as the embedding and head of a model whose blocks alone were wrapped) gets its own
rank's gradient only, and its copies drift apart, with no error. At each optimizer's first step its plain tpu
parameters are recorded (wrapper `none`, with the path of the module that owns them) when another of its
parameters is a data-parallel wrapper's; `tputrace.analysis.sharding_unsynced` names them.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tputrace.backend.distributed import placements, tracing

_stepped: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
_installed = False


def install() -> None:
    """Look at each optimizer's parameters at its first step (once)."""
    global _installed
    if _installed:
        return
    register_optimizer_step_pre_hook(_first_step)
    _installed = True


def _first_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if optimizer in _stepped or torch.compiler.is_compiling():
        return
    _stepped.add(optimizer)
    recorder = tracing.active_recorder()
    if recorder is not None:
        placements.record_unheld(recorder, [parameter for group in optimizer.param_groups for parameter in group["params"]])
