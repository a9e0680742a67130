"""What to do about a size that grows by the same amount at each compile: a tensor extended at each call (a KV cache
in decoding, a `torch.cat` onto a growing result) or once a step (a queue of past keys).

The fix is one allocation at the largest size, written at a moving position. Inside a torch.compile graph that
position must be a tensor on the chip: a Python int there becomes an input of Dynamo's graph (after its guard fails
once), and the tpu backend compiles one XLA program per value of it, so a slice at `pos` recompiles at every token
as the growing cache did.
"""

from __future__ import annotations

from collections.abc import Sequence

from tputrace.analysis.context import AnalysisContext, detail_object, in_list


def compiled_graph(context: AnalysisContext, compile_ids: Sequence[int]) -> bool:
    """Whether any of the compiles is a torch.compile graph's XLA program (its detail names Dynamo's compile id)."""
    if not compile_ids:
        return False
    rows = context.trace.sql(
        f"SELECT detail FROM compiles WHERE id IN {in_list(list(compile_ids))} AND kind = 'xla' AND detail IS NOT NULL",
        tuple(compile_ids),
    )
    return any(detail_object(detail).get("compile_id") is not None for (detail,) in rows)


def growing_suggestion(dim_name: str, growth: int, largest: int, *, each_step: bool = False, jax: bool = False,
                       compiled: bool = False) -> str:
    """Allocate the growing tensor once at its largest size and write into it at a moving position, in the terms of
    the capture (JAX) and of where the write runs (a torch.compile graph: the position as a tensor)."""
    grows = f"{dim_name[0].upper()}{dim_name[1:]} grows by {growth}"
    if jax:
        return (
            f"{grows} from one compile to the next: an array extended at each call (`jnp.concatenate` onto a history, "
            f"a KV cache in decoding). Allocate it once at its largest size ({largest} here, or the loop's limit) and "
            "write each call's rows into it with `jax.lax.dynamic_update_slice` (or `.at[index].set`) at a traced "
            "position, masking the part not filled yet, so the program keeps one shape."
        )
    if each_step:
        return (
            f"{grows} from one step to the next: a tensor the loop extends with `torch.cat` every step (a queue of past "
            f"keys, a memory bank, a history). Allocate it once at its largest size ({largest} here, or its limit) and "
            "write each step's rows into it at a position that moves (`queue[ptr:ptr + n] = keys`, "
            "`ptr = (ptr + n) % size`), masking the rows not filled yet (or filling them at the start, as MoCo fills "
            "its queue with random keys), so the program keeps one shape."
        )
    if compiled:
        return (
            f"{grows} from one compile to the next: a tensor extended at each call of the compiled function (a KV "
            f"cache in autoregressive decoding, a `torch.cat` onto a growing result). Allocate it once at its largest "
            f"size ({largest} here, or the loop's limit) and write each call's rows into it at positions kept as a "
            "tensor on the chip (`cache.index_copy_(1, cache_position, k)`, `cache_position` a device tensor of the "
            "call's positions, the next call's being `cache_position[-1:] + 1`), masking the part not filled yet, so "
            "the graph keeps one shape. A slice at a Python int position "
            "(`cache[:, p:p + n] = k`) would not: Dynamo makes the int an input of the graph, and the tpu backend "
            "compiles one XLA program per value of it. Hugging Face's `generate` does this with a static KV cache "
            "(`cache_implementation=\"static\"`) for the models that support one."
        )
    return (
        f"{grows} from one compile to the next: a tensor extended at each call (a KV cache in autoregressive decoding, "
        f"a `torch.cat` onto a growing result). Allocate it once at its largest size ({largest} here, or the loop's "
        "limit) and write into it (slice assignment, `index_copy_`), masking the part not filled yet, so the program "
        "keeps one shape; Hugging Face's `generate` does this with a static KV cache (`cache_implementation=\"static\"`) "
        "for the models that support one."
    )
