"""An index out of range, or a value the CPU refuses (a probability outside [0, 1]), raises at the
next sync in the default eager modes, as a CUDA device-side assert does, naming the op and the line
that made it; indices in range and valid values give the CPU's results."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.indexing import index_checks

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _table(d: str) -> torch.Tensor:
    return torch.arange(15.0, device=d).reshape(5, 3)


def _ids(d: str, *values: int) -> torch.Tensor:
    return torch.tensor(values, device=d)


# Each case, written on one line: (the op the error names, a call with an index out of range).
OUT_OF_RANGE: dict[str, tuple[str, Callable[[str], torch.Tensor]]] = {
    "embedding past num_embeddings": ("aten.embedding", lambda d: F.embedding(_ids(d, 1, 5), _table(d))),
    "embedding negative": ("aten.embedding", lambda d: F.embedding(_ids(d, -1), _table(d))),
    "index_select": ("aten.index_select", lambda d: _table(d).index_select(0, _ids(d, 0, 5))),
    "index_select negative": ("aten.index_select", lambda d: _table(d).index_select(1, _ids(d, -1))),
    "gather": ("aten.gather", lambda d: _table(d).gather(1, torch.tensor([[0], [3], [1], [0], [0]], device=d))),
    "advanced index": ("aten.index", lambda d: _table(d)[_ids(d, 0, 5)]),
    "advanced index negative": ("aten.index", lambda d: _table(d)[_ids(d, -6)]),
    "advanced index second dim": ("aten.index", lambda d: _table(d)[:, _ids(d, 3)]),
    "take": ("aten.take", lambda d: _table(d).take(_ids(d, 15))),
    "nll_loss target": ("aten.nll_loss_forward", lambda d: F.nll_loss(_table(d), _ids(d, 0, 1, 2, 3, 0))),
    "cross_entropy negative target": ("aten.nll_loss_forward", lambda d: F.cross_entropy(_table(d), _ids(d, 0, 1, 2, -1, 0))),
    "cross_entropy 2d target": ("aten.nll_loss2d_forward", lambda d: F.cross_entropy(torch.zeros(1, 3, 2, 2, device=d), torch.full((1, 2, 2), 3, device=d))),
    "scatter_add_": ("aten.scatter_add_", lambda d: torch.zeros(5, device=d).scatter_add_(0, _ids(d, 7), torch.ones(1, device=d))),
    "index_add_": ("aten.index_add_", lambda d: torch.zeros(5, 3, device=d).index_add_(0, _ids(d, 5), torch.ones(1, 3, device=d))),
    "index_put_": ("aten.index_put_", lambda d: torch.zeros(5, device=d).index_put_((_ids(d, 5),), torch.ones(1, device=d))),
    "one_hot past num_classes": ("aten.one_hot", lambda d: F.one_hot(_ids(d, 0, 3), 3)),
    "one_hot negative": ("aten.one_hot", lambda d: F.one_hot(_ids(d, -1, 2), 3)),
}

# Indices in range, including the negative ones torch counts from the end and nll_loss's ignore_index.
IN_RANGE: dict[str, Callable[[str], torch.Tensor]] = {
    "embedding": lambda d: F.embedding(_ids(d, 0, 4, 2), _table(d)),
    "index_select": lambda d: _table(d).index_select(1, _ids(d, 2, 0)),
    "gather": lambda d: _table(d).gather(1, torch.tensor([[0], [2], [1], [0], [2]], device=d)),
    "advanced index negative": lambda d: _table(d)[_ids(d, -5, 4)],
    "advanced index two dims": lambda d: _table(d)[_ids(d, 1, -1), _ids(d, -3, 2)],
    "take negative": lambda d: _table(d).take(_ids(d, -15, 14)),
    "cross_entropy ignore_index": lambda d: F.cross_entropy(_table(d), _ids(d, 0, 1, 2, -100, 1)),
    "nll_loss own ignore_index": lambda d: F.nll_loss(_table(d), _ids(d, 0, 7, 2, 1, 1), ignore_index=7),
    "scatter_add_": lambda d: torch.zeros(5, device=d).scatter_add_(0, _ids(d, 4, 0, 4), torch.ones(3, device=d)),
    "index_put_ negative": lambda d: torch.zeros(5, device=d).index_put_((_ids(d, -1),), torch.ones(1, device=d)),
    "one_hot": lambda d: F.one_hot(_ids(d, 2, 0, 1), 3),
    "one_hot counting its classes": lambda d: F.one_hot(_ids(d, 2, 0, 4)),
}


# Values the CPU kernel refuses that are not indices: (the op the error names, a call with such values).
INVALID_VALUES: dict[str, tuple[str, Callable[[str], torch.Tensor]]] = {
    "multinomial negative": ("aten.multinomial", lambda d: torch.multinomial(torch.tensor([0.5, -0.1], device=d), 1)),
    "multinomial nan": ("aten.multinomial", lambda d: torch.multinomial(torch.tensor([[0.5, 0.5], [float("nan"), 1.0]], device=d), 1)),
    "multinomial zero row": ("aten.multinomial", lambda d: torch.multinomial(torch.tensor([[0.5, 0.5], [0.0, 0.0]], device=d), 1)),
    "bernoulli": ("aten.bernoulli", lambda d: torch.bernoulli(torch.tensor([0.5, 1.5], device=d))),
    "bernoulli_ tensor p": ("aten.bernoulli_", lambda d: torch.zeros(2, device=d).bernoulli_(torch.tensor([float("nan"), 0.5], device=d))),
    "binary_cross_entropy": ("aten.binary_cross_entropy", lambda d: F.binary_cross_entropy(torch.tensor([0.5, 1.5], device=d), torch.ones(2, device=d))),
}

# Valid values whose results do not depend on the random draw, so they compare with the CPU's.
IN_RANGE |= {
    "multinomial certain": lambda d: torch.multinomial(torch.tensor([[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]], device=d), 1),
    "bernoulli certain": lambda d: torch.bernoulli(torch.tensor([0.0, 1.0, 1.0], device=d)),
    "binary_cross_entropy": lambda d: F.binary_cross_entropy(torch.tensor([0.0, 0.25, 1.0], device=d), torch.tensor([0.0, 1.0, 1.0], device=d)),
}


@pytest.fixture(autouse=True)
def _no_error_left_over() -> None:
    """Each test starts and ends with no unread out-of-range index (one would raise at a later sync)."""
    torch.tpu.synchronize()
    yield
    torch.tpu.synchronize()


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE) + sorted(INVALID_VALUES))
def test_an_index_out_of_range_or_an_invalid_value_raises_at_the_next_item(mode: EagerMode, case: str) -> None:
    op_name, call = OUT_OF_RANGE.get(case) or INVALID_VALUES[case]
    what = "invalid values" if case in INVALID_VALUES else "index out of range"
    with pytest.raises((IndexError, RuntimeError)):
        call("cpu")
    with eager(mode):
        result = call("tpu")  # asynchronous, as on CUDA: the op itself does not raise
        with pytest.raises(RuntimeError) as raised:
            result.sum().item()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{what} in {op_name} at {Path(__file__).name}:{call.__code__.co_firstlineno} (")
    assert "device-side assert" in message and "TPUTRACE_INDEX_CHECKS=0" in message


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(IN_RANGE))
def test_indices_in_range_and_valid_values_give_the_cpus_results(mode: EagerMode, case: str) -> None:
    call = IN_RANGE[case]
    with eager(mode):
        result = host(call("tpu"))
        torch.tpu.synchronize()
    torch.testing.assert_close(result, call("cpu"))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_an_error_does_not_poison_later_steps(mode: EagerMode) -> None:
    """After the error is raised and caught, training steps run and match the CPU's."""

    def train(d: str, ids: list[int]) -> list[float]:
        torch.manual_seed(0)
        table = torch.nn.Embedding(6, 3).to(d)
        optimizer = torch.optim.SGD(table.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            loss = F.cross_entropy(table(torch.tensor(ids, device=d)), torch.tensor([0, 1, 2], device=d))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    with eager(mode):
        with pytest.raises(RuntimeError, match="index out of range in aten.embedding"):
            train("tpu", [1, 6, 2])
        losses = train("tpu", [1, 5, 2])
    torch.testing.assert_close(losses, train("cpu", [1, 5, 2]))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_the_first_bad_op_is_named_and_synchronize_raises(mode: EagerMode) -> None:
    with eager(mode):
        table = _table("tpu")
        rows = table.index_select(0, _ids("tpu", 9))
        F.embedding(_ids("tpu", 8), table).sum()
        with pytest.raises(RuntimeError, match=r"in aten\.index_select .*>= 5 or < 0"):
            torch.tpu.synchronize()
        assert host(rows + 1).shape == (1, 3)  # no error left to raise


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_one_hot_counting_its_classes_refuses_a_negative_class_at_once(mode: EagerMode) -> None:
    """With no class count, one_hot reads the largest class (a sync), where the check raises, as the CPU does at the op."""
    with pytest.raises(RuntimeError, match="non-negative"):
        F.one_hot(_ids("cpu", 1, -2))
    with eager(mode), pytest.raises(RuntimeError, match=r"in aten\.one_hot .*\(a class value < 0\)"):
        F.one_hot(_ids("tpu", 1, -2))


def test_the_check_fuses_into_the_pending_graph() -> None:
    """DEFER_AND_FUSE: the check is one more node of the pending graph; the op flushes nothing."""
    from tputrace.backend.core.dispatch import dispatcher

    with eager(EagerMode.DEFER_AND_FUSE):
        table = _table("tpu")
        torch.tpu.synchronize()
        rows = F.embedding(_ids("tpu", 1, 7), table)
        graph = dispatcher.executor.graphs[0]
        assert [plan.op_name for plan, _ in graph.nodes][-2:] == ["aten.embedding.default", "index_check"]
        assert not graph.flushed
        with pytest.raises(RuntimeError, match="aten.embedding"):
            host(rows)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_with_the_checks_off_xla_goes_on(mode: EagerMode, monkeypatch: pytest.MonkeyPatch) -> None:
    """No error: the row in range is right, the other one is XLA's (NaN for this lowering's gather)."""
    monkeypatch.setattr(index_checks, "enabled", False)
    with eager(mode):
        rows = host(F.embedding(_ids("tpu", 1, 5), _table("tpu")))
        torch.tpu.synchronize()
    assert rows[0].tolist() == [3.0, 4.0, 5.0]


def test_the_environment_variable_turns_the_checks_off(tmp_path: Path) -> None:
    script = tmp_path / "clamped.py"
    script.write_text(
        "import torch, torch.nn.functional as F\n"
        "import tputrace.backend\n"
        "rows = F.embedding(torch.tensor([1, 5], device='tpu'), torch.arange(15.0, device='tpu').reshape(5, 3))\n"
        "print(rows.tolist()[0], rows.sum().item() != 0)\n"
    )
    repo = Path(__file__).resolve().parents[3]
    environment = {**os.environ, "TPUTRACE_INDEX_CHECKS": "0", "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=environment, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[3.0, 4.0, 5.0] True"


def _with_a_dict_constant(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`function` with a dict among its code's constants, as code Dynamo rewrites can hold: its code does not hash."""
    import types

    code = function.__code__.replace(co_consts=function.__code__.co_consts + ({"unhashable": 1},))
    with pytest.raises(TypeError):
        hash(code)
    return types.FunctionType(code, function.__globals__)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_an_index_op_in_code_that_does_not_hash(mode: EagerMode) -> None:
    """The check's user frame is code Dynamo rewrote (ViLT's resumed `visual_embed` under torch.compile):
    finding the user's line raised "unhashable type: 'dict'" on every index op there."""
    rows_of = _with_a_dict_constant(lambda table, ids: table[ids] * 2)
    with eager(mode):
        assert host(rows_of(_table("tpu"), _ids("tpu", 1, -1))).tolist() == [[6.0, 8.0, 10.0], [24.0, 26.0, 28.0]]
        with pytest.raises(RuntimeError, match=rf"index out of range in aten\.index at {Path(__file__).name}:{rows_of.__code__.co_firstlineno} "):
            host(rows_of(_table("tpu"), _ids("tpu", 5)))
