"""Parameter gradients against the CPU: each replayed backward of a module call also gives the CPU's gradient of
the module's own parameters for that call (from the tpu's gradients of its outputs); summed over the step's calls,
they are the CPU's reference for each parameter's `.grad`, compared with the tpu's when the optimizer steps.

A parameter is compared only when every call that used it in the step was replayed: a call past `--steps`, over
the host-copy budget or not comparable leaves its module's parameters out of that step's comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ModuleParameters:
    """One module's own parameters in a step: where it was first called, and the CPU's gradient sums."""

    module: str
    module_type: str
    step: int
    call_id: int
    path: str | None
    line: int | None
    parameters: list[torch.nn.Parameter] = field(default_factory=list)
    cpu_sums: list[torch.Tensor | None] = field(default_factory=list)
    complete: bool = True


class ParameterReferences:
    """The CPU's gradient sums of the step's parameters, by module, in the order modules were first met."""

    def __init__(self) -> None:
        self._modules: dict[int, ModuleParameters] = {}

    def own_parameters(self, module: torch.nn.Module) -> list[torch.nn.Parameter]:
        """The parameters a module holds itself (not its children's) that take a gradient."""
        return [parameter for parameter in module.parameters(recurse=False) if parameter.requires_grad]

    def _entry(self, module: torch.nn.Module, name: str, step: int, call_id: int, path: str | None,
               line: int | None) -> ModuleParameters:
        entry = self._modules.get(id(module))
        if entry is None:
            parameters = self.own_parameters(module)
            entry = ModuleParameters(name, type(module).__name__, step, call_id, path, line, parameters,
                                     [None] * len(parameters))
            self._modules[id(module)] = entry
        return entry

    def add(self, module: torch.nn.Module, name: str, step: int, call_id: int, path: str | None, line: int | None,
            cpu_gradients: list[torch.Tensor | None]) -> None:
        """Add one call's CPU gradients of `module`'s own parameters (in `own_parameters` order)."""
        entry = self._entry(module, name, step, call_id, path, line)
        for index, gradient in enumerate(cpu_gradients[: len(entry.cpu_sums)]):
            if gradient is None:
                continue
            total = entry.cpu_sums[index]
            entry.cpu_sums[index] = gradient.detach().clone() if total is None else total + gradient.detach()

    def leave_out(self, module: torch.nn.Module, name: str, step: int, call_id: int, path: str | None,
                  line: int | None) -> None:
        """A call of `module` was not replayed: its parameters cannot be compared this step."""
        if self.own_parameters(module):
            self._entry(module, name, step, call_id, path, line).complete = False

    def take(self) -> list[tuple[ModuleParameters, list[torch.Tensor], list[torch.Tensor]]]:
        """Each complete module's parameters with a gradient on the tpu: (module, the tpu's gradients on the
        host, the CPU's sums), then forget the step."""
        compared = []
        for entry in self._modules.values():
            if not entry.complete:
                continue
            pairs = [(parameter.grad, cpu) for parameter, cpu in zip(entry.parameters, entry.cpu_sums)
                     if parameter.grad is not None and cpu is not None]
            if pairs:
                compared.append((entry, [tpu.detach().cpu() for tpu, _ in pairs], [cpu for _, cpu in pairs]))
        self._modules.clear()
        return compared

    def clear(self) -> None:
        self._modules.clear()
