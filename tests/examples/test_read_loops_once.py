"""Reads of values one at a time, run under `tputrace run` in a subprocess: a `for` loop over several lines reading a
list's tensors or a tensor's rows, and a comprehension over a dict's items, were not told to read them once; a line
reading two values at each evaluation was told to sum each batch's value; fragmented fusion named a `float(...)` read,
or an element read, as `.item()` every N steps."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

from tputrace.analysis import Report
from tputrace.analysis.findings import Finding

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

# Each step reads a list's tensors, a dict's values and a tensor's rows one at a time, and the training loop's own
# batch once (a loop variable read once a step, no element loop).
ELEMENT_LOOPS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(32, 64, device="tpu") for _ in range(5)]
    history = []
    for batch in batches:
        logits = model(batch)
        loss = logits.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scale = batch.abs().mean().item()  # batch read
        pieces = [loss.detach() * k for k in range(1, 4)]
        total = 0.0
        for piece in pieces:
            total += piece.item()  # summed
        stats = {"loss": loss.detach(), "peak": logits.max(), "low": logits.min()}
        logged = {key: stat.item() for key, stat in stats.items()}  # dict values
        centres = logits.mean(1)[:6]
        kept = []
        for centre in centres:
            kept.append(float(centre))  # rows
        history.append((scale, total, logged, kept))
'''

# An evaluation every 2 steps whose line prints two values it reads.
EVALUATION_PRINT = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        x = torch.randn(32, 64, device="tpu")
        y = torch.randint(0, 8, (32,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 2 == 1:
            with torch.no_grad():
                held_x = torch.randn(64, 64, device="tpu")
                held_y = torch.randint(0, 8, (64,), device="tpu")
                out = model(held_x)
                held_loss = nn.functional.cross_entropy(out, held_y)
                held_acc = (out.argmax(-1) == held_y).float().mean()
            print(held_loss.item(), held_acc.item())  # evaluation
'''

# Three `float(...)` reads between layers cut each step.
NUMBER_CUTS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        x = torch.randn(32, 64, device="tpu")
        h = model[0](x)
        peak = float(h.abs().max())
        h = model[1](h / peak)
        gate = float(h.mean())
        out = model[2](h * gate)
        loss = out.pow(2).mean()
        logged = float(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def _run(tmp_path: Path, name: str, source: str) -> tuple[Report, dict[str, int]]:
    """The report of `source` run as `name`.py, and the line of each `# marker` comment by its text."""
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source))
    marks = {text.split("# ", 1)[1]: number for number, text in enumerate(script.read_text().splitlines(), 1)
             if "  # " in text}
    return record(script, tmp_path / f"{name}.tptrace", []), marks


def _at(report: Report, analyzer: str, line: int) -> Finding:
    found = [finding for finding in report.findings if finding.analyzer == analyzer and finding.line == line]
    assert len(found) == 1, [f"{finding.analyzer}:{finding.line}: {finding.title}" for finding in report.findings]
    return found[0]


def test_loops_reading_elements_one_at_a_time_are_told_to_read_them_once(tmp_path: Path) -> None:
    report, marks = _run(tmp_path, "element_loops", ELEMENT_LOOPS)
    summed = _at(report, "syncs", marks["summed"]).suggestion
    assert "`torch.stack(pieces).sum().item()`" in summed and "one at a time" in summed, summed
    values = _at(report, "syncs", marks["dict values"]).suggestion
    assert "`values = torch.stack(list(stats.values())).tolist()`" in values, values
    assert "`dict(zip(stats, values))`" in values, values
    rows = _at(report, "syncs", marks["rows"]).suggestion
    assert "`centres.tolist()`" in rows and "`for centre in centres:`" in rows, rows
    assert "one at a time" not in _at(report, "syncs", marks["batch read"]).suggestion
    # the rows' reads cut each step most: fusion's fix for them is the same one read, not `.item()` every N steps
    fusion = _at(report, "fusion", marks["rows"]).suggestion
    assert "`centres.tolist()`" in fusion and "every N steps, not between layers" not in fusion, fusion


def test_several_values_read_at_each_evaluation_are_told_to_be_read_together(tmp_path: Path) -> None:
    report, marks = _run(tmp_path, "evaluation_print", EVALUATION_PRINT)
    suggestion = _at(report, "syncs", marks["evaluation"]).suggestion
    assert "`torch.stack([held_loss, held_acc]).tolist()`" in suggestion, suggestion
    assert "total += loss" not in suggestion and "instead of 2" in suggestion, suggestion


def test_fusion_names_a_number_read_as_the_line_spells_it(tmp_path: Path) -> None:
    report, _ = _run(tmp_path, "number_cuts", NUMBER_CUTS)
    (fusion,) = [finding for finding in report.findings if finding.analyzer == "fusion"]
    assert "read values with `float(...)` every N steps" in fusion.suggestion, fusion.suggestion
    assert "`.item()`" not in fusion.suggestion, fusion.suggestion
