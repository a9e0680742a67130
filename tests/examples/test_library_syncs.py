"""Host reads that a library makes for the user's line: Transformers' Trainer, run unchanged on tpu (`--as-cuda`),
checks every step's loss for NaN and inf on the host. The sync is at the user's `trainer.train()` line, names the
Trainer's line that reads the value, and says which Trainer setting turns the read off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_problems import record

from tputrace.analysis import analyze_path

SCRIPT = '''
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    config = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                        num_labels=2)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, index):
            return {{"input_ids": torch.randint(1, 200, (16,)), "labels": torch.tensor(index % 2)}}

    arguments = TrainingArguments(output_dir="{output}", per_device_train_batch_size=8, max_steps=4, logging_steps=100,
                                  report_to=[], save_strategy="no")
    Trainer(model=BertForSequenceClassification(config), args=arguments, train_dataset=Data()).train()  # the call
'''


def test_a_trainers_loss_check_is_located_in_the_trainer_with_its_setting(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the Trainer scenario needs transformers (pip install -e .[test])")
    script = tmp_path / "trainer_run.py"
    script.write_text(textwrap.dedent(SCRIPT.format(output=tmp_path / "out")))
    call_line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "# the call" in text)
    report = record(script, tmp_path / "trainer_run.tptrace", [], ("--as-cuda",))
    checks = [finding for finding in report.findings
              if finding.analyzer == "syncs" and "(bool, in trainer.py:" in finding.title]
    assert checks, [finding.title for finding in report.findings]
    check = checks[0]
    assert check.line == call_line and check.file is not None and check.file.endswith("trainer_run.py")
    assert "logging_nan_inf_filter=False" in check.suggestion
    assert any(item.file is not None and item.file.endswith("transformers/trainer.py") for item in check.evidence)
    fusion = [finding for finding in report.findings if finding.analyzer == "fusion"]
    if fusion:  # the cuts at the call are the library's reads: the fusion finding says so rather than `torch.where`
        assert "reads are made inside a library" in fusion[0].suggestion and "torch.where" not in fusion[0].suggestion


LIBRARY = '''
    import torch


    def all_finite(loss: torch.Tensor) -> bool:
        return bool(torch.isfinite(loss).all())  # the read
'''

LIBRARY_USER = '''
    import torch
    from tinychecks import all_finite

    model = torch.nn.Linear(16, 4).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        loss = model(torch.randn(8, 16, device="tpu")).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if not all_finite(loss):  # the call
            break
'''


def test_a_package_on_pythonpath_site_packages_is_a_library(tmp_path: Path) -> None:
    """A package found in a site-packages directory that is not this environment's (a base environment's, one a
    `.pth` file or PYTHONPATH adds) is a library: its read is grouped at the user's call, naming the library's line."""
    packages = tmp_path / "other-env" / "lib" / "site-packages"
    (packages / "tinychecks").mkdir(parents=True)
    (packages / "tinychecks" / "__init__.py").write_text(textwrap.dedent(LIBRARY))
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(LIBRARY_USER))
    call_line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "# the call" in text)
    trace = tmp_path / "loop.tptrace"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(packages), os.environ.get("PYTHONPATH"))))}
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace), str(script)]
    completed = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    reads = [finding for finding in analyze_path(trace).findings if finding.analyzer == "syncs"]
    assert reads and reads[0].line == call_line and reads[0].file is not None and reads[0].file.endswith("loop.py"), [
        (finding.title, finding.file, finding.line) for finding in reads]
    assert "in __init__.py:" in reads[0].title, reads[0].title
