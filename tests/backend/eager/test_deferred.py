"""DeferAndFuse: fused programs, flush triggers, caching, recompile reasons, and parity with strict mode."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

import tputrace
from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.dispatch import dispatcher
from tputrace.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _run(tmp_path: Path, name: str, source: str, *args: str) -> Path:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source))
    trace_path = tmp_path / f"{name}.tptrace"
    assert main(["run", "-o", str(trace_path), str(script), *args]) == 0
    return trace_path


def test_deferred_results_match_strict_and_fuse_into_one_program() -> None:
    torch.manual_seed(0)
    inputs = torch.randn(8, 16)
    weights = torch.randn(16, 4)
    with eager(EagerMode.DEFER_NEVER):
        strict = host(torch.relu(inputs.to("tpu") @ weights.to("tpu")).sum(dim=0) * 2)
    with eager(EagerMode.DEFER_AND_FUSE):
        before = len(dispatcher.executor.programs)
        deferred = torch.relu(inputs.to("tpu") @ weights.to("tpu")).sum(dim=0) * 2
        assert len(dispatcher.executor.graphs) == 1 and len(dispatcher.executor.programs) == before
        result = host(deferred)
        assert len(dispatcher.executor.programs) == before + 1
    assert torch.allclose(result, strict, atol=1e-5)


def test_a_like_op_of_a_view_and_a_masked_scalar_write_record_one_op_each() -> None:
    """`zeros_like` (and `ones_like`, `full_like`, `empty_like`) of a view run as their factory, which
    reads no tensor: no op computes the view's values for them. `x[mask] = 1.5` records its value as one `scalar_tensor` op,
    not a host copy and a fill."""
    base = torch.arange(12.0).reshape(3, 4)
    with eager(EagerMode.DEFER_AND_FUSE):
        chip = base.to("tpu")
        executor = dispatcher.executor
        executor.flush("explicit")
        made = [
            torch.zeros_like(chip.t()), torch.ones_like(chip[:, 1:], dtype=torch.int32),
            torch.full_like(chip.t(), 2.5), torch.empty_like(chip.view(torch.int32).t()).fill_(3),
        ]
        names = [plan.op_name for plan, _ in executor.graphs[0].nodes]
        assert names == ["aten.zeros.default", "aten.ones.default", "aten.full.default", "aten.zeros.default", "aten.fill.Scalar"]
        assert all(refs == () or refs[0][0] == 2 for _, refs in executor.graphs[0].nodes[:4])  # no tensor read, at most a number
        written = chip.clone()
        executor.flush("explicit")
        written[written.gt(5)] = 1.5
        names = [plan.op_name for plan, _ in executor.graphs[0].nodes]
        assert names == ["aten.gt.Scalar", "aten.scalar_tensor.default", "aten.index_put.default"]
        results = [host(tensor) for tensor in [*made, written]]
    expected = [
        torch.zeros_like(base.t()), torch.ones_like(base[:, 1:], dtype=torch.int32),
        torch.full_like(base.t(), 2.5), torch.empty_like(base.view(torch.int32).t()).fill_(3),
        torch.where(base > 5, 1.5, base),
    ]
    for got, want in zip(results, expected):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_dead_intermediates_are_not_program_outputs() -> None:
    x = torch.ones(4, device="tpu")
    with eager(EagerMode.DEFER_AND_FUSE):
        graph_inputs = x * 2
        kept = (graph_inputs + 1) * 3
        del graph_inputs
        executor = dispatcher.executor
        before = set(executor.programs)
        executor.flush("explicit")
        (new_key,) = set(executor.programs) - before
        assert executor.programs[new_key].n_ops == 3 and executor.programs[new_key].n_outputs == 1
        assert host(kept).tolist() == [9.0] * 4


def test_item_in_the_loop_is_one_sync_per_step_at_its_line(tmp_path: Path) -> None:
    trace_path = _run(
        tmp_path,
        "item_loop",
        """
        import torch
        model = torch.nn.Linear(8, 1).to("tpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.randn(16, 8).to("tpu")
        for step in range(5):
            loss = model(data).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            print(loss.item())
        """,
    )
    with tputrace.open(trace_path) as trace:
        syncs = [sync for sync in trace.records("syncs") if sync.kind == "item"]
        assert len(syncs) == 5
        assert {sync.source.line for sync in syncs} == {11}
        assert sorted(sync.step for sync in syncs) == [1, 2, 3, 4, 5]
        assert all(sync.dur_ns >= 0 for sync in syncs)


def test_changing_sequence_length_recompiles_with_the_dim_named(tmp_path: Path) -> None:
    trace_path = _run(
        tmp_path,
        "varying_length",
        """
        import torch
        embedding = torch.nn.Embedding(100, 16).to("tpu")
        head = torch.nn.Linear(16, 1).to("tpu")
        optimizer = torch.optim.SGD([*embedding.parameters(), *head.parameters()], lr=0.1)
        for length in (8, 12, 16, 20):
            tokens = torch.randint(0, 100, (4, length)).to("tpu")
            loss = head(embedding(tokens)).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        """,
    )
    with tputrace.open(trace_path) as trace:
        recompiles = [compile for compile in trace.records("compiles") if compile.reason == "recompile" and compile.kind == "fused"]
        assert recompiles
        assert any("dim 1: 8 -> 12" in (compile.diff or "") for compile in recompiles), [compile.diff for compile in recompiles]


def test_a_line_flushing_two_graphs_per_step_names_the_changing_dim_for_each(tmp_path: Path) -> None:
    """Two host reads on one line flush two different graphs each step; each graph's recompile for a
    new length is compared with its own counterpart of the step before, not with the line's last graph."""
    trace_path = _run(
        tmp_path,
        "two_reads",
        """
        import torch
        for length in (8, 12, 16):
            x = torch.ones(4, length, device="tpu")
            flag = bool((x * 2).sum() > 0) and bool(x.bool().all())
            w = torch.zeros(3, device="tpu", requires_grad=True)
            torch.optim.SGD([w], lr=0.1).step()
        """,
    )
    with tputrace.open(trace_path) as trace:
        at_line = [compile for compile in trace.records("compiles") if compile.kind == "fused" and compile.step in (1, 2) and "[4," in (compile.signature or "")]
        assert len(at_line) == 4, [(compile.name, compile.signature) for compile in at_line]
        assert all(compile.reason == "recompile" for compile in at_line), [(compile.name, compile.reason) for compile in at_line]
        diffs = sorted(compile.diff for compile in at_line)
        assert sum("dim 1: 8 -> 12" in diff for diff in diffs) == 2 and sum("dim 1: 12 -> 16" in diff for diff in diffs) == 2, diffs
        assert not any("structure change" in diff for diff in diffs), diffs


def test_a_recompile_names_the_line_of_the_changing_op_past_view_reads(tmp_path: Path) -> None:
    """A view read before the changing op is a node of the graph without an op record of its own;
    the reason still names the changing op's line."""
    trace_path = _run(
        tmp_path,
        "view_then_shape",
        """
        import torch, tputrace
        base = torch.randn(4, 8, device="tpu"); weight = torch.randn(8, 8, device="tpu")
        for rows in (2, 3, 4, 2):
            sliced = base[:, 1:] * 2
            noise = torch.randn(rows, 8, device="tpu")
            total = (noise @ weight).sum() + sliced.sum()
            print(total.item()); tputrace.step()
        """,
    )
    with tputrace.open(trace_path) as trace:
        shape_changes = [compile.diff for compile in trace.records("compiles") if compile.reason == "recompile" and "dim 0" in (compile.diff or "")]
        assert shape_changes and all("aten.normal_.default (view_then_shape.py:6)" in diff for diff in shape_changes), shape_changes


def test_steady_state_gpt_step_compiles_nothing_after_step_one(tmp_path: Path) -> None:
    """The first step compiles the forward and backward, the optimizer's new state and its update;
    the second runs the same programs (the update reads the state as inputs in both)."""
    trace_path = tmp_path / "gpt.tptrace"
    assert main(["run", "-o", str(trace_path), str(EXAMPLES / "gpt_train.py"), "--steps", "5"]) == 0
    with tputrace.open(trace_path) as trace:
        assert trace.count("steps", where="source = 'optimizer'") == 5
        assert trace.count("compiles", where="step = 0") == 3
        assert trace.count("compiles", where="step >= 1") == 0
        assert trace.count("executions") > 0 and trace.count("fusions") > 0


def test_in_place_update_keeps_an_array_another_tensor_shares() -> None:
    """`copy_` leaves both tensors holding one array: the in-place update must not donate it."""
    source = torch.arange(4.0).to("tpu")
    shared_in_strict = torch.zeros(4, device="tpu")
    shared_in_strict.copy_(source)
    with eager(EagerMode.DEFER_AND_FUSE):
        shared_in_strict.add_(1)
        shared_in_deferred = torch.zeros(4, device="tpu")
        shared_in_deferred.copy_(source)
        host(shared_in_deferred)
        shared_in_deferred.mul_(3)
        assert host(shared_in_strict).tolist() == [1.0, 2.0, 3.0, 4.0]
        assert host(shared_in_deferred).tolist() == [0.0, 3.0, 6.0, 9.0]
        assert host(source).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_pending_value_two_tensors_hold_is_one_program_output() -> None:
    """`copy_` of a pending value leaves two buffers holding it: the flush returns it once and
    fills both, and a value asked for beside them (an extra) comes out of the same program."""
    with eager(EagerMode.DEFER_AND_FUSE):
        base = torch.arange(6.0).to("tpu")
        host(base)
        doubled = base * 2
        shared = torch.zeros(6, device="tpu")
        shared.copy_(doubled)
        assert shared._buf.array is doubled._buf.array  # one pending value, two owners
        shifted = doubled + 1
        assert host(shifted).tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
        results = dispatcher.executor.last_outputs  # the flush's program outputs, in order
        assert len(results) == 2  # doubled (held twice) and shifted
        assert shared._buf.array is doubled._buf.array is results[0]
        assert host(shared).tolist() == host(doubled).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_in_place_update_of_an_unshared_array_donates_it() -> None:
    shape = (5, 7, 3)
    with eager(EagerMode.DEFER_AND_FUSE):
        updated = torch.ones(shape).to("tpu")
        updated.add_(1)
        assert host(updated).sum().item() == 2.0 * 105
        programs = [
            program for (structure, in_specs), program in dispatcher.executor.programs.items()
            if program.n_ops == 1 and in_specs and in_specs[0] == (shape, torch.float32)
        ]
        assert programs and all(program.donate == (0,) for program in programs)


def test_size_cap_flush_between_view_reads_keeps_their_values() -> None:
    """A flush at the size cap while an op's view inputs are pending must not lose them (re-running
    the flushed graph read arrays it had donated)."""

    def run() -> list[list[float]]:
        base = torch.arange(12.0).reshape(3, 4).to("tpu")
        base.mul_(2)
        sums = []
        for _ in range(6):
            snapshot = base * 1
            base.add_(1)
            sums.append(snapshot[1] + snapshot[2])
        return [host(total).tolist() for total in sums]

    with eager(EagerMode.DEFER_NEVER):
        strict = run()
    with eager(EagerMode.DEFER_AND_FUSE):
        executor = dispatcher.executor
        size_cap = executor.size_cap
        executor.size_cap = 4
        try:
            deferred = run()
        finally:
            executor.size_cap = size_cap
    assert deferred == strict


def test_user_threads_share_the_chip_in_defer_and_fuse() -> None:
    """Four threads train their own weights at once: each matches the CPU, none sees another's
    pending values flushed, donated or replaced in the middle of its op (they used to: errors or NaN)."""
    import threading

    def train(seed: int, device: str) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        weight, inputs = torch.randn(64, 64, generator=generator), torch.randn(16, 64, generator=generator)
        weight, inputs = weight.to(device).requires_grad_(), inputs.to(device)
        for _ in range(5):
            (inputs @ weight).tanh().pow(2).mean().backward()
            with torch.no_grad():
                weight -= 0.1 * weight.grad
                weight.grad = None
        return weight.detach().to("cpu")

    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            results[seed] = train(seed, "tpu")
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    with eager(EagerMode.DEFER_AND_FUSE):
        for _ in range(3):
            threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    assert not errors, errors
    for seed, weight in results.items():
        assert torch.allclose(weight, train(seed, "cpu"), atol=1e-5), seed


def test_peak_memory_counts_a_fused_programs_temporaries() -> None:
    """A step fused into one program keeps its activations in XLA's temporaries, not in tensors:
    the peak still counts them (here a 4096x1024 float32 activation, 16 MiB, dwarfs the weights)."""
    activation_bytes = 4096 * 1024 * 4
    peaks = {}
    for mode in (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE):
        with eager(mode):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64)).to("tpu")
            inputs = torch.randn(4096, 64, device="tpu")
            torch.tpu.synchronize()
            torch.tpu.reset_peak_memory_stats()
            model(inputs).pow(2).mean().backward()
            torch.tpu.synchronize()
            peaks[mode] = torch.tpu.max_memory_allocated() - torch.tpu.memory_allocated()
    assert all(peak >= activation_bytes for peak in peaks.values()), peaks


def test_a_host_check_inside_an_op_keeps_the_values_the_op_collected() -> None:
    """An op whose meta kernel refuses its inputs is checked on the host, which flushes the pending
    graph; the inputs it already read (a pending transpose view) must come out of that flush.
    Hugging Face MoE layers meet this in `grouped_mm` (21 architectures failed in the zoo)."""
    torch.manual_seed(0)
    tokens, weights, offsets = torch.randn(6, 8), torch.randn(2, 8, 8), torch.tensor([2, 6], dtype=torch.int32)
    expected = torch.nn.functional.grouped_mm(tokens * 2, (weights + 1).transpose(-2, -1), offs=offsets)
    with eager(EagerMode.DEFER_AND_FUSE):
        pending_tokens = tokens.to("tpu") * 2
        pending_weights = (weights.to("tpu") + 1).transpose(-2, -1)
        result = host(torch.nn.functional.grouped_mm(pending_tokens, pending_weights, offs=offsets.to("tpu")))
    torch.testing.assert_close(result, expected)
