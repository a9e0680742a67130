"""Scripts whose reads and data-dependent sizes were reported twice, at the wrong line or at the wrong module, run under `tputrace run`
in a subprocess: a mask's count is one storm, also where the backward expands a gradient to it, and a read inside
a library module called from a parent's forward is not said to be in that module's forward."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

from tputrace.analysis import Report

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

MARKER = "# the planted line"

MASKED_BAG = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class BagModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(1000, 64, padding_idx=0)
            self.proj = nn.Linear(64, 2)

        def forward(self, ids):
            tokens = self.emb(ids)[ids != 0]  {marker}
            return self.proj(tokens).mean(0)


    model = BagModel().to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        ids = torch.randint(0, 1000, (16, 24))
        ids[:, torch.randint(5, 24, ()).item():] = 0
        loss = (model(ids.to("tpu")) - torch.tensor([1.0, -1.0], device="tpu")).pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

ADAPTIVE_SOFTMAX = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(32, 64)
            self.loss = nn.AdaptiveLogSoftmaxWithLoss(64, 100, cutoffs=[10, 50])

        def forward(self, x, y):
            return self.loss(torch.relu(self.body(x)), y).loss  {marker}


    model = Net().to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        x, y = torch.randn(16, 32, device="tpu"), torch.randint(0, 100, (16,), device="tpu")
        loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''


SELF_LOOPS_DROPPED = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    N, E = 200, 800


    def propagate(h, src, dst):
        msg = h[src]
        return torch.zeros_like(h).index_add_(0, dst, msg)


    lin = nn.Linear(32, 4).to("tpu")
    optimizer = torch.optim.Adam(lin.parameters(), lr=1e-2)
    x, labels = torch.randn(N, 32, device="tpu"), torch.randint(0, 4, (N,), device="tpu")
    for step in range(6):
        src, dst = torch.randint(0, N, (E,), device="tpu"), torch.randint(0, N, (E,), device="tpu")
        keep = src != dst
        src, dst = src[keep], dst[keep]  {marker}
        loss = nn.functional.cross_entropy(propagate(lin(x), src, dst), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''


LOGGED_EVERY_OTHER_STEP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(6):
        x = torch.randn(16, 64, device="tpu")
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 2 == 0:
            print(step, loss.item())  {marker}
'''


TOP_1_EXPERTS = '''
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)


    class MoE(nn.Module):
        def __init__(self, d=16, experts=2):
            super().__init__()
            self.gate = nn.Linear(d, experts)
            self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))

        def forward(self, x):
            weights, chosen = torch.topk(F.softmax(self.gate(x), -1), 1, dim=-1)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                rows, slot = torch.where(chosen == e)  {marker}
                out.index_add_(0, rows, expert(x[rows]) * weights[rows, slot, None])
            return out


    model = MoE().to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        x = torch.randn(64, 16, device="tpu")
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''


FRAMES_MASKED_BY_LENGTH = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class KWS(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(8, 16, 5, stride=2, padding=2)
            self.head = nn.Linear(16, 4)

        def forward(self, feats, lengths):
            h = torch.relu(self.conv(feats))
            mask = torch.arange(h.shape[-1], device=h.device)[None] < (lengths[:, None] + 1) // 2
            return self.head((h * mask[:, None]).sum(-1) / mask.sum(-1, keepdim=True))


    model = KWS().to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(6):
        frames = 40 + 8 * step
        feats, lengths = torch.randn(4, 8, frames), torch.randint(frames // 2, frames + 1, (4,))  {marker}
        loss = nn.functional.cross_entropy(model(feats.to("tpu"), lengths.to("tpu")), torch.randint(0, 4, (4,), device="tpu"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''


def _run(tmp_path: Path, name: str, source: str, run_options: tuple[str, ...] = ()) -> tuple[Report, Path, int]:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source.format(marker=MARKER)))
    line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if MARKER in text)
    return record(script, tmp_path / f"{name}.tptrace", [], run_options), script, line


def test_a_mask_count_in_strict_mode_is_one_storm(tmp_path: Path) -> None:
    """In strict mode the backward expands the masked mean's gradient to the mask's count, in a program of its own
    that compiles per count: that is the mask's storm, not a second finding for the expand's lengths."""
    report, script, line = _run(tmp_path, "masked_bag", MASKED_BAG, ("--mode", "strict"))
    data = report.results["recompiles"].data
    assert data.data_size_storms and not data.chip_shape_storms, data.chip_shape_storms
    storms = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert [(finding.file, finding.line) for finding in storms] == [(str(script), line)], [f.title for f in storms]


def test_expert_rows_sliced_to_their_exact_count_are_the_routings_storm(tmp_path: Path) -> None:
    """Top-1 routing gathers each expert's rows with `torch.where(chosen == e)`, recorded at its padded length; in
    strict mode the rows' view is sliced to the exact count, which compiles per count: that is the routing's storm
    (lengths one the padded form of the other), not a second finding for the view's lengths."""
    report, script, line = _run(tmp_path, "top_1_experts", TOP_1_EXPERTS, ("--mode", "strict"))
    data = report.results["recompiles"].data
    assert data.data_size_storms and not data.chip_shape_storms, data.chip_shape_storms
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert (storm.file, storm.line) == (str(script), line), storm.title


def test_an_arange_of_a_host_batchs_length_is_the_batchs_storm(tmp_path: Path) -> None:
    """`torch.arange(h.shape[-1])` over a convolution of a batch whose frame count changes takes that count (halved
    by the stride) as its argument; in strict mode it compiles per count. That is the batch's storm, which padding the
    batch fixes, not a length "chosen on the chip" that padding cannot help."""
    report, script, line = _run(tmp_path, "frames_masked_by_length", FRAMES_MASKED_BY_LENGTH, ("--mode", "strict"))
    data = report.results["recompiles"].data
    assert data.host_input_storms and not data.chip_shape_storms, data.chip_shape_storms
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert (storm.file, storm.line) == (str(script), line), storm.title


def test_a_mask_count_sliced_from_its_padded_result_is_the_masks_storm(tmp_path: Path) -> None:
    """DeferAndFuse keeps `src[keep]` at its padded length and slices it to the count; the graph that reads the slice
    at another line compiles per count with the same input shapes. The storm is the mask's count at the line that
    made it, not a slice length chosen at the reading line."""
    report, script, line = _run(tmp_path, "self_loops_dropped", SELF_LOOPS_DROPPED)
    data = report.results["recompiles"].data
    assert not data.chip_shape_storms, data.chip_shape_storms
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert "the count of a boolean mask" in storm.title, storm.title


def test_a_read_in_a_library_module_called_from_a_parents_forward(tmp_path: Path) -> None:
    """`AdaptiveLogSoftmaxWithLoss` reads the targets' counts on the host; the line that calls it is the parent's
    forward, which also runs another module: the read is in the called module's code, not in its forward at the
    line."""
    report, script, line = _run(tmp_path, "adaptive_softmax", ADAPTIVE_SOFTMAX)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert sync.module == "Net.loss", sync.module
    assert sync.suggestion.startswith(f"If {script.name}:{line} only calls Net.loss"), sync.suggestion
    assert "forward of Net.loss" not in sync.suggestion


def test_a_read_every_other_step_says_its_period(tmp_path: Path) -> None:
    """A loss printed when `step % 2 == 0` syncs in steps 1, 3 and 5 of the steady steps 1-5: once every 2 steps,
    not "3 times every 5 steps"."""
    report, script, line = _run(tmp_path, "logged_every_other_step", LOGGED_EVERY_OTHER_STEP)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert sync.title.startswith(f"Host sync 1 time every 2 steps at {script.name}:{line} (item)"), sync.title
    # the script already reads every other step: the fix is to read less often, not "every N steps"
    assert sync.suggestion.startswith("The line already reads every 2 steps"), sync.suggestion
    assert "every 8 steps" in sync.suggestion and "every N steps" not in sync.suggestion
