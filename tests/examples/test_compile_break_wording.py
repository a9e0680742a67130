"""torch.compile findings worded by what happened, on scripts as users write them: a graph break inside a helper
module's function or a library's names its file and line and the script's line that reached it; a compiled
optimizer step is told as the step compiling on its own or falling out of the graph, not as torch's wrapper that
"runs in Python"; ints that compile a graph again at every value are each advised by what they are."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

LAYERS = '''
    import torch


    def gated(h):
        if h.mean() > 0:
            return h * 0.5
        return h


    def logged(h):
        out = h.tanh()
        print("activations", out.std())
        return out
'''

TRAIN_WITH_HELPERS = '''
    import torch
    import tputrace.backend  # noqa: F401
    from layers import gated, logged


    def forward(x, w):
        h = x @ w
        noise = torch.distributions.Uniform(h - 1, h + 1, validate_args=True)
        h = gated(h)
        h = logged(h)
        return h.sum() + noise.mean.sum()


    compiled = torch.compile(forward, backend="tpu")
    x, w = torch.randn(4, 6, device="tpu"), torch.randn(6, 6, device="tpu")
    for _ in range(2):
        compiled(x, w).cpu()
'''


def test_breaks_in_a_helper_module_and_a_library_name_the_scripts_line_that_reached_them(tmp_path: Path) -> None:
    (tmp_path / "layers.py").write_text(textwrap.dedent(LAYERS))
    script = tmp_path / "train_helpers.py"
    script.write_text(textwrap.dedent(TRAIN_WITH_HELPERS))
    report = record(script, tmp_path / "helpers.tptrace", [])
    titles = [finding.title for finding in report.findings if finding.analyzer == "graph_breaks"]
    assert any(title.startswith("Graph break at layers.py:6 in gated(), reached from train_helpers.py:10 in forward()")
               for title in titles), titles
    assert any(title.startswith("Graph break at layers.py:13 in logged(), reached from train_helpers.py:11 in forward()")
               for title in titles), titles
    (library,) = [title for title in titles if "torch/distributions/" in title]
    assert "reached from train_helpers.py:9 in forward()" in library, library


COMPILED_STEPS = '''
    import torch
    import tputrace.backend  # noqa: F401

    net = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 3)).to("tpu")
    inputs, targets = torch.randn(6, 12, device="tpu"), torch.randn(6, 3, device="tpu")
    momentum = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)


    @torch.compile(backend="tpu")
    def update():
        loss = torch.nn.functional.mse_loss(net(inputs), targets)
        loss.backward()
        momentum.step()
        momentum.zero_grad()
        return loss


    for _ in range(3):
        update()

    quasi_newton = torch.optim.LBFGS(net.parameters(), lr=0.1, max_iter=2)


    def closure():
        quasi_newton.zero_grad()
        loss = torch.nn.functional.mse_loss(net(inputs), targets)
        loss.backward()
        return loss


    refine = torch.compile(quasi_newton.step, backend="tpu")
    for _ in range(2):
        refine(closure)
    print(float(closure()))
'''


def test_a_compiled_optimizer_step_is_told_as_compiled_on_its_own_or_falling_out_of_the_graph(tmp_path: Path) -> None:
    script = tmp_path / "optimizer_steps.py"
    script.write_text(textwrap.dedent(COMPILED_STEPS))
    report = record(script, tmp_path / "steps.tptrace", [])
    findings = [finding for finding in report.findings if finding.analyzer == "graph_breaks"]
    assert not [finding.title for finding in findings if "wrapper()" in finding.title or
                "optimizer.py" in finding.title and "runs in Python" in finding.title]
    (own,) = [finding for finding in findings if "torch._dynamo.graph_break()" in finding.title]
    assert own.title.startswith("The optimizer step at optimizer_steps.py:14 compiles as a graph of its own (SGD.step"), \
        own.title
    assert own.suggestion.startswith("Nothing in the script causes the break")
    # LBFGS's step is not compiled (torch disables Dynamo on it) or falls out of the graph where Dynamo tries it.
    lbfgs = [finding for finding in findings if "LBFGS" in finding.title]
    assert lbfgs and all(finding.title.startswith("The optimizer step at optimizer_steps.py:34 ") for finding in lbfgs)
    assert all("call `opt.step()` outside the compiled function" in finding.suggestion for finding in lbfgs)


CHANGING_INTS = '''
    import torch
    import tputrace.backend  # noqa: F401


    def window(frames, n_valid, global_step):
        scaled = frames * (global_step + 1)
        return scaled[:, :n_valid].mean(dim=1)


    compiled = torch.compile(window, backend="tpu")
    frames = torch.randn(3, 40, device="tpu")
    for call in range(7):
        compiled(frames, 10 + call, call).cpu()
'''


def test_each_changing_int_gets_the_advice_for_what_it_is(tmp_path: Path) -> None:
    script = tmp_path / "changing_ints.py"
    script.write_text(textwrap.dedent(CHANGING_INTS))
    report = record(script, tmp_path / "ints.tptrace", [])
    (finding,) = [finding for finding in report.findings if "compiled again for each value of the ints" in finding.title]
    assert "`n_valid`" in finding.title and "`global_step`" in finding.title, finding.title
    advice = finding.suggestion
    assert "few fixed values" not in advice
    assert "`n_valid` sets a size in the graph" in advice and "pad to a few fixed lengths" in advice, advice
    assert "`global_step` counts calls (a step counter)" in advice, advice
