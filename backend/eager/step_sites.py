"""What each site (a flush's trigger and line, an op at a line) produced in its last two steps: a new
program there is compared with the earlier step's to say why it recompiled. Several in one step (two
host reads on one line, `x.sum(0)` and `x.sum(1)`) are kept side by side, none a recompile of another."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")


@dataclass
class _Steps(Generic[Item]):
    step: int
    items: list[Item] = field(default_factory=list)
    earlier: list[Item] = field(default_factory=list)  # the site's items of its previous step


class StepSites(Generic[Item]):
    """Per site, the items of its last step and of the step before that."""

    def __init__(self) -> None:
        self._sites: dict[Hashable, _Steps[Item]] = {}

    def clear(self) -> None:
        self._sites.clear()

    def remember(self, site: Hashable, step: int, item: Item) -> None:
        """`site` produced `item` in `step`."""
        steps = self._sites.get(site)
        if steps is None:
            self._sites[site] = _Steps(step, [item])
        elif steps.step == step:
            steps.items.append(item)
        else:
            self._sites[site] = _Steps(step, [item], steps.items)

    def earlier(self, site: Hashable, step: int) -> list[Item]:
        """The items `site` produced in its last step before `step` (empty: none)."""
        steps = self._sites.get(site)
        if steps is None:
            return []
        return steps.earlier if steps.step == step else steps.items

    def current(self, site: Hashable, step: int) -> list[Item]:
        """The items `site` produced in `step` so far (empty: none)."""
        steps = self._sites.get(site)
        return steps.items if steps is not None and steps.step == step else []
