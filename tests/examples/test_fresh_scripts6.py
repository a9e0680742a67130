"""Scripts whose diagnoses read wrong before: an EMA of the weights updated after `optimizer.step()` (its work runs
at the start of the next step's graph, so the second step compiles the training graph again, which no finding
named), the same loop with `tputrace.step()` at the end of each iteration (clean), and a mixture-of-experts layer
routing tokens by boolean masks in strict mode (autograd's `grad[mask]` in the backward has the forward's lengths:
the storm is the forward's line, not `loss.backward()`'s)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

EMA_AFTER_THE_STEP = '''
    import copy
    import torch
    {import_tputrace}
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 10)).to("tpu")
    ema = copy.deepcopy(model)
    for p in ema.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(4):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randint(0, 10, (16,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), model.parameters()):
                pe.mul_(0.99).add_(p, alpha=0.01)  {marker}
        {step_call}
    print(loss.item())
'''

MIXTURE_OF_EXPERTS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    D, E, K = 32, 4, 2


    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(D, E)
            self.experts = nn.ModuleList(nn.Sequential(nn.Linear(D, 64), nn.GELU(), nn.Linear(64, D)) for _ in range(E))

        def forward(self, x):
            weights, chosen = self.gate(x).softmax(-1).topk(K, dim=-1)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                hit = chosen == e
                rows = hit.any(-1)
                w = (weights * hit).sum(-1, keepdim=True)
                out[rows] += w[rows] * expert(x[rows])  {marker}
            return out


    model = nn.Sequential(nn.Linear(D, D), MoE(), nn.Linear(D, 10)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(5):
        x = torch.randn(128, D, device="tpu")
        y = torch.randint(0, 10, (128,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_an_ema_updated_after_the_step_is_named_as_the_next_steps_graph_compiling_again(tmp_path: Path) -> None:
    """The EMA's update after `optimizer.step()` is pending when the next step begins, so it runs at the start of
    that step's graph, which the first step's graph lacked: one recompile in step 1, named at the EMA's line, with
    `tputrace.step()` as the fix and the recompile's time as the cost."""
    source = EMA_AFTER_THE_STEP.replace("{import_tputrace}", "").replace("{step_call}", "")
    report, script, line = _run(tmp_path, "ema_after_the_step", source)
    (tail,) = [finding for finding in report.findings if finding.analyzer == "step_tail"]
    assert (tail.file, tail.line) == (str(script), line), tail.title
    assert tail.title.startswith(f"Work at {script.name}:{line} after the step's last flush ran in the next step's graph"), tail.title
    assert "`tputrace.step()`" in tail.suggestion
    assert tail.cost_total_ns > 0 and tail.cost_per_step_ns is None
    assert not [finding for finding in report.findings if finding.analyzer == "set_up_work"]


def test_an_ema_run_in_its_own_step_reads_clean(tmp_path: Path) -> None:
    """With `tputrace.step()` at the end of each iteration, as the finding suggests, the EMA runs as a program of
    its own every step: no step compiles the training graph again."""
    source = EMA_AFTER_THE_STEP.replace("{import_tputrace}", "import tputrace").replace("{step_call}", "tputrace.step()")
    report, _, _ = _run(tmp_path, "ema_own_step", source)
    assert not [finding.title for finding in report.findings if finding.analyzer in ("step_tail", "set_up_work", "recompiles")]


def test_a_mixture_of_experts_in_strict_mode_is_one_storm_at_the_forwards_mask(tmp_path: Path) -> None:
    """Strict mode compiles the backward's ops per expert's token count too, and the backward indexes the gradient
    by the same masks at `loss.backward()`'s line: the count is chosen at the forward's `x[rows]`, where the storm is
    (one storm, not a second one at the backward's line)."""
    report, script, line = _run(tmp_path, "moe_strict", MIXTURE_OF_EXPERTS, ("--mode", "strict"))
    storms = [finding for finding in report.findings if "count of a boolean mask" in finding.title]
    assert [(storm.file, storm.line) for storm in storms] == [(str(script), line)], [storm.title for storm in storms]


TRUNCATED_BPTT = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    V, D, B, T = 50, 16, 4, 8


    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.rnn = nn.LSTM(D, D, batch_first=True)
            self.out = nn.Linear(D, V)

        def forward(self, x, state):
            h, state = self.rnn(self.emb(x), state)
            return self.out(h), state


    model = LM().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    stream = torch.randint(0, V, (B, T * 6 + 1), device="tpu")
    torch.tpu.synchronize()
    state = None
    for i in range(6):
        {window}
        if state is not None:
            state = tuple(s.detach() for s in state)
        logits, state = model(x, state)
        loss = nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''
SLICED_WINDOW = "x, y = stream[:, i * T:(i + 1) * T], stream[:, i * T + 1:(i + 1) * T + 1]  {marker}"
SELECTED_WINDOW = ("positions = torch.arange(T, device=\"tpu\") + i * T\n"
                   "        x, y = stream.index_select(1, positions), stream.index_select(1, positions + 1)  {marker}")


def test_a_window_sliced_at_a_moving_start_is_told_to_select_it_at_positions_on_the_chip(tmp_path: Path) -> None:
    """Truncated BPTT slices the next window of a token stream each step: its length stays, its start moves, and
    the start is part of the program, so the step's graph compiles per window. Bucketing a length cannot help; the
    fix is `index_select` at positions made on the chip, whose start is a program input."""
    report, _, _ = _run(tmp_path, "sliced_window", TRUNCATED_BPTT.replace("{window}", SLICED_WINDOW))
    storms = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    assert storms and "changes start" in storms[0].title, [storm.title for storm in storms]
    assert "`index_select`" in storms[0].suggestion and "bucket" not in storms[0].suggestion, storms[0].suggestion
    assert storms[0].suggestion.endswith("Then the program compiles once.")


def test_a_window_selected_at_positions_on_the_chip_compiles_once(tmp_path: Path) -> None:
    """The same loop taking each window with `index_select` at `arange(T) + i * T`, as the finding suggests: no
    recompilation storm."""
    report, _, _ = _run(tmp_path, "selected_window", TRUNCATED_BPTT.replace("{window}", SELECTED_WINDOW))
    assert not [finding.title for finding in report.findings if finding.title.startswith("Recompilation storm")]


TEN_CLASSES = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(5):
        x = torch.randn(64, 32, device="tpu")
        y = torch.randint(0, 10, (64,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y, label_smoothing=0.1)  {marker}
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_head_padded_at_its_number_of_classes_is_no_padding_finding(tmp_path: Path) -> None:
    """The head's weight gradient has the 10 classes as rows, off the 8-row tile: but the labels set that number,
    not the model, so no other size would do (and padding it by hand pads as XLA does). No finding tells to use 8."""
    report, _, _ = _run(tmp_path, "ten_classes", TEN_CLASSES)
    assert not [finding.title for finding in report.findings if finding.analyzer == "padding"]


LENGTHS_READ_IN_THE_FORWARD = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)
            self.head = nn.Linear(16, 3)

        def forward(self, x, lengths):
            h = self.proj(x)
            pooled = []
            for row, n in enumerate(lengths.tolist()):  {marker}
                pooled.append(h[row, :n].mean(0))
            return self.head(torch.stack(pooled))


    model = Pool().to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(5):
        x = torch.randn(4, 24, 16, device="tpu")
        lengths = torch.randint(4, 24, (4,), device="tpu")
        y = torch.randint(0, 3, (4,), device="tpu")
        loss = nn.functional.cross_entropy(model(x, lengths), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_slices_to_lengths_read_with_tolist_are_told_to_mask_with_the_lengths_on_the_chip(tmp_path: Path, mode: str) -> None:
    """The forward reads each row's length with `.tolist()` and slices the row to it: the graph (in strict mode, each
    op after the slice) compiles per length. Bucketing the lengths would still compile per combination of rows; the
    storm names the read's line and tells to keep the lengths on the chip and mask."""
    report, script, line = _run(tmp_path, f"lengths_read_{mode}", LENGTHS_READ_IN_THE_FORWARD,
                                ("--mode", "strict") if mode == "strict" else ())
    storms = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    assert storms and storms[0].line == line + 1, [storm.title for storm in storms]
    assert f"read from the chip at {script.name}:{line} (`.tolist()`)" in storms[0].suggestion, storms[0].suggestion
    assert "bucket" not in storms[0].suggestion
