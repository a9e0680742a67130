"""A loop body's range named for its iteration (`TraceAnnotation(f"iteration {i}")`, `record_function(f"batch_{i}")`)
is the capture's steps, as one name repeated is: a name per iteration is still one range."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import tputrace
from tputrace.cli.main import main
from tputrace.store.records import StepRecord

JAX_NUMBERED = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    @jax.jit
    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)

    w, x = jnp.ones((64, 64)), jnp.ones((32, 64))
    step(w, x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(4):
            with jax.profiler.TraceAnnotation(f"iteration {i}"), jax.named_scope(f"body_{i}"):
                w = step(w, x)
                w.block_until_ready()
""")

TORCH_NUMBERED = textwrap.dedent("""
    import sys, torch
    from torch.profiler import profile, record_function

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    with profile() as prof:
        for i in range(5):
            with record_function(f"batch_{i}"):
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
    prof.export_chrome_trace(sys.argv[1])
""")


def _imported(tmp_path: Path, capture: Path) -> tuple[list[StepRecord], dict[str, object]]:
    output = tmp_path / "numbered.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        (source,) = json.loads(trace.meta["imported"])
        return [step for step in trace.records("steps") if step.source == "imported"], source


def test_jax_trace_annotation_named_per_iteration_is_the_steps(tmp_path: Path) -> None:
    from captures import _capture

    steps, source = _imported(tmp_path, _capture(tmp_path, "numbered.py", JAX_NUMBERED, "logdir"))
    assert [step.step for step in steps] == [1, 2, 3, 4]
    assert all(a.end_ns == b.start_ns for a, b in zip(steps, steps[1:]))
    assert (source["step_source"], source["step_range"]) == ("traceme", "iteration #")


def test_torch_record_function_named_per_iteration_is_the_steps(tmp_path: Path) -> None:
    from captures import _capture

    steps, source = _imported(tmp_path, _capture(tmp_path, "numbered.py", TORCH_NUMBERED, "numbered.json"))
    assert [step.step for step in steps] == [1, 2, 3, 4, 5]
    assert (source["step_source"], source["step_range"]) == ("user_annotation", "batch_#")


TORCH_NUMBERED_LAYERS = textwrap.dedent("""
    import sys, torch
    from torch.profiler import profile, record_function

    layers = [torch.nn.Linear(64, 64) for _ in range(3)]
    x = torch.randn(32, 64)
    with profile() as prof:
        for _ in range(4):
            h = x
            for j, layer in enumerate(layers):
                with record_function(f"layer_{j}"):
                    h = torch.relu(layer(h))
    prof.export_chrome_trace(sys.argv[1])
""")


def test_numbered_ranges_that_repeat_in_each_iteration_stay_apart(tmp_path: Path) -> None:
    """`layer_0`, `layer_1`, `layer_2` in each of 4 iterations: each name repeats, so each is its own range, and the
    steps are the 4 iterations (one layer's range taken), not the 12 layers."""
    from captures import _capture

    steps, source = _imported(tmp_path, _capture(tmp_path, "layers.py", TORCH_NUMBERED_LAYERS, "layers.json"))
    assert len(steps) == 4 and source["step_range"] in ("layer_0", "layer_1", "layer_2")
