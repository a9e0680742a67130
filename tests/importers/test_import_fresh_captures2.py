"""Captures made by other tools on this machine and read as a new user would read them: a compiled function whose
graph breaks on a value, a jitted step whose script shares its file's name with JAX's own module, two gloo ranks'
torch.profiler files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import tputrace
from tputrace.cli.main import main

# A branch on a tensor's value: the graph breaks at line 5, and the code resumed after it is compiled again for each
# new value (Dynamo guards on it), the last guard failing with the place in torch that evaluated it.
TORCH_VALUE_BRANCH = textwrap.dedent("""\
    import torch

    def normalize(x):
        m = x.mean()
        if m.item() > 0:  # a branch on a value
            x = x - m
        return x.relu()

    g = torch.compile(normalize, backend="eager")
    for value in (1.0, 2.0, -1.0):
        g(torch.full((4,), value))
""")

# A compiled DDP model (one gloo process): Dynamo breaks its graph inside DDP's forward, called at line 8, and compiles
# contextlib's frames (`helper (contextlib.py)`), which break again.
TORCH_COMPILED_DDP = textwrap.dedent("""\
    import os, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = torch.compile(DDP(torch.nn.Linear(8, 4)), backend="eager")
    for _ in range(2):
        model(torch.randn(2, 8)).sum().backward()
    dist.destroy_process_group()
""")


def _import(paths: list[Path], output: Path) -> tputrace.Trace:
    assert main(["import", *map(str, paths), "-o", str(output)]) == 0
    return tputrace.open(output)


def test_torch_trace_logs_name_a_guard_on_a_value_and_a_break_inside_a_library(tmp_path: Path) -> None:
    import os
    import re

    from captures import _run, _torch_trace, free_port

    from tputrace.analysis import analyze_path

    folder, script = _torch_trace(tmp_path, "value_branch.py", TORCH_VALUE_BRANCH, "trace")
    trace = _import([folder], tmp_path / "branch.tptrace")
    diffs = [row.diff for row in trace.records("compiles") if row.diff]
    assert len(diffs) == 2, diffs
    # Each failed guard, then the code it guards and where: the log's comment, not its raw text with Dynamo's
    # shortened path and the place in torch that evaluated the guard.
    for diff in diffs:
        guard, _, place = diff.partition(" (if m.item() > 0:")
        assert guard.startswith(("1/0: ___stack0", "1/1: ___stack0")) and "#" not in guard, diff
        assert f"{script.name}:5 in torch_dynamo_resume_in_normalize_at_5)" in place, diff
        assert "evaluate_expr" not in diff, diff

    # A graph break inside a library's code (DDP's forward): its title names the library's place the import names
    # (`(in distributed.py:1757, _pre_forward)`) and the user's line that reached it, what broke, without that frame,
    # and a function, not the tail of a library compile's name `helper (contextlib.py)` (`py)()`).
    ddp_script = tmp_path / "compiled_ddp.py"
    ddp_script.write_text(TORCH_COMPILED_DDP)
    _run(ddp_script, free_port(), env={**os.environ, "TORCH_TRACE": str(tmp_path / "ddp_trace")})
    output = tmp_path / "ddp.tptrace"
    _import([tmp_path / "ddp_trace"], output)
    breaks = [finding for finding in analyze_path(output).findings if finding.analyzer == "graph_breaks"]
    assert breaks and all(finding.line == 8 for finding in breaks), [(finding.title, finding.line) for finding in breaks]
    for finding in breaks:
        match = re.fullmatch(r"Graph break at (?:\w+\.py:\d+ in \w+\(\), reached from )?compiled_ddp\.py:8(?: in \w+\(\))? "
                             r"\(([^()]+)\): (\w+)\(\) runs .*", finding.title)
        assert match is not None, finding.title
    assert any("distributed.py:" in finding.title and "reached from compiled_ddp.py:8" in finding.title
               for finding in breaks), [finding.title for finding in breaks]


# A `jax.pmap`ped step in a script named `pmap.py`, compiled inside the trace: JAX compiles its own wrapper `_fun` of
# `jax/_src/pmap.py` (`jit__fun`), which the Python tracer names by its base name, `pmap.py`, as the script's.
JAX_PMAP_SCRIPT = textwrap.dedent("""\
    import sys, jax, jax.numpy as jnp

    def train_step(w, x):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.1 * jax.lax.pmean(g, "batch")

    step = jax.pmap(train_step, axis_name="batch")
    w, x = jnp.ones((1, 16, 16)), jnp.ones((1, 8, 16))
    with jax.profiler.trace(sys.argv[1]):
        for i in range(2):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x)
        w.block_until_ready()
""")


def test_compile_of_a_library_function_named_like_the_script_is_placed_in_the_script(tmp_path: Path) -> None:
    from captures import _capture

    logdir = _capture(tmp_path, "pmap.py", JAX_PMAP_SCRIPT, "logdir")
    trace = _import([logdir], tmp_path / "pmap.tptrace")
    compiles = [row for row in trace.records("compiles") if row.kind == "xla" and row.name == "jit__fun"]
    assert compiles, [row.name for row in trace.records("compiles")]
    # JAX's `pmap.py:410 _fun` is no line of the 14-line script: its compile is placed where its program's HLO says.
    for row in compiles:
        assert row.source is not None and row.source.file == str(tmp_path / "pmap.py"), row.source
        assert 3 <= row.source.line <= 5, row.source


# Two DDP ranks over gloo under a profiling schedule, without stacks (one JSON per rank): rank 1 multiplies matrices
# of its own before each step, so rank 0 waits for it in every gradient all-reduce.
TORCH_DDP_EXTRA_OPS = textwrap.dedent("""\
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, schedule

    def run(rank, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)))
        x = torch.randn(8, 64)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                     on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank{rank}.json")) as prof:
            for _ in range(4):
                if rank == 1:
                    for _ in range(20):
                        torch.randn(256, 256) @ torch.randn(256, 256)
                model(x).sum().backward()
                prof.step()
        dist.barrier()
        os._exit(0)  # gloo's threads are not torn down under a busy host

    if __name__ == "__main__":
        os.makedirs(sys.argv[1], exist_ok=True)
        mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
""")


# Two DDP ranks over gloo calling a compiled step under a profiling schedule: rank 1's last batch is smaller (5 rows, not
# 8), so it compiles the step again in the last step while rank 0 waits in the gradients' all-reduce.
TORCH_DDP_LAST_BATCH = textwrap.dedent("""\
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, schedule

    def run(rank, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        model = DDP(torch.nn.Linear(16, 4))
        step = torch.compile(lambda x: model(x).sum(), backend="eager")
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                     on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank{rank}.json")) as prof:
            for i in range(4):
                step(torch.randn(8 if i < 3 or rank == 0 else 5, 16)).backward()
                prof.step()
        dist.barrier()
        os._exit(0)  # gloo's threads are not torn down under a busy host

    if __name__ == "__main__":
        os.makedirs(sys.argv[1], exist_ok=True)
        mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
""")


def test_gloo_ranks_name_their_host_and_the_late_ranks_own_work(tmp_path: Path) -> None:
    from captures import _capture, free_port

    from tputrace.analysis import analyze_path

    folder = _capture(tmp_path, "ddp_extra.py", TORCH_DDP_EXTRA_OPS, "ddp", free_port())
    output = tmp_path / "ddp.tptrace"
    trace = _import([folder], output)
    runs = sorted(trace.runs, key=lambda run: run.rank)
    # Kineto's `host_name` and each process's id: the ranks share one host's cores.
    assert len(runs) == 2 and runs[0].host and runs[0].host == runs[1].host, runs
    assert runs[0].pid and runs[1].pid and runs[0].pid != runs[1].pid, runs
    # Rank 1 is late for work it records (its own op calls), not for the host's scheduling of two processes.
    stragglers = [finding for finding in analyze_path(output).findings if finding.title.startswith("Straggler")]
    assert len(stragglers) == 1, [finding.title for finding in analyze_path(output).findings]
    assert "rank 1 makes op calls" in stragglers[0].title and "aten::mm ×20" in stragglers[0].title, stragglers[0].title
    assert "with_stack=True" in stragglers[0].explanation

    # Rank 1 compiles again in its last step, where rank 0 does not: it is late for that recompile.
    folder = _capture(tmp_path, "ddp_last_batch.py", TORCH_DDP_LAST_BATCH, "last_batch", free_port())
    _import([folder], tmp_path / "last_batch.tptrace")
    stragglers = [finding for finding in analyze_path(tmp_path / "last_batch.tptrace").findings
                  if finding.title.startswith("Straggler")]
    assert len(stragglers) == 1 and "rank 1 recompiles in its steps" in stragglers[0].title, stragglers
    assert "in step 3" in stragglers[0].title, stragglers[0].title


def test_an_event_of_a_run_after_its_op_is_not_the_runs_launch() -> None:
    """XLA:CPU gives a run's `wait for completion` its run id: where the host launched the run before the capture (a
    warm-up call not waited for), that wait, after the loop, is the only event of the id, and the run's ops, which ran
    in the loop's first steps, keep their own times (their steps) rather than the wait's (the `end` step after it)."""
    import numpy as np

    from tputrace.importers.xplane_runs import launched_at_ids

    run_ids = np.array([7, 9], dtype=np.uint64)
    launches = np.array([100, 5_000], dtype=np.int64)  # run 7 launched at 100 ns; run 9's only event is at 5000 ns
    ops = np.array([150, 200, 300], dtype=np.int64)
    wanted = np.array([7, 9, 9], dtype=np.uint64)
    assert launched_at_ids(run_ids, launches, wanted, np.ones(3, dtype=bool), ops).tolist() == [100, 200, 300]

