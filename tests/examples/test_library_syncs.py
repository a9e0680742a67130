"""Host reads that a library makes for the user's line: Transformers' Trainer, run unchanged on tpu (`--as-cuda`),
checks every step's loss for NaN and inf on the host. The sync is at the user's `trainer.train()` line, names the
Trainer's line that reads the value, and says which Trainer setting turns the read off."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

pytest.importorskip("transformers", reason="the Trainer scenario needs transformers (pip install -e .[test])")

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
