"""Buffer lifetimes recorded on a real run (tests/fixtures/transformer_train.py), strict and DeferAndFuse."""

from __future__ import annotations

from pathlib import Path

import pytest

import tputrace
from tputrace.derived.memory_timeline import buffer_lifetimes, peak_of

MODES = ("strict", "defer")
PARAMETERS = 27  # tensors in TinyTransformer's parameters()


@pytest.mark.parametrize("mode", MODES)
def test_every_parameter_gradient_and_optimizer_state_is_labelled(transformer_traces: dict[str, Path], mode: str) -> None:
    with tputrace.open(transformer_traces[mode]) as trace:
        counts = dict(trace.sql("SELECT kind, COUNT(*) FROM buffers GROUP BY kind"))
    assert counts["parameter"] == PARAMETERS
    assert counts["gradient"] == 3 * PARAMETERS  # one set per step, freed by zero_grad
    assert counts["optimizer_state"] == 2 * PARAMETERS  # AdamW's exp_avg and exp_avg_sq


@pytest.mark.parametrize("mode", MODES)
def test_live_bytes_from_lifetimes_peak_at_the_measured_peak(transformer_traces: dict[str, Path], mode: str) -> None:
    with tputrace.open(transformer_traces[mode]) as trace:
        buffers = buffer_lifetimes(trace, 0)
        measured = trace.sql("SELECT MAX(peak_bytes) FROM memory WHERE chip = 0")[0][0]
    peak = peak_of(buffers, 0)
    assert peak is not None
    assert peak.bytes == measured
    assert sum(buffer.bytes for buffer in peak.live) == measured


# Under DeferAndFuse a forward's intermediates live inside the fused program; its outputs (logits) are buffers.
@pytest.mark.parametrize(("mode", "module"), [("strict", "TinyTransformer.blocks.0.mlp.0"), ("defer", "TinyTransformer.head")])
def test_buffers_carry_the_line_and_module_that_made_them(transformer_traces: dict[str, Path], mode: str, module: str) -> None:
    with tputrace.open(transformer_traces[mode]) as trace:
        made = {(record.source.file.rsplit("/", 1)[-1] if record.source else None, record.module)
                for record in trace.records("buffers") if record.kind not in ("parameter", "optimizer_state")}
        shapes = {record.shape for record in trace.records("buffers", where="kind = 'parameter'")}
    assert ("transformer_train.py", module) in made
    assert "256,64" in shapes  # the embedding's weight


def test_strict_activations_are_made_in_forward_and_freed_in_backward(transformer_traces: dict[str, Path]) -> None:
    with tputrace.open(transformer_traces["strict"]) as trace:
        activations = list(trace.records("buffers", where="kind = 'activation'"))
    assert activations
    assert all(record.module is not None and record.free_ns is not None for record in activations)
    assert {"TinyTransformer.blocks.0.mlp.1", "TinyTransformer.blocks.1.attn"} <= {record.module for record in activations}


@pytest.mark.parametrize("mode", MODES)
def test_parameters_gradients_and_optimizer_state_belong_to_their_module(transformer_traces: dict[str, Path], mode: str) -> None:
    owners: dict[tuple[str, str], set[str | None]] = {}
    with tputrace.open(transformer_traces[mode]) as trace:
        for record in trace.records("buffers", where="kind IN ('parameter', 'gradient', 'optimizer_state')"):
            owners.setdefault((record.kind, record.shape), set()).add(record.module)
    for kind in ("parameter", "gradient", "optimizer_state"):
        assert {"TinyTransformer.embed", "TinyTransformer.head"} <= owners[(kind, "256,64")], kind  # embedding and head weights
    assert all(None not in modules for modules in owners.values())
