"""A script that ends while a program it launched still runs exits cleanly: the backend waits for
running programs at exit (before, XLA's teardown under the running program crashed the process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# The last line launches the GPT example's backward program (a DeferAndFuse flush at the end of
# backward) and reads no value: the script ends while XLA compiles and runs it.
ENDS_WHILE_RUNNING = """
    import sys
    import torch
    import tputrace.backend

    sys.path.insert(0, "examples")
    import gpt_train

    torch.tpu.set_eager_mode(sys.argv[1])
    config = gpt_train.GPTConfig()
    model = gpt_train.GPT(config).to("tpu")
    tokens, targets = gpt_train.synthetic_batches(config, 4, 1)[0]
    _, loss = model(tokens.to("tpu"), targets.to("tpu"))
    loss.backward()
    print("shapes", [tuple(parameter.grad.shape) for parameter in model.parameters()][:1])
"""


@pytest.mark.parametrize("mode", ["DEFER_AND_FUSE", "DEFER_NEVER"])
def test_script_ending_while_a_program_runs_exits_cleanly(mode: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ENDS_WHILE_RUNNING), mode],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "shapes [(512, 256)]" in result.stdout
