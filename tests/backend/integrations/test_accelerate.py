"""Hugging Face accelerate and `transformers.Trainer` on tpu, as a CUDA user writes them: `Accelerator()`
picks `tpu` (`cpu=True` keeps the host), and `device_map="auto"` places models on the chips. Tiny models
built from configs (no hub access); values are compared with the same run on the CPU, and the ops of a
training step are checked to run on the chip, with no host fallback."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers

from backend_helpers import eager, host, recorded_fallbacks
from tputrace import open as open_trace
from tputrace.backend.compat.device_module import EagerMode
from tputrace.recording import lifecycle

accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed (pip install accelerate)")
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from accelerate.utils import get_max_memory  # noqa: E402

logging.getLogger("transformers").setLevel(logging.ERROR)

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
# a resume is checked on the host (torch's own behaviour, the reference) and on the chip in both eager modes
RESUME_RUNS = [
    pytest.param("cpu", EagerMode.DEFER_NEVER, id="cpu"),
    *(pytest.param("tpu", mode, id=f"tpu-{mode.name}") for mode in MODES),
]


@pytest.fixture(autouse=True)
def fresh_accelerate_state() -> Iterator[None]:
    """accelerate keeps one process-wide state (device, mixed precision): reset it around each test."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _reset() -> None:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _train_with_accelerate(**accelerator_options: object) -> tuple[accelerate.Accelerator, torch.nn.Module, list[float]]:
    """Four batches, two per optimizer step, gradients clipped: the loop of accelerate's examples."""
    accelerator = accelerate.Accelerator(gradient_accumulation_steps=2, **accelerator_options)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    dataset = torch.utils.data.TensorDataset(torch.randn(16, 8, generator=generator), torch.randint(0, 2, (16,), generator=generator))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for inputs, labels in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(accelerator.gather(loss.detach()).item())
    return accelerator, model, losses


def test_accelerator_picks_tpu_and_cpu_true_keeps_the_host() -> None:
    assert accelerate.Accelerator().device == torch.device("tpu")
    _reset()
    assert accelerate.Accelerator(cpu=True).device == torch.device("cpu")


def test_accelerate_training_loop_runs_on_the_chip_like_the_cpu(tmp_path: Path) -> None:
    _, cpu_model, cpu_losses = _train_with_accelerate(cpu=True)
    _reset()
    trace_path = tmp_path / "accelerate.tptrace"
    lifecycle.start(str(trace_path), script="accelerate", argv=[], mode="strict")
    try:
        with recorded_fallbacks() as fallbacks:
            accelerator, model, losses = _train_with_accelerate()
    finally:
        lifecycle.stop(0)
    assert accelerator.device == torch.device("tpu") and fallbacks == []
    assert {parameter.device for parameter in model.parameters()} == {torch.device("tpu", 0)}
    assert losses == pytest.approx(cpu_losses, abs=1e-6)
    for got, want in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(host(got), want.detach(), atol=1e-6, rtol=1e-5)
    with open_trace(trace_path) as trace:
        chip_ops = dict(trace.sql("SELECT s.text, MIN(o.chip) FROM ops o JOIN strings s ON s.id = o.op_sid GROUP BY s.text"))
    assert chip_ops["aten.addmm.default"] == 0 and chip_ops["aten.threshold_backward.default"] == 0


def test_accelerate_bf16_autocasts_on_the_chip() -> None:
    accelerator = accelerate.Accelerator(mixed_precision="bf16")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    inputs = torch.randn(3, 8)
    inner_dtypes: list[torch.dtype] = []
    model[0].register_forward_hook(lambda module, args, output: inner_dtypes.append(output.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(inputs).float()
    prepared = accelerator.prepare(model)
    outputs = prepared(inputs.to(accelerator.device))
    assert outputs.device == torch.device("tpu", 0) and outputs.dtype == torch.float32
    assert inner_dtypes == [torch.bfloat16, torch.bfloat16]
    torch.testing.assert_close(host(outputs), expected, atol=1e-2, rtol=1e-2)


def test_save_state_and_load_state_restore_the_chip_state(tmp_path: Path) -> None:
    accelerator, model, _ = _train_with_accelerate()
    optimizer = accelerator._optimizers[0]
    saved = {name: host(value).clone() for name, value in model.state_dict().items()}
    accelerator.save_state(tmp_path / "state")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    accelerator.load_state(tmp_path / "state")
    for name, value in model.state_dict().items():
        assert value.device == torch.device("tpu", 0) and torch.equal(host(value), saved[name]), name
    moments = [state["exp_avg"] for state in optimizer.state.values()]
    assert moments and {moment.device for moment in moments} == {torch.device("tpu", 0)}


def _train_with_dropout(accelerator: accelerate.Accelerator, first_step: int = 0, resume_from: Path | None = None,
                        checkpoint: tuple[int, Path] | None = None) -> list[float]:
    """Six batches, one per step, through a model with dropout from `first_step` on; `resume_from` loads a
    saved state first (into a fresh model and optimizer, after a different seed), `checkpoint` saves the
    state after the step it names."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.5), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    inputs, labels = torch.randn(24, 8, generator=generator), torch.randint(0, 2, (24,), generator=generator)
    dataset = torch.utils.data.TensorDataset(inputs, labels)
    # its own generator: starting an iteration then draws no seed from the default one, whose state is restored
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, generator=torch.Generator())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if resume_from is not None:
        torch.manual_seed(1234)
        accelerator.load_state(resume_from)
    losses = []
    for step, (batch, batch_labels) in enumerate(accelerator.skip_first_batches(loader, first_step), start=first_step):
        loss = torch.nn.functional.cross_entropy(model(batch), batch_labels)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if checkpoint is not None and step == checkpoint[0]:
            accelerator.save_state(checkpoint[1])
    return losses


@pytest.mark.parametrize("device, mode", RESUME_RUNS)
def test_load_state_resumes_dropout_where_save_state_left_it(tmp_path: Path, device: str, mode: EagerMode) -> None:
    with eager(mode):
        uninterrupted = _train_with_dropout(accelerate.Accelerator(cpu=device == "cpu"), checkpoint=(2, tmp_path / "step2"))
        _reset()
        resumed = _train_with_dropout(accelerate.Accelerator(cpu=device == "cpu"), first_step=3, resume_from=tmp_path / "step2")
    assert resumed == pytest.approx(uninterrupted[3:], abs=1e-6)


def test_a_multi_process_launch_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="^accelerate has no multi-process mode for tpu; launch a single process, or train the ranks with dist"):
        accelerate.Accelerator()


def _tiny_bert_and_data(dropout: float = 0.0) -> tuple[transformers.PreTrainedModel, torch.utils.data.Dataset]:
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(1)
    token_ids = torch.randint(0, 64, (8, 8), generator=generator)
    labels = torch.randint(0, 2, (8,), generator=generator)
    examples = [{"input_ids": token_ids[row], "labels": labels[row]} for row in range(8)]
    return model, examples


def _train_with_trainer(output_dir: Path, **options: object) -> transformers.Trainer:
    """Two steps, then an evaluation and a checkpoint (options override these)."""
    _reset()
    model, examples = _tiny_bert_and_data()
    schedule: dict[str, object] = {"max_steps": 2, "eval_strategy": "steps", "eval_steps": 2, "save_steps": 2}
    arguments = transformers.TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=4, per_device_eval_batch_size=4, logging_steps=1,
        report_to=[], seed=0, dataloader_pin_memory=False, disable_tqdm=True, **{**schedule, **options},
    )
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=examples, eval_dataset=examples)
    trainer.train()
    return trainer


def _logged(trainer: transformers.Trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


@pytest.fixture(scope="module")
def cpu_trainer_losses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    trainer = _train_with_trainer(tmp_path_factory.mktemp("cpu_trainer"), use_cpu=True)
    assert trainer.accelerator.device == torch.device("cpu")
    return {"loss": _logged(trainer, "loss"), "eval_loss": _logged(trainer, "eval_loss")}


def test_trainer_trains_evaluates_and_checkpoints_on_the_chip(tmp_path: Path, cpu_trainer_losses: dict[str, list[float]]) -> None:
    with recorded_fallbacks() as fallbacks:
        trainer = _train_with_trainer(tmp_path)
    assert trainer.args.device == torch.device("tpu", 0) and trainer.accelerator.device == torch.device("tpu")
    assert {parameter.device for parameter in trainer.model.parameters()} == {torch.device("tpu", 0)}
    assert fallbacks == []
    assert _logged(trainer, "loss") == pytest.approx(cpu_trainer_losses["loss"], abs=1e-5)
    assert _logged(trainer, "eval_loss") == pytest.approx(cpu_trainer_losses["eval_loss"], abs=1e-5)
    checkpoint = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "checkpoint-2")
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(host(value), checkpoint.state_dict()[name]), name


def _resumable_trainer(output_dir: Path, seed: int, device: str) -> transformers.Trainer:
    """Four steps of a BERT with dropout, two per epoch, a checkpoint every two; the data order depends
    on `data_seed` alone, so only the dropout masks follow `seed`."""
    _reset()
    model, examples = _tiny_bert_and_data(dropout=0.3)
    arguments = transformers.TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=4, save_steps=2, logging_steps=1,
        report_to=[], seed=seed, data_seed=0, use_cpu=device == "cpu", dataloader_pin_memory=False, disable_tqdm=True,
    )
    return transformers.Trainer(model=model, args=arguments, train_dataset=examples)


@pytest.mark.parametrize("device, mode", RESUME_RUNS)
def test_trainer_resumes_dropout_from_a_checkpoint(tmp_path: Path, device: str, mode: EagerMode) -> None:
    with eager(mode):
        uninterrupted = _resumable_trainer(tmp_path / "uninterrupted", seed=0, device=device)
        uninterrupted.train()
        resumed = _resumable_trainer(tmp_path / "resumed", seed=1234, device=device)
        resumed.train(resume_from_checkpoint=str(tmp_path / "uninterrupted" / "checkpoint-2"))
    assert resumed.accelerator.device == torch.device(device)
    # the resumed history starts with the checkpoint's two entries
    assert _logged(resumed, "loss")[2:] == pytest.approx(_logged(uninterrupted, "loss")[2:], abs=1e-6)


def _drop_accelerates_own_chip_state(rng_file: Path) -> None:
    """accelerate from 1.16 also keeps the current chip's state in its own RNG file; an older one did not."""
    states = torch.load(rng_file, weights_only=False)  # written by this test
    if states.pop("torch_tpu_manual_seed", None) is not None:
        torch.save(states, rng_file)


def test_a_checkpoint_without_the_chip_states_leaves_the_tpu_generators_as_they_are(tmp_path: Path) -> None:
    trainer = _resumable_trainer(tmp_path / "trainer", seed=0, device="tpu")
    trainer._save_rng_state(str(tmp_path / "trainer"))
    accelerator = accelerate.Accelerator()
    accelerator.save_state(tmp_path / "state")
    for chip_states in (tmp_path / "trainer" / "tpu_rng_state.pth", tmp_path / "state" / "tpu_random_states_0.pkl"):
        chip_states.unlink()  # as in a checkpoint written without them
    _drop_accelerates_own_chip_state(tmp_path / "state" / "random_states_0.pkl")
    torch.tpu.manual_seed_all(7)
    torch.randn(3, device="tpu")
    expected = torch.tpu.get_rng_state_all()
    trainer._load_rng_state(str(tmp_path / "trainer"))
    accelerator.load_state(tmp_path / "state")
    assert all(torch.equal(got, want) for got, want in zip(torch.tpu.get_rng_state_all(), expected, strict=True))


def test_trainer_bf16_autocasts_on_the_chip(tmp_path: Path, cpu_trainer_losses: dict[str, list[float]]) -> None:
    trainer = _train_with_trainer(tmp_path, bf16=True, max_steps=1, eval_strategy="no", save_strategy="no")
    assert trainer.accelerator.mixed_precision == "bf16" and trainer.accelerator.device == torch.device("tpu")
    inner_dtypes: list[torch.dtype] = []
    trainer.model.classifier.register_forward_hook(lambda module, args, output: inner_dtypes.append(output.dtype))
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model(**batch)
    assert inner_dtypes == [torch.bfloat16]
    [loss] = _logged(trainer, "loss")
    assert loss != cpu_trainer_losses["loss"][0]  # bfloat16 matmuls round differently
    assert loss == pytest.approx(cpu_trainer_losses["loss"][0], abs=1e-2)


def test_get_max_memory_lists_each_chip_before_the_host() -> None:
    chip_count = torch.tpu.device_count()
    budget = get_max_memory()
    assert list(budget)[:-1] == list(range(chip_count)) and list(budget)[-1] == "cpu"
    assert all(0 < budget[index] <= torch.tpu.mem_get_info(index)[1] for index in range(chip_count))
    explicit = {"cpu": "2GB", 0: "1MB"}
    assert get_max_memory(explicit) == {0: 10**6, "cpu": 2 * 10**9}
    assert explicit == {"cpu": 2 * 10**9, 0: 10**6}  # converted in place, as accelerate does for CUDA


def _tiny_gpt2(directory: Path) -> transformers.PreTrainedModel:
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=3, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory)
    return model


def test_device_map_auto_places_the_model_on_the_chip(tmp_path: Path) -> None:
    expected = _tiny_gpt2(tmp_path)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, device_map="auto")
    assert {parameter.device for parameter in loaded.parameters()} == {torch.device("tpu", 0)}
    tokens = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(host(loaded(tokens.to("tpu")).logits), expected(tokens).logits, atol=1e-5, rtol=1e-5)


def test_device_map_auto_offloads_what_does_not_fit_and_runs_it_on_the_chip(tmp_path: Path) -> None:
    expected = _tiny_gpt2(tmp_path)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, device_map="auto", max_memory={0: "30KB", "cpu": "1GB"})
    assert set(loaded.hf_device_map.values()) == {0, "cpu"}
    tokens = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        logits = loaded(tokens.to("tpu")).logits
    assert logits.device == torch.device("tpu", 0)
    torch.testing.assert_close(host(logits), expected(tokens).logits, atol=1e-5, rtol=1e-5)
    # after each offloaded layer ran, accelerate's hook put its weights back on meta
    assert {parameter.device.type for parameter in loaded.parameters()} == {"tpu", "meta"}


def test_init_on_device_makes_parameters_on_the_chip() -> None:
    with accelerate.init_on_device("tpu"):
        linear = torch.nn.Linear(3, 2)
    assert isinstance(linear.weight, torch.nn.Parameter) and linear.weight.requires_grad
    assert linear.weight.device == torch.device("tpu", 0)


_IMPORT_ORDER = {
    "backend first": """
        import sys
        import tputrace.backend
        print("accelerate" in sys.modules)
        import accelerate
        from transformers.integrations import accelerate as hf_accelerate
        from transformers import Trainer
    """,
    "accelerate first": """
        import sys
        import accelerate
        from transformers.integrations import accelerate as hf_accelerate
        from transformers import Trainer
        print("accelerate" in sys.modules)
        import tputrace.backend
    """,
}


@pytest.mark.parametrize("order", list(_IMPORT_ORDER))
def test_accelerate_is_adapted_in_either_import_order(tmp_path: Path, order: str) -> None:
    code = textwrap.dedent(_IMPORT_ORDER[order]) + textwrap.dedent(
        """
        print(accelerate.Accelerator().device)
        print(list(hf_accelerate.accelerate_max_memory()))
        print(hasattr(accelerate.accelerator.save_accelerator_state, "__wrapped__"),
              hasattr(Trainer._load_rng_state, "__wrapped__"))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "TPUTRACE_CHIPS": "2"}, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    imported_early = str(order == "accelerate first")
    assert result.stdout.split("\n")[:4] == [imported_early, "tpu", "[0, 1, 'cpu']", "True True"]
