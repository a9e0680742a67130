"""Scripts that failed or read wrong before: a recommender whose `nn.Embedding(sparse=True)` trains with
`SparseAdam` (it raised: the tpu device holds the sparse gradient dense, which SparseAdam refused); a loss compiled
with `fullgraph=True` that branches on its value (Dynamo raised, and the report had no finding); a mixture of
experts in strict mode (the backward's views and products at `loss.backward()`, sized by the forward's mask counts,
were a second storm advising bucketing); a GradScaler under bfloat16 autocast that unscales before clipping (its read
at `scaler.step` was told to accumulate the loss)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_fresh_scripts import MARKER, _run
from test_fresh_scripts6 import MIXTURE_OF_EXPERTS

from tputrace.analysis import Report, analyze_path

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

SPARSE_EMBEDDING = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    V, D = 1000, 32


    class Recommender(nn.Module):
        def __init__(self):
            super().__init__()
            self.items = nn.Embedding(V, D, sparse=True)
            self.head = nn.Linear(D, 1)

        def forward(self, ids):
            return self.head(self.items(ids).mean(1)).squeeze(-1)  {marker}


    model = Recommender().to("tpu")
    sparse_opt = torch.optim.SparseAdam(list(model.items.parameters()), lr=1e-2)
    dense_opt = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    for step in range(4):
        ids = torch.randint(0, V, (16, 8), device="tpu")
        y = torch.randn(16, device="tpu")
        loss = nn.functional.mse_loss(model(ids), y)
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
    print(loss.item())
'''


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_a_sparse_embedding_trained_with_sparse_adam_runs_and_is_told_to_be_dense(tmp_path: Path, mode: str) -> None:
    """The run trains (SparseAdam updates the looked-up rows of the dense gradient), and one info finding at the
    embedding's lookup names the table and tells a TPU port to use `sparse=False` with a dense optimizer."""
    report, script, line = _run(tmp_path, f"sparse_embedding_{mode}", SPARSE_EMBEDDING, ("--mode", mode))
    (sparse,) = [finding for finding in report.findings if "sparse=True" in finding.title]
    assert (sparse.file, sparse.line, sparse.module) == (str(script), line, "Recommender.items"), sparse.title
    assert "f32[1000,32]" in sparse.title and sparse.severity == "info"
    assert "`sparse=False`" in sparse.suggestion and "`SparseAdam`" in sparse.suggestion


FULLGRAPH_BRANCH = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)


    @torch.compile(fullgraph=True, backend="tpu")
    def train_loss(x, y):
        loss = nn.functional.mse_loss(model(x), y)
        {branch}
        return loss


    for step in range(4):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randn(16, 1, device="tpu")
        loss = train_loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''
BRANCH_ON_THE_VALUE = "if loss > 1.0:  {marker}\n            loss = loss.clamp(max=1.0)"
BRANCHLESS = "loss = torch.where(loss > 1.0, loss.clamp(max=1.0), loss)  {marker}"


def _run_raising(tmp_path: Path, name: str, source: str) -> tuple[Report, Path, int]:
    """`tputrace run` of a script that raises: it exits 1, and its trace keeps what ran and the exception."""
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source.format(marker=MARKER)))
    line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if MARKER in text)
    trace = tmp_path / f"{name}.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace), str(script)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 1, completed.stderr[-3000:]
    return analyze_path(trace), script, line


def test_a_fullgraph_function_branching_on_a_value_is_the_raised_lines_finding(tmp_path: Path) -> None:
    """Dynamo raises on the `if` (a graph break, an error under `fullgraph=True`) and the run stops: the report's
    one finding is critical, at the `if` Dynamo names (not the call's line), with Dynamo's reason, and tells to
    choose with `torch.where` or `torch.cond`, or to drop `fullgraph=True`."""
    report, script, line = _run_raising(tmp_path, "fullgraph_branch", FULLGRAPH_BRANCH.replace("{branch}", BRANCH_ON_THE_VALUE))
    (raised,) = [finding for finding in report.findings if finding.severity == "critical"]
    assert (raised.file, raised.line) == (str(script), line), raised.title
    assert raised.title.startswith(f"torch.compile(fullgraph=True) raised at {script.name}:{line}: Data-dependent branching")
    assert "`torch.where(condition, a, b)`" in raised.suggestion and "`torch.cond(" in raised.suggestion
    assert "`fullgraph=False`" in raised.suggestion
    assert report.findings[0] is raised
    assert [finding for finding in report.findings if "raised at" in finding.title] == [raised]  # not again as caught


def test_the_same_function_choosing_with_where_compiles_and_has_no_error_finding(tmp_path: Path) -> None:
    """The branch written as `torch.where`, as the finding tells: the script runs, and no finding says it raised."""
    report, _, _ = _run(tmp_path, "fullgraph_where", FULLGRAPH_BRANCH.replace("{branch}", BRANCHLESS))
    assert not [finding.title for finding in report.findings if "raised" in finding.title or finding.severity == "critical"]


def _compile_error_text(function: object, *args: object) -> str:
    """The formatted exception of compiling `function` with `fullgraph=True` (real Dynamo, on the CPU)."""
    import traceback

    import torch

    torch._dynamo.reset()
    try:
        torch.compile(function, fullgraph=True, backend="eager")(*args)
    except Exception:  # noqa: BLE001 - the text is what is tested
        return traceback.format_exc()
    raise AssertionError("compiling did not raise")


def _prints(x: object) -> object:
    print("loss", x.sum())  # type: ignore[attr-defined]
    return x


def _wrong_shapes(x: object) -> object:
    import torch

    return x @ torch.ones(3, 3)  # type: ignore[operator]


def test_dynamos_other_errors_are_read_with_their_own_fix() -> None:
    """A print under `fullgraph=True` is a graph break whose fix is to print outside; a shape error found on fake
    tensors is no graph break (dropping fullgraph would not help): each at the user's line, not torch's."""
    import torch

    from tputrace.analysis.compile_errors import compile_error_suggestion, parse_compile_error

    printed = parse_compile_error(_compile_error_text(_prints, torch.randn(4, 2)))
    assert printed is not None and printed.graph_break and printed.user_line is not None
    assert (printed.user_line.file, printed.user_line.function) == (__file__, "_prints")
    assert "out of the compiled function" in compile_error_suggestion(printed, "here")
    shapes = parse_compile_error(_compile_error_text(_wrong_shapes, torch.randn(4, 2)))
    assert shapes is not None and not shapes.graph_break and shapes.kind.endswith("TorchRuntimeError")
    assert shapes.user_line is not None and shapes.user_line.function == "_wrong_shapes"
    assert "fake tensors" in compile_error_suggestion(shapes, "here") and "fullgraph" not in compile_error_suggestion(shapes, "here")
    assert parse_compile_error("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nValueError: no") is None


def test_a_mixture_of_experts_backward_sized_by_the_mask_counts_is_in_the_masks_storm(tmp_path: Path) -> None:
    """Strict mode compiles `loss.backward()`'s views and matrix products once per expert's token count as well:
    their sizes are the counts the forward's `x[rows]` chose, step for step, so they are programs of that one storm
    at the mask's line, and no storm at the backward's line tells to bucket them."""
    report, script, line = _run(tmp_path, "moe_backward_strict", MIXTURE_OF_EXPERTS, ("--mode", "strict"))
    storms = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    assert [(storm.file, storm.line) for storm in storms] == [(str(script), line)], [storm.title for storm in storms]
    assert "count of a boolean mask" in storms[0].title
    assert any(evidence.text.startswith("view: ") for evidence in storms[0].evidence), [e.text for e in storms[0].evidence]


UNSCALED_BEFORE_CLIPPING = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("tpu")
    for step in range(5):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randint(0, 10, (16,), device="tpu")
        with torch.autocast("tpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)  {marker}
        scaler.update()
    print(loss.item())
'''


def test_a_grad_scalers_read_after_an_explicit_unscale_is_named_and_told_needless_with_bfloat16(tmp_path: Path) -> None:
    """With `scaler.unscale_(opt)` before clipping, the inf check runs at the unscale's line and `scaler.step(opt)`
    only reads it: the read at the step's line is still GradScaler's, and, the autocast being bfloat16 already, the
    fix is to drop the scaler (not to accumulate a loss); the scaler's `update()`, pending into the next step's graph,
    is told the same."""
    report, script, line = _run(tmp_path, "unscaled_before_clipping", UNSCALED_BEFORE_CLIPPING)
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "`torch.amp.GradScaler.step` reading whether the scaled gradients overflowed" in read.explanation
    assert read.suggestion.startswith("The script autocasts to `torch.bfloat16` already"), read.suggestion
    tails = [finding for finding in report.findings if finding.analyzer == "step_tail"]
    assert tails and all("`GradScaler.update()`" in tail.suggestion for tail in tails), [tail.title for tail in tails]
