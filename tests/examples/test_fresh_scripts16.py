"""Scripts of kinds the other fresh-script tests leave out that read wrong before. A char-RNN sampling 30 characters
after training with `torch.multinomial(p, 1).item()` per token had no sync finding (its reads ran only after the last
optimizer step); a loss checked with `if not torch.isfinite(loss): raise ...` each step was told the tolerance-break
example (`loss.item() < tol`); and one batch copied to the chip on four lines made four findings."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

CHAR_RNN = '''
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    device = "tpu"
    text = "to be or not to be, that is the question. " * 20
    chars = sorted(set(text))
    stoi = {{c: i for i, c in enumerate(chars)}}
    data = torch.tensor([stoi[c] for c in text])


    class CharRNN(nn.Module):
        def __init__(self, vocab, hidden=32):
            super().__init__()
            self.emb = nn.Embedding(vocab, 16)
            self.rnn = nn.GRU(16, hidden, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, x, h=None):
            out, h = self.rnn(self.emb(x), h)
            return self.head(out), h


    model = CharRNN(len(chars)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(6):
        ix = torch.randint(0, len(data) - 9, (4,))
        x = torch.stack([data[i:i + 8] for i in ix]).to(device)
        y = torch.stack([data[i + 1:i + 9] for i in ix]).to(device)
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, len(chars)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    model.eval()
    token = torch.tensor([[stoi["t"]]], device=device)
    h, generated = None, []
    with torch.no_grad():
        for _ in range(30):
            logits, h = model(token, h)
            p = F.softmax(logits[:, -1], dim=-1)
            idx = torch.multinomial(p, 1).item()  {marker}
            generated.append(chars[idx])
            token = torch.full((1, 1), idx, device=device)
    print("".join(generated))
'''

FINITE_LOSS = '''
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    device = "tpu"
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(10):
        x, y = torch.randn(64, 32), torch.randn(64, 1)
        mask, weight = torch.rand(64, 1) > 0.1, torch.rand(64, 1)
        x = x.to(device)  # first copy
        y = y.to(device)
        mask = mask.to(device)
        weight = weight.to(device)
        loss = (F.mse_loss(model(x), y, reduction="none") * weight * mask).mean()
        if not torch.isfinite(loss):  {marker}
            raise RuntimeError(f"loss diverged at step {{step}}")
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("done")
'''


def test_per_token_reads_of_a_decoding_loop_after_training_are_a_sync_finding(tmp_path: Path) -> None:
    """30 `.item()`s after the last optimizer step, one per sampled token: a finding at the line, told to keep the
    tokens on the chip, where no finding named the reads."""
    report, script, line = _run(tmp_path, "char_rnn", CHAR_RNN)
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert read.title.startswith(f"Host sync 30 times after the training loop at {script.name}:{line} (item)"), read.title
    assert read.suggestion.startswith("The line reads each token sampled (or picked) on the chip"), read.suggestion
    assert "`tokens.tolist()`" in read.suggestion


def test_a_finiteness_check_that_raises_is_told_to_keep_a_flag_on_the_chip(tmp_path: Path) -> None:
    """`if not torch.isfinite(loss): raise` reads every step: the advice is a flag on the chip read every N steps,
    not the tolerance-break example; and the batch's four copy lines are one finding naming them."""
    report, script, line = _run(tmp_path, "finite_loss", FINITE_LOSS)
    (check,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "(bool)" in check.title and "loss.item() < tol" not in check.suggestion, check.suggestion
    assert check.suggestion.startswith("Check finiteness every N steps") and "nonfinite.item()" in check.suggestion
    first = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "# first copy" in text)
    (copies,) = [finding for finding in report.findings if finding.analyzer == "transfers"]
    batch_lines = f"{script.name}:{first}, {first + 1}, {first + 2}, {first + 3} (4 lines)"
    assert copies.line == first and f"one batch in the loop at {batch_lines}" in copies.title, copies.title
    assert "4 copies per step" in copies.title and len(copies.evidence) == 4, copies.title


def test_a_nan_check_that_logs_before_raising_is_a_finiteness_check_not_an_inner_loop(tmp_path: Path) -> None:
    """`if torch.isnan(loss).any() or torch.isinf(loss).any():` reads two bools a step and logs before its `raise`:
    still the finiteness check's advice, not an inner loop's stop nor the tolerance-break example."""
    source = FINITE_LOSS.replace("if not torch.isfinite(loss):", "if torch.isnan(loss).any() or torch.isinf(loss).any():")
    source = source.replace("            raise RuntimeError", "            print('non-finite loss', step)\n            raise RuntimeError")
    report, _, line = _run(tmp_path, "nan_check", source)
    (check,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "2 times per step" in check.title, check.title
    assert check.suggestion.startswith("Check finiteness every N steps"), check.suggestion
