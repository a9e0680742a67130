"""ATen lowerings, one module per op family; `register_all()` imports them into the registry."""

from __future__ import annotations

import importlib

FAMILIES = (
    "pointwise",
    "comparison",
    "special",
    "beta_grads",
    "reduction",
    "sorting",
    "views",
    "shape",
    "indexing",
    "embedding_bags",
    "factories",
    "random",
    "activations",
    "nn",
    "recurrent",
    "normalization",
    "conv",
    "pooling",
    "resample",
    "linalg",
    "qr",
    "fft",
    "foreach",
    "histogram",
    "amp",
    "optimizers",
    "prims",
)

_registered = False


def register_all() -> None:
    """Import every op family once; each module registers its lowerings with `registry.lowers`."""
    global _registered
    if _registered:
        return
    for family in FAMILIES:
        try:
            importlib.import_module(f"{__name__}.{family}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{family}":
                raise
    _registered = True
