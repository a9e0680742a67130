"""Idioms of CUDA training code that have no tpu counterpart answer with a one-line error saying what
to do: a process forked from one using tpu (Hogwild's `mp.Process(target=train, args=(model,))`)
and a tpu tensor sent to another process. Forked workers that load host data still run, and so does
a process forked from one that had only imported the backend."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from backend_helpers import host
from tputrace.backend.compat import process_sharing


def _train_in_child(model: torch.nn.Module, errors: multiprocessing.Queue) -> None:
    try:
        for parameter in model.parameters():
            parameter.data.add_(1)
        errors.put("no error")
    except RuntimeError as error:
        errors.put(str(error))
    errors.put(torch.tpu._is_in_bad_fork())


def test_a_forked_process_refuses_tpu_ops_instead_of_hanging() -> None:
    model = torch.nn.Linear(2, 2).to("tpu").share_memory()
    for parameter in model.parameters():
        parameter.data.add_(0)  # the op the child runs has a cached route, as in a training loop
    before = [host(parameter) for parameter in model.parameters()]
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    child = context.Process(target=_train_in_child, args=(model, errors))
    child.start()
    try:
        message, bad_fork = errors.get(timeout=60), errors.get(timeout=60)
    finally:
        child.join(10)
        if child.is_alive():  # a hung child (JAX after a fork) must not outlive the test
            child.kill()
    assert message == process_sharing.FORKED_MESSAGE
    assert bad_fork is True and not torch.tpu._is_in_bad_fork()
    for parameter, value in zip(model.parameters(), before):
        torch.testing.assert_close(host(parameter), value)


def test_sending_a_tpu_tensor_to_another_process_raises_one_line() -> None:
    for value in (torch.ones(3, device="tpu"), torch.nn.Linear(2, 2).to("tpu").weight):
        with pytest.raises(RuntimeError, match="cannot be sent to another process.*send tensor.cpu"):
            ForkingPickler.dumps(value)


def test_forked_data_loader_workers_still_load_host_data() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(24.0).reshape(8, 3))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, pin_memory=True, multiprocessing_context="fork")
    batches = [host(batch.to("tpu", non_blocking=True) * 2) for (batch,) in loader]
    torch.testing.assert_close(torch.cat(batches), torch.arange(24.0).reshape(8, 3) * 2)


FORK_SCRIPT = r"""
import json, multiprocessing
import torch
import tputrace.backend  # noqa: F401

def use_tpu(results):
    try:
        results.put(["ok", (torch.arange(4.0, device="tpu") * 2).cpu().tolist(), torch.tpu._is_in_bad_fork()])
    except RuntimeError as error:
        results.put(["error", str(error), torch.tpu._is_in_bad_fork()])

def in_forked_child():
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=use_tpu, args=(results,))
    child.start()
    try:
        return results.get(timeout=90)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()

outcomes = {"imported": in_forked_child()}
torch.tpu.device_count()  # counting the chips starts JAX's runtime
outcomes["chips counted"] = in_forked_child()
print(json.dumps(outcomes))
"""


def test_a_process_forked_before_the_runtime_started_uses_tpu() -> None:
    """As CUDA refuses a fork only when the parent had initialised CUDA: a parent that had only imported
    the backend forks a child that runs tpu ops; once the parent counted its chips, a child refuses."""
    result = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    outcomes = json.loads(result.stdout.splitlines()[-1])
    assert outcomes["imported"] == ["ok", [0.0, 2.0, 4.0, 6.0], False]
    assert outcomes["chips counted"] == ["error", process_sharing.FORKED_MESSAGE, True]
