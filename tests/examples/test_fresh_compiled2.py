"""Scripts that run `torch.compile(backend="tpu")` as users write them, read wrong before: a forward calling a helper
wrapped with `torch.compiler.disable`; a generation loop whose compiled step takes the prompt, then one token a call,
with a KV cache that grows at every call."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")


def _line(script: Path, text: str) -> int:
    return next(number for number, source in enumerate(script.read_text().splitlines(), 1) if text in source)


DISABLED_HELPER = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    @torch.compiler.disable
    def centre(h):
        return h - h.mean(0)


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 16)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            return self.fc2(centre(h))


    model = torch.compile(Block().to("tpu"), backend="tpu")
    with torch.no_grad():
        for step in range(3):
            out = model(torch.randn(8, 16, device="tpu"))
    print(out.sum().item())
'''


def test_a_break_at_a_disabled_helper_names_the_wrapper_not_the_call_to_remove(tmp_path: Path) -> None:
    """Dynamo's hint "Remove the `torch.compiler.disable` call" is about the decorator: the finding names the function
    and the decorator's line, and says how to keep it uncompiled (call it outside) where it must stay so; it does not
    tell to remove the call the break is at, nor quote the function's memory address."""
    script = tmp_path / "disabled.py"
    script.write_text(textwrap.dedent(DISABLED_HELPER))
    report = record(script, tmp_path / "disabled.tptrace", [])
    call = _line(script, "return self.fc2(centre(h))")
    (disabled,) = [finding for finding in report.findings if finding.analyzer == "graph_breaks" and finding.line == call]
    assert "(centre(), wrapped with torch.compiler.disable)" in disabled.title, disabled.title
    decorator = _line(script, "@torch.compiler.disable")
    assert disabled.suggestion.startswith(
        f"Dynamo's hint to remove the `torch.compiler.disable` call means the wrapper at {script.name}:{decorator}, "
        f"not the call at {script.name}:{call}"), disabled.suggestion
    assert "call `centre` outside the compiled function" in disabled.suggestion, disabled.suggestion
    assert "Otherwise move the call" not in disabled.suggestion
    assert " at 0x" not in disabled.explanation and all(" at 0x" not in item.text for item in disabled.evidence)
