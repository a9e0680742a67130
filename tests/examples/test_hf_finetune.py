"""examples/hf_finetune.py, a Hugging Face fine-tuning loop written as for a GPU, under `tputrace run`: its
losses match the CPU's, and the report names its real problems at their lines: the recompilation storm of
batches padded to their own longest sequence (at the line that copies each batch to the chip), the
`.item()` read every step, and transformers' own host read of the attention mask inside the model call.

The run is a subprocess (`python -m tputrace.cli.main run ...`), like a user's; the analysis runs here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tputrace.analysis import Report, analyze_path

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "hf_finetune.py"
# Three optimizer steps (six micro-batches of six lengths), one block and one evaluation batch keep the run short:
# every new length compiles the step's programs again, which is the problem the report must find.
ARGS = ["--steps", "3", "--layers", "1", "--eval-batches", "1"]
STEPS = 3


def line_in(function: str, text: str) -> int:
    """The line of `text` inside `def function` of the example."""
    lines = SCRIPT.read_text().splitlines()
    start = next(number for number, line in enumerate(lines) if line.startswith(f"def {function}("))
    return next(number for number, line in enumerate(lines[start:], start + 1) if text in line)


def printed_losses(output: str) -> list[float]:
    return [float(loss) for loss in re.findall(r"^step +\d+ loss ([0-9.]+)", output, flags=re.MULTILINE)]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, list[float]]:
    trace = tmp_path_factory.mktemp("hf_finetune") / "run.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace), str(SCRIPT), *ARGS]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return analyze_path(trace), printed_losses(completed.stdout)


def example():  # noqa: ANN201 - the example module
    sys.path.insert(0, str(SCRIPT.parent))
    import hf_finetune

    return hf_finetune


def test_losses_match_the_cpu(traced: tuple[Report, list[float]]) -> None:
    cpu_losses = example().finetune("cpu", STEPS, layers=1, eval_batches=1).losses
    tpu_losses = traced[1]
    assert len(tpu_losses) == len(cpu_losses) == STEPS
    # Both sides autocast to bfloat16; XLA and torch's CPU kernels round in different places.
    assert tpu_losses == pytest.approx(cpu_losses, abs=5e-3)


def test_the_padding_storm_is_the_top_finding_at_the_collate_line(traced: tuple[Report, list[float]]) -> None:
    """One finding sits at the line that made the batch on the host, in the collate_fn (the line to change); the
    copying line is evidence."""
    report = traced[0]
    top = report.findings[0]
    copy_line = line_in("finetune", "value.to(device) for name, value in batch.items()")
    made_line = line_in("pad_to_longest", "input_ids = torch.full(")
    assert top.analyzer == "recompiles" and (top.file, top.line) == (str(SCRIPT), made_line), top.title
    assert f"batches made at hf_finetune.py:{made_line} in pad_to_longest() change shape" in top.title
    assert f"(copied to the chip at hf_finetune.py:{copy_line})" in top.suggestion
    assert (str(SCRIPT), copy_line) in {(evidence.file, evidence.line) for evidence in top.evidence}
    assert "pad_to_multiple_of" in top.suggestion
    lengths = sorted({batch["input_ids"].shape[1] for batch in example().make_train_loader(STEPS)})
    storm = next(data for data in report.results["recompiles"].data.host_input_storms
                 if data.where == f"hf_finetune.py:{copy_line}")
    assert list(storm.sizes) == lengths and len(storm.programs) >= 2  # the forward-backward and the mask check


def test_the_item_read_and_the_mask_read_inside_the_model(traced: tuple[Report, list[float]]) -> None:
    syncs = {finding.line: finding for finding in traced[0].findings if finding.analyzer == "syncs"}
    item = syncs[line_in("finetune", "loss.item()")]
    assert "(item)" in item.title and item.module is None
    model_call = syncs[line_in("finetune", "loss = model(**batch).loss")]
    assert "(bool, in masking_utils.py:" in model_call.title  # the read is Transformers' mask check, named at its line
    assert model_call.module is not None and model_call.module.startswith("GPT2LMHeadModel")
    assert model_call.suggestion.startswith("Transformers' SDPA mask (`_ignore_causal_mask_sdpa`) reads on the host")
    assert 'attn_implementation="eager"' in model_call.suggestion
