"""The name by which a user's repeated range is told as a loop's steps: a loop body's range named for its iteration
(`TraceAnnotation(f"step {i}")`, `record_function(f"batch_{i}")`, each name once) is one range whatever its numbers;
names that repeat themselves (`layer_0`, `layer_1` in every iteration) stay apart, each its own range."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

# JAX's, XLA's and TSL's own TraceMes: C++ scopes (`PjRtCpuClient::Compile`), JAX's calls of jitted or pmapped
# functions (`PjitFunction(step)`), its compiles and lowerings, XLA:CPU's thunks' ends (`end: dot`), and the Python
# tracer's frames (`$train.py:3 step`).
OWN_TRACEME = re.compile(r"::|^\$|^\w*Function\(|^(?:backend_compile|jax_|pjit|Pjit|Pmap|Execute|XLA |Xla|end: )")
# The runtime's own phrases and CamelCase scopes (`DevicePut`, `ParseArguments`, `Handle inputs`, `Wait for usage holds`).
_RUNTIME_TRACEME = re.compile(r"^(?:[A-Z][a-z0-9]+){2,}$|^(?:Handle|Wait for) ")


def runtime_traceme(name: str) -> bool:
    """Whether a TraceMe is JAX's, XLA's, TSL's or the runtime's own, not one the user's code opened."""
    return bool(OWN_TRACEME.search(name) or _RUNTIME_TRACEME.search(name))


_NUMBER = re.compile(r"\d+")


def range_family(name: str) -> str:
    """A range's name with each run of digits as `#` (`step 12`: `step #`)."""
    return _NUMBER.sub("#", name)


def range_keys(names: Iterable[str]) -> dict[str, str]:
    """Each name's key among the ranges of one thread: the name itself where it occurs more than once, else its
    family (`step #` for `step 0`, `step 1`, ... each met once)."""
    counts = Counter(names)
    return {name: name if count > 1 else range_family(name) for name, count in counts.items()}


def family_label(names: Iterable[str]) -> str:
    """The name that tells a key's ranges: their name where all share one (`train_step`), else the family
    (`step #` for `step 0`, `step 1`)."""
    distinct = set(names)
    only = next(iter(distinct)) if len(distinct) == 1 else None
    return only if only is not None else range_family(min(distinct))
