"""A run that ended in DTensor's "Sharding propagation failed" error: the op, its operands' shapes and placements read
from the error, and, for a matrix product whose inputs disagree on the reduction dim by the mesh's size, what that
means. An input split on its last dim whose global width is the weight's times the mesh size was whole on each rank
and read as one rank's piece: a `RowwiseParallel` entry (its `input_layouts` default to `Shard(-1)`) fed a tensor
that no `ColwiseParallel` entry split, as a plan with the two in the wrong order does. Cost: none measured; the run
stopped there.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding
from tputrace.analysis.memory_oom import failing_frame
from tputrace.analysis.sharding_common import NAME, Collected

# the mesh's sizes, named (`(dp=2, tp=2)`, a mesh made with mesh_dim_names) or not (`(2, 2)`, `(2,)`)
_FAILED = re.compile(r"Sharding propagation failed for ([\w.]+)\((.*)\) on DeviceMesh\(\(((?:\w+=)?\d+(?:, *(?:\w+=)?\d+)*,?)\)")
_SPEC = re.compile(r"Spec\((\w+)\[([\d, ]*)\]\(([^()]*(?:\([^()]*\)[^()]*)*)\)\)")
_PRODUCT_DIMS = re.compile(r"same reduction dim, but got \[([\d, ]+)\] X \[([\d, ]+)\]|shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
_PLACEMENT = re.compile(r"S\((-?\d+)\)|R|P(?:\([^()]*\))?")


@dataclass(frozen=True)
class _Operand:
    dtype: str
    shape: tuple[int, ...]
    placements: tuple[str, ...]  # Shard(1), Replicate(), Partial(), one per mesh dim


def propagation_failures(context: AnalysisContext, out: Collected) -> None:
    """A critical finding at the user's line of a rank's run that ended in DTensor's sharding propagation error."""
    runs = sorted(context.trace.runs, key=lambda run: (run.rank != context.rank, run.rank))
    failed = next((run for run in runs if "Sharding propagation failed" in (run.error or "")), None)
    if failed is None or failed.error is None:
        return
    found = _FAILED.search(failed.error)
    if found is None:
        return
    op, mesh_sizes = found.group(1), [int(size.rpartition("=")[2]) for size in found.group(3).replace(" ", "").split(",") if size]
    operands = [_operand(match) for match in _SPEC.finditer(found.group(2))]
    described = ", ".join(f"({','.join(map(str, operand.shape))}) as {','.join(operand.placements)}" for operand in operands)
    where = failing_frame(failed.error, failed.script)
    at = f"{os.path.basename(where[0])}:{where[1]}" if where else "its line"
    reason = next((line.strip() for line in failed.error.splitlines() if line.startswith("RuntimeError")), "")
    mesh_size = math.prod(mesh_sizes) if mesh_sizes else 1
    whole = _whole_input_read_as_split(failed.error, operands, mesh_size)
    piece = _piece_read_as_whole(failed.error, operands, mesh_size) if whole is None else None
    explanation = (f"Rank {failed.rank} stopped at {at}: DTensor found no sharding for {op} with operands {described} "
                   f"({reason.removeprefix('RuntimeError: ').rstrip('.')}).")
    if whole is not None:
        width, local = whole
        explanation += (f" The input split on its last dim is {width} wide in all, {width // local} times the {local} inputs of the "
                        f"weight: each rank held the whole input, {local} wide, and the plan entry read it as its piece of a wider one.")
        suggestion = ("The layer is row-parallel (`RowwiseParallel`, whose `input_layouts` default to Shard(-1)) but its input is "
                      "whole on every rank: put a `ColwiseParallel()` entry on the layer before it, whose output is that split "
                      "input (column-parallel first, row-parallel second, as in an MLP's up and down projections), or give this "
                      "entry `input_layouts=Replicate()`.")
    elif piece is not None:
        width, local = piece
        explanation += (f" The input read as Replicate() is {width} wide, 1/{local // width} of the {local} inputs of the weight: "
                        "each rank held its piece of an input split on its last dim (a ColwiseParallel output, handed on as a "
                        "local tensor), and the plan entry read that piece as the whole input.")
        suggestion = ("The layer before hands on its output split on the last dim (`ColwiseParallel()`), and this entry reads its "
                      "input as whole (`input_layouts=Replicate()`, or a column-parallel entry with that input layout): make this "
                      "layer `RowwiseParallel()`, whose input is that split (column-parallel first, row-parallel second, as in an "
                      "MLP's up and down projections), or give the entry before it `output_layouts=Replicate()`, which gathers "
                      "its output every step.")
    else:
        suggestion = ("Give the operands placements that pair for this op (the plan entries' input_layouts and output_layouts, "
                      "or distribute_tensor's placements), or redistribute one of them before the op.")
    out.findings.append(Finding(
        analyzer=NAME,
        severity="critical",
        title=f"DTensor found no sharding for {op} at {at}: " + (
            "a row-parallel layer got a whole input read as split" if whole is not None else
            "a split input read as whole" if piece is not None else f"operands {described}"),
        explanation=explanation,
        suggestion=suggestion,
        cost_total_ns=0.0,
        cost_per_step_ns=0.0,
        file=where[0] if where else None,
        line=where[1] if where else None,
    ))


def _operand(match: re.Match[str]) -> _Operand:
    sizes = tuple(int(size) for size in match.group(2).replace(" ", "").split(",") if size)
    return _Operand(match.group(1), sizes, tuple(_placement(part) for part in _PLACEMENT.finditer(match.group(3))))


def _placement(part: re.Match[str]) -> str:
    if part.group(1) is not None:
        return f"Shard({part.group(1)})"
    return "Replicate()" if part.group(0) == "R" else "Partial()"


def _product_widths(error: str) -> tuple[int, int] | None:
    """(the input's last dim, the weight's first) of the failed product in the error's message."""
    dims = _PRODUCT_DIMS.search(error)
    if dims is None:
        return None
    if dims.group(1) is not None:
        left, right = [int(size) for size in dims.group(1).split(",")], [int(size) for size in dims.group(2).split(",")]
        return left[-1], right[0]
    return int(dims.group(4)), int(dims.group(5))


def _piece_read_as_whole(error: str, operands: list[_Operand], mesh_size: int) -> tuple[int, int] | None:
    """(the input's width, the weight's) for a product whose replicated input is 1/`mesh_size` as wide as the weight
    takes: one rank's piece of a split input read as the whole; None otherwise."""
    widths = _product_widths(error)
    if widths is None or mesh_size < 2:
        return None
    width, local = widths
    replicated = [operand for operand in operands if operand.shape and operand.shape[-1] == width
                  and operand.placements and all(placement == "Replicate()" for placement in operand.placements)]
    return (width, local) if replicated and width * mesh_size == local else None


def _whole_input_read_as_split(error: str, operands: list[_Operand], mesh_size: int) -> tuple[int, int] | None:
    """(the input's global width, the weight's) for a product whose input is split on its last dim and `mesh_size`
    times wider than the weight takes; None otherwise."""
    widths = _product_widths(error)
    if widths is None or mesh_size < 2:
        return None
    width, local = widths
    split_inputs = [operand for operand in operands if operand.shape and operand.shape[-1] == width
                    and (f"Shard({len(operand.shape) - 1})" in operand.placements or "Shard(-1)" in operand.placements)]
    return (width, local) if split_inputs and width == local * mesh_size else None
