"""Inside a `torch.compile(backend="tpu")` program, an index out of range, or a value the CPU refuses,
raises at the next sync, naming the op and the line it was traced from, as eager mode's checks do;
indices in range give the CPU's results, and the checks add no launch and no recompile."""

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
from tputrace.analysis import analyze_path
from tputrace.backend.compat.device_module import EagerMode
from tputrace.cli.main import main

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
REPO = Path(__file__).resolve().parents[3]

# (the op the error names, a function of a [5, 3] table and an int64 id vector, written on one line).
CASES: dict[str, tuple[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = {
    "embedding": ("aten.embedding", lambda table, ids: F.embedding(ids, table) * 2),
    "index_select": ("aten.index_select", lambda table, ids: table.index_select(0, ids) + 1),
    "gather": ("aten.gather", lambda table, ids: table.gather(0, ids[:, None].expand(-1, 3)) + 1),
    "advanced index": ("aten.index", lambda table, ids: table[ids] + 1),
    "take": ("aten.index", lambda table, ids: table.take(ids * 3) + 1),
    # AOTAutograd decomposes take and nll_loss: their indices reach the program as an index's and a gather's.
    "cross_entropy target": ("aten.gather", lambda table, ids: F.cross_entropy(table[: len(ids)], ids - 2)),
    "scatter_add": ("aten.scatter_add", lambda table, ids: torch.zeros_like(table[:, 0]).scatter_add(0, ids, table[: len(ids), 0])),
    "index_put": ("aten.index_put", lambda table, ids: table[:, 0].index_put((ids,), table[: len(ids), 1], accumulate=True)),
}
GOOD_IDS, BAD_IDS = [4, 2, 3], [4, 5, 3]


def _table(device: str) -> torch.Tensor:
    return torch.arange(15.0, device=device).reshape(5, 3)


def _ids(values: list[int], device: str) -> torch.Tensor:
    return torch.tensor(values, device=device)


@pytest.fixture(autouse=True)
def _fresh_compiles() -> None:
    """Each test compiles its own functions and starts and ends with no unread flag."""
    torch._dynamo.reset()
    torch.tpu.synchronize()
    yield
    torch.tpu.synchronize()


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_index_out_of_range_in_a_compiled_program_raises_at_the_next_item(mode: EagerMode, case: str) -> None:
    op_name, call = CASES[case]
    with pytest.raises((IndexError, RuntimeError)):
        call(_table("cpu"), _ids(BAD_IDS, "cpu"))
    compiled = torch.compile(call, backend="tpu", dynamic=False)
    with eager(mode):
        table = _table("tpu")
        good = host(compiled(table, _ids(GOOD_IDS, "tpu")))
        result = compiled(table, _ids(BAD_IDS, "tpu"))  # asynchronous: the call itself does not raise
        with pytest.raises(RuntimeError) as raised:
            result.sum().item()
        after = host(compiled(table, _ids(GOOD_IDS, "tpu")))  # the error was read: nothing raises again
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"index out of range in {op_name} at {Path(__file__).name}:{call.__code__.co_firstlineno} (")
    expected = call(_table("cpu"), _ids(GOOD_IDS, "cpu"))
    torch.testing.assert_close(good, expected)
    torch.testing.assert_close(after, expected)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_ignore_index_passes_the_check(mode: EagerMode) -> None:
    compiled = torch.compile(lambda scores, target: F.cross_entropy(scores, target), backend="tpu", dynamic=False)
    target = [0, -100, 2, 1, -100]
    with eager(mode):
        loss = compiled(_table("tpu"), _ids(target, "tpu")).item()
    assert loss == pytest.approx(F.cross_entropy(_table("cpu"), _ids(target, "cpu")).item())


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_compiled_training_step_with_a_bad_id_raises_and_later_steps_match_the_cpu(mode: EagerMode) -> None:
    """The forward's check raises at the loss's `item()`; a training run after it matches the CPU's."""

    def train(device: str, batches: list[list[int]], compile_step: bool) -> list[float]:
        torch.manual_seed(0)
        table = torch.nn.Embedding(6, 3).to(device)
        optimizer = torch.optim.SGD(table.parameters(), lr=0.1)

        def loss_of(ids: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(table(ids), torch.tensor([0, 1, 2], device=device))

        step = torch.compile(loss_of, backend="tpu", dynamic=False) if compile_step else loss_of
        losses = []
        for ids in batches:
            loss = step(torch.tensor(ids, device=device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    good = [[1, 5, 2], [0, 3, 4], [1, 5, 2]]
    with eager(mode):
        with pytest.raises(RuntimeError, match="index out of range in aten.embedding"):
            train("tpu", [[1, 6, 2], *good], compile_step=True)
        losses = train("tpu", good, compile_step=True)
    torch.testing.assert_close(losses, train("cpu", good, compile_step=False))


def test_the_checks_add_no_launch_and_no_recompile() -> None:
    """The flag is one more output of the compiled program, not a program of its own."""
    from tputrace.backend.compile.graphs import CompiledGraph

    calls: list[CompiledGraph] = []
    original = CompiledGraph.__call__

    def counted(self: CompiledGraph, *args: object) -> list:
        calls.append(self)
        return original(self, *args)

    compiled = torch.compile(CASES["embedding"][1], backend="tpu", dynamic=False)
    table = _table("tpu")
    CompiledGraph.__call__ = counted
    try:
        for ids in (GOOD_IDS, GOOD_IDS, GOOD_IDS):
            compiled(table, _ids(ids, "tpu")).sum().item()
    finally:
        CompiledGraph.__call__ = original
    graph = calls[0]
    assert len(graph.programs) == 1
    (program,) = graph.programs.values()
    assert program.layout.check_result is not None


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_loop_of_compiled_calls_folds_flags_in_batches_and_raises_the_first_site(mode: EagerMode) -> None:
    """Forty compiled calls with no sync in between run one combine program per sixteen calls, not one
    per call, and the sync still names the first bad call's op and line, not a later one's."""
    from tputrace.backend.core.dispatch import dispatcher

    embedding_call, select_call = CASES["embedding"][1], CASES["index_select"][1]
    by_embedding = torch.compile(embedding_call, backend="tpu", dynamic=False)
    by_select = torch.compile(select_call, backend="tpu", dynamic=False)
    combines: list[object] = []
    with eager(mode):
        executor_type = type(dispatcher.executor)
        original = executor_type.run

        def counted(self: object, plan: object, *args: object, **kwargs: object) -> object:
            if getattr(plan, "structure_key", None) == ("index check", "combine"):
                combines.append(plan)
            return original(self, plan, *args, **kwargs)

        table, good, bad = _table("tpu"), _ids(GOOD_IDS, "tpu"), _ids(BAD_IDS, "tpu")
        executor_type.run = counted
        try:
            results = [by_embedding(table, bad if call == 3 else good) for call in range(20)]
            results += [by_select(table, bad if call == 10 else good) for call in range(20)]
        finally:
            executor_type.run = original
        with pytest.raises(RuntimeError) as raised:
            results[-1].sum().item()
        after = host(by_select(table, good))
    assert len(combines) == 2  # after calls 17 and 33: the first call's flag is the chip's, the next 16 wait
    assert str(raised.value).startswith(
        f"index out of range in aten.embedding at {Path(__file__).name}:{embedding_call.__code__.co_firstlineno} (")
    torch.testing.assert_close(after, select_call(_table("cpu"), _ids(GOOD_IDS, "cpu")))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_an_eager_check_after_waiting_compiled_flags_keeps_the_first_site(mode: EagerMode) -> None:
    """Compiled calls' flags still waiting when an eager op checks its indices are folded before it: a
    later bad eager op does not hide the earlier bad compiled call."""
    embedding_call = CASES["embedding"][1]
    compiled = torch.compile(embedding_call, backend="tpu", dynamic=False)
    with eager(mode):
        table, good, bad = _table("tpu"), _ids(GOOD_IDS, "tpu"), _ids(BAD_IDS, "tpu")
        compiled(table, good)
        compiled(table, bad)
        compiled(table, good)
        selected = table.index_select(0, bad)
        with pytest.raises(RuntimeError) as raised:
            selected.sum().item()
    assert str(raised.value).startswith(
        f"index out of range in aten.embedding at {Path(__file__).name}:{embedding_call.__code__.co_firstlineno} (")


def test_traced_run_diagnoses_the_compiled_op_at_its_line(tmp_path: Path) -> None:
    """`tputrace run` of a compiled function given a bad id: the finding names the op's line and the sync's."""
    script = tmp_path / "compiled_ids.py"
    script.write_text(
        "import torch\n"
        "table = torch.nn.Embedding(10, 4).to('tpu')\n"
        "@torch.compile(backend='tpu')\n"
        "def rows_of(ids):\n"
        "    return table(ids) * 2\n"
        "total = rows_of(torch.tensor([3, 12]).to('tpu')).sum()\n"
        "print(total.item())\n"
    )
    trace = tmp_path / "run.tptrace"
    assert main(["run", "--no-summary", "-o", str(trace), str(script)]) == 1
    (finding,) = [finding for finding in analyze_path(trace).findings if finding.analyzer == "index_errors"]
    assert finding.severity == "critical"
    assert (finding.file, finding.line) == (str(script), 5)
    assert finding.title == "Index out of range in aten.embedding at compiled_ids.py:5, raised at compiled_ids.py:7 by the sync"


def test_with_the_checks_off_a_compiled_program_gives_xlas_result(tmp_path: Path) -> None:
    script = tmp_path / "clamped.py"
    script.write_text(
        "import torch, torch.nn.functional as F\n"
        "import tputrace.backend\n"
        "rows_of = torch.compile(lambda ids, table: F.embedding(ids, table), backend='tpu')\n"
        "rows = rows_of(torch.tensor([1, 5], device='tpu'), torch.arange(15.0, device='tpu').reshape(5, 3))\n"
        "print(rows.tolist()[0])\n"
    )
    completed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600,
        env={**os.environ, "TPUTRACE_INDEX_CHECKS": "0", "PYTHONPATH": str(REPO)},
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[3.0, 4.0, 5.0]"


def test_one_hot_in_a_compiled_program() -> None:
    """one_hot is routed by hand in eager mode, where its classes are checked; traced by torch.compile
    (SwitchTransformers' router) the check met a traced tensor with no buffer and Dynamo failed."""
    compiled = torch.compile(lambda ids: F.one_hot(ids, num_classes=5).float() * 3, backend="tpu")
    ids = _ids([0, 4, 2], "cpu")
    assert torch.equal(host(compiled(ids.to("tpu"))), F.one_hot(ids, num_classes=5).float() * 3)


def test_a_traced_run_of_code_that_does_not_hash_records_its_line(tmp_path: Path) -> None:
    """The recorder finds the user's line in code whose constants include a dict, as Dynamo's rewritten code can."""
    script = tmp_path / "rewritten.py"
    script.write_text(
        "import types, torch\n"
        "def body(table, ids):\n"
        "    return table[ids] * 2\n"
        "code = body.__code__.replace(co_consts=body.__code__.co_consts + ({'unhashable': 1},))\n"
        "rows_of = types.FunctionType(code, globals())\n"
        "print(rows_of(torch.arange(6.0, device='tpu'), torch.tensor([1, 5], device='tpu')).sum().item())\n"
    )
    trace = tmp_path / "run.tptrace"
    assert main(["run", "--no-summary", "--mode", "strict", "-o", str(trace), str(script)]) == 0
    import tputrace

    with tputrace.open(trace) as opened:
        lines = {(op.source.file, op.source.line) for op in opened.records("ops") if op.source is not None and op.op == "aten.mul.Tensor"}
    assert lines == {(str(script), 3)}
