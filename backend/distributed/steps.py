"""Step boundaries for optimizers over DTensor parameters (FSDP2, tensor parallel).

The backend marks a step after `optimizer.step()` when the optimizer holds tpu tensors; parameters
sharded by FSDP2 or DTensor are DTensors around tpu tensors, so this hook marks those steps (and
flushes deferred work there) the same way.
"""

from __future__ import annotations

from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook

from tputrace.backend.tensor import TpuTensor

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    register_optimizer_step_post_hook(_after_optimizer_step)
    _installed = True


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    from tputrace import recorder
    from tputrace.backend import hooks

    params = [param for group in optimizer.param_groups for param in group["params"]]
    if any(isinstance(param, TpuTensor) for param in params):
        return  # the backend's own hook marks this step
    if any(isinstance(getattr(param, "_local_tensor", None), TpuTensor) for param in params):
        hooks.flush_pending("step")
        recorder.optimizer_stepped()
