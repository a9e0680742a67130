"""Child processes under `tputrace run`: the parent's trace stays whole, and a child forked before the
parent's first tpu op, or started as a fresh interpreter that uses the tpu (spawn, forkserver, a
Python command importing the backend), is recorded in the same trace under a rank of its own (real
runs, real JAX)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tputrace
from tputrace.forks import fork_origins, forks_dir
from tputrace.store.reader import Trace
from tputrace.store.writer import TraceWriter
from tputrace.summary import header_lines, summarize

REPO_ROOT = Path(tputrace.__file__).resolve().parent.parent
RUN_TIMEOUT_S = 300


def _run(tmp_path: Path, body: str, *run_options: str, script_args: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`tputrace run` of a script written to tmp_path; returns the finished process and the trace's path."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    trace_path = tmp_path / "train.tptrace"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "tputrace.cli.main", "run", *run_options, "-o", str(trace_path), str(script), *script_args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=tmp_path,
        env=environment,
    )
    assert result.returncode == 0, result.stderr
    assert "could not be stored" not in result.stderr, result.stderr
    assert not forks_dir(trace_path).exists()
    return result, trace_path


def _printed(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """What the script printed as `name json` lines."""
    values = {}
    for line in result.stdout.splitlines():
        name, _, value = line.partition(" ")
        values[name] = json.loads(value)
    return values


def _op_counts(trace: Trace, rank: int) -> dict[str, int]:
    return dict(trace.sql("SELECT s.text, COUNT(*) FROM ops o JOIN strings s ON s.id = o.op_sid WHERE o.rank = ? GROUP BY s.text", (rank,)))


def test_a_child_forked_before_the_first_tpu_op_is_recorded_as_its_own_rank(tmp_path: Path) -> None:
    result, trace_path = _run(
        tmp_path,
        """
        import json, os, sys
        import torch
        print("parent_pid", os.getpid(), flush=True)
        pid = os.fork()
        if pid == 0:
            x = torch.arange(16.0, device="tpu").reshape(4, 4)
            print("child", json.dumps([os.getpid(), (x @ x).sum().item()]), flush=True)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        a = torch.arange(16.0, device="tpu").reshape(4, 4) / 16
        for _ in range(3):
            a = torch.relu(a @ a - 0.1)
        print("parent", a.sum().item())
        """,
    )
    printed = _printed(result)
    child_pid, child_value = printed["child"]
    cpu = torch_cpu_values()
    assert child_value == pytest.approx(cpu["child"])
    assert printed["parent"] == pytest.approx(cpu["parent"], rel=1e-5)
    assert result.stderr.count("tputrace: trace saved to") == 1
    with tputrace.open(trace_path) as trace:
        assert trace.sql("PRAGMA integrity_check") == [("ok",)]
        runs = {run.rank: run for run in trace.runs}
        assert sorted(runs) == [0, 1]
        assert runs[0].pid == printed["parent_pid"] and runs[1].pid == child_pid
        assert runs[0].exit_status == 0 and runs[1].exit_status == 0 and runs[1].world_size == 1
        origin = fork_origins(trace.meta)[1]
        assert (origin.pid, origin.parent_rank, origin.parent_pid) == (child_pid, 0, printed["parent_pid"])
        parent_ops, child_ops = _op_counts(trace, 0), _op_counts(trace, 1)
        assert parent_ops["aten.mm.default"] == 3 and parent_ops["aten.relu.default"] == 3
        assert child_ops["aten.mm.default"] == 1 and "aten.relu.default" not in child_ops
        assert trace.count("compiles", where="rank = 1") >= 1
        assert [sync.kind for sync in trace.records("syncs", where="rank = 1")] == ["item"]
        assert trace.distributed_ranks == [0] and list(trace.forked_ranks) == [1]
        assert dict(header_lines(summarize(trace, rank=1)))["run"].startswith("train.py · rank 1 (a forked process) · ")
    assert "forked processes: 1" in result.stderr
    assert f"rank 1: process {child_pid}, forked from rank 0" in result.stderr


def torch_cpu_values() -> dict[str, float]:
    """The values the fork scripts compute, on the CPU."""
    import torch

    x = torch.arange(16.0).reshape(4, 4)
    return {"child": (x @ x).sum().item(), "parent": _relu_matmuls_cpu(3)}


def test_multiprocessing_fork_children_are_recorded_with_their_exit(tmp_path: Path) -> None:
    result, trace_path = _run(
        tmp_path,
        """
        import json, multiprocessing
        import torch

        def square_sum(results):
            results.put((torch.arange(6.0, device="tpu") ** 2).sum().item())

        def fail_after_an_op():
            torch.ones(3, device="tpu").add_(1).sum().item()
            raise ValueError("the child failed")

        if __name__ == "__main__":
            context = multiprocessing.get_context("fork")
            host_only = context.Process(target=sorted, args=([3, 1, 2],))
            host_only.start()
            host_only.join()
            results = context.Queue()
            good = context.Process(target=square_sum, args=(results,))
            good.start()
            value = results.get()
            good.join()
            bad = context.Process(target=fail_after_an_op)
            bad.start()
            bad.join()
            print("children", json.dumps([good.pid, bad.pid, bad.exitcode, value, host_only.exitcode]))
        """,
    )
    good_pid, bad_pid, bad_exit, value, host_only_exit = _printed(result)["children"]
    assert host_only_exit == 0
    assert value == pytest.approx(sum(number**2 for number in range(6))) and bad_exit == 1
    with tputrace.open(trace_path) as trace:
        origins = fork_origins(trace.meta)
        ranks_by_pid = {origin.pid: rank for rank, origin in origins.items()}
        assert len(origins) == 2 and set(ranks_by_pid) == {good_pid, bad_pid}
        runs = {run.rank: run for run in trace.runs}
        good, bad = runs[ranks_by_pid[good_pid]], runs[ranks_by_pid[bad_pid]]
        assert good.exit_status == 0 and good.error is None
        assert bad.exit_status == 1 and "ValueError: the child failed" in bad.error
        assert "aten.pow.Tensor_Scalar" in _op_counts(trace, good.rank)
        assert "aten.add_.Tensor" in _op_counts(trace, bad.rank)
        assert trace.count("ops", where="rank = 0") == 0


def test_a_child_that_ends_through_os_exit_keeps_its_rows_and_exit_status(tmp_path: Path) -> None:
    result, trace_path = _run(
        tmp_path,
        """
        import os, subprocess
        import torch
        pid = os.fork()
        if pid == 0:
            x = torch.ones(2, device="tpu")
            print("child", x.sum().item(), flush=True)
            for _ in range(5):
                x = x * 1.5
            os._exit(7)
        os.waitpid(pid, 0)
        executed = os.fork()
        if executed == 0:
            os.execv("/bin/true", ["true"])
        os.waitpid(executed, 0)
        subprocess.run(["true"], preexec_fn=lambda: None, check=True)
        print("parent", (torch.ones(3, device="tpu") * 2).sum().item())
        """,
    )
    assert _printed(result)["parent"] == 6.0
    with tputrace.open(trace_path) as trace:
        runs = {run.rank: run for run in trace.runs}
        assert sorted(runs) == [0, 1] and runs[0].finished and runs[1].finished
        assert runs[1].exit_status == 7 and runs[1].error is None
        # The five multiplications were still deferred at os._exit: ending the recording ran and wrote them.
        assert _op_counts(trace, 1)["aten.mul.Tensor"] == 5
        assert "aten.mul.Tensor" in _op_counts(trace, 0)
    assert "rank 1: process" in result.stderr and "exit 7" in result.stderr


def test_a_multiprocessing_child_ending_through_os_exit_keeps_its_last_ops(tmp_path: Path) -> None:
    result, trace_path = _run(
        tmp_path,
        """
        import json, multiprocessing, os
        import torch

        def train_then_exit(results):
            x = torch.ones(4, device="tpu")
            for _ in range(200):
                x = torch.relu(x * 1.01 - 0.001)
            results.put(x.sum().item())
            for _ in range(30):
                x = x + 1
            os._exit(0)

        if __name__ == "__main__":
            results = multiprocessing.get_context("fork").Queue()
            child = multiprocessing.get_context("fork").Process(target=train_then_exit, args=(results,))
            child.start()
            value = results.get()
            child.join()
            print("child", json.dumps([child.pid, child.exitcode, value]))
        """,
    )
    child_pid, exit_code, value = _printed(result)["child"]
    assert exit_code == 0 and value == pytest.approx(_relu_chain_cpu(), rel=1e-6)
    with tputrace.open(trace_path) as trace:
        (rank,) = [rank for rank, origin in fork_origins(trace.meta).items() if origin.pid == child_pid]
        child_ops = _op_counts(trace, rank)
        assert child_ops["aten.relu.default"] == 200 and child_ops["aten.add.Tensor"] == 30
        run = next(run for run in trace.runs if run.rank == rank)
        assert run.finished and run.exit_status == 0


def _relu_chain_cpu() -> float:
    import torch

    x = torch.ones(4, dtype=torch.float32)
    for _ in range(200):
        x = torch.relu(x * 1.01 - 0.001)
    return x.sum().item()


def test_spawn_and_forkserver_children_of_a_script_without_the_backend_import_use_the_tpu_as_ranks_of_their_own(tmp_path: Path) -> None:
    result, trace_path = _run(
        tmp_path,
        """
        import glob, json, multiprocessing, os, sys
        import torch
        import torch.multiprocessing as torch_multiprocessing

        DEVICE = torch.device("tpu")  # run again at the top of each spawned child, which never imports the backend

        def matmuls(results, count):
            x = torch.arange(16.0, device=DEVICE).reshape(4, 4) / 16
            for _ in range(count):
                x = torch.relu(x @ x - 0.1)
            results.put((os.getpid(), x.sum().item()))

        def indexed_matmuls(index, results):
            matmuls(results, index + 1)

        def host_only(results):
            results.put((os.getpid(), float(sum(range(10)))))

        if __name__ == "__main__":
            forks_dir = sys.argv[1]
            values = {}
            for method, target, args in (("spawn", host_only, ()), ("spawn", matmuls, (3,)), ("forkserver", matmuls, (2,))):
                context = multiprocessing.get_context(method)
                results = context.Queue()
                child = context.Process(target=target, args=(results, *args))
                child.start()
                pid, value = results.get()
                child.join()
                values[f"{method}-{target.__name__}"] = [pid, child.exitcode, value]
                if target is host_only:
                    print("host_only_files", json.dumps(glob.glob(os.path.join(forks_dir, "*.tptrace"))))
            results = torch_multiprocessing.get_context("spawn").SimpleQueue()
            torch_multiprocessing.spawn(indexed_matmuls, args=(results,), nprocs=2)
            values["torch-spawn"] = sorted(results.get() for _ in range(2))
            print("children", json.dumps(values))
        """,
        script_args=(str(tmp_path / "train.forks"),),
    )
    printed = _printed(result)
    assert printed["host_only_files"] == []
    children = printed["children"]
    torch_spawned = {pid: value for pid, value in children.pop("torch-spawn")}
    assert all(exit_code == 0 for _, exit_code, _ in children.values())
    assert children["spawn-host_only"][2] == 45.0
    assert children["spawn-matmuls"][2] == pytest.approx(_relu_matmuls_cpu(3), rel=1e-5)
    with tputrace.open(trace_path) as trace:
        origins = fork_origins(trace.meta)
        by_pid = {origin.pid: origin for origin in origins.values()}
        assert set(by_pid) == {children["spawn-matmuls"][0], children["forkserver-matmuls"][0], *torch_spawned}
        spawned, served = by_pid[children["spawn-matmuls"][0]], by_pid[children["forkserver-matmuls"][0]]
        assert (spawned.start_method, served.start_method) == ("spawn", "forkserver")
        assert {origin.parent_rank for origin in origins.values()} == {0}
        assert {origin.parent_pid for origin in origins.values()} == {trace.run.pid}
        assert _op_counts(trace, spawned.rank)["aten.mm.default"] == 3 and _op_counts(trace, served.rank)["aten.mm.default"] == 2
        assert _op_counts(trace, spawned.rank)["aten.relu.default"] == 3
        torch_spawned_matmuls = {_op_counts(trace, by_pid[pid].rank)["aten.mm.default"]: value for pid, value in torch_spawned.items()}
        assert sorted(torch_spawned_matmuls) == [1, 2] and {by_pid[pid].start_method for pid in torch_spawned} == {"spawn"}
        for count, value in torch_spawned_matmuls.items():
            assert value == pytest.approx(_relu_matmuls_cpu(count), rel=1e-5)
        runs = {run.rank: run for run in trace.runs}
        for origin in origins.values():
            run = runs[origin.rank]
            assert run.finished and run.exit_status == 0 and run.eager_mode == "DEFER_AND_FUSE"
            assert run.script == str(tmp_path / "train.py")
        assert trace.count("ops", where="rank = 0") == 0
    assert f"spawned by rank 0 (process {spawned.parent_pid})" in result.stderr
    assert "started through a forkserver by rank 0" in result.stderr


def _relu_matmuls_cpu(count: int) -> float:
    import torch

    x = torch.arange(16.0).reshape(4, 4) / 16
    for _ in range(count):
        x = torch.relu(x @ x - 0.1)
    return x.sum().item()


def test_a_python_command_that_imports_the_backend_is_recorded_with_its_command_line_and_exit_status(tmp_path: Path) -> None:
    (tmp_path / "other.py").write_text(
        textwrap.dedent(
            """
            import json, os, signal, sys
            import torch
            import tputrace.backend
            print(json.dumps([os.getpid(), (torch.ones(int(sys.argv[1]), device="tpu") * 3).sum().item()]), flush=True)
            ending = sys.argv[2]
            if ending == "sys.exit":
                sys.exit(3)
            if ending == "raise":
                raise ValueError("the command failed")
            if ending == "os._exit":
                os._exit(4)
            if ending == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            """
        )
    )
    result, trace_path = _run(
        tmp_path,
        """
        import json, os, subprocess, sys, time
        import torch
        exited = subprocess.run([sys.executable, "other.py", "5", "sys.exit"], capture_output=True, text=True)
        raised = subprocess.run([sys.executable, "other.py", "1", "raise"], capture_output=True, text=True)
        polled = subprocess.Popen([sys.executable, "other.py", "2", "os._exit"], stdout=subprocess.DEVNULL)
        while polled.poll() is None:
            time.sleep(0.05)
        killed = subprocess.run([sys.executable, "other.py", "1", "kill"], capture_output=True, text=True)
        host = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
        nested = ["-m", "tputrace.cli.main", "run", "--no-summary", "-o", "nested.tptrace", "other.py", "2", "sys.exit"]
        nested_exit = subprocess.run([sys.executable, *nested], capture_output=True).returncode
        (exited_pid, command_value), (raised_pid, _), (killed_pid, _) = (json.loads(done.stdout) for done in (exited, raised, killed))
        statuses = {
            "sys.exit": [exited_pid, exited.returncode],
            "raise": [raised_pid, raised.returncode],
            "os._exit": [polled.pid, polled.returncode],
            "kill": [killed_pid, killed.returncode],
        }
        print("statuses", json.dumps(statuses))
        print("values", json.dumps([command_value, int(host.stdout), nested_exit, (torch.ones(2, device="tpu") + 1).sum().item()]))
        """,
        "--mode",
        "strict",
    )
    statuses = _printed(result)["statuses"]
    command_value, host_pid, nested_exit, parent_value = _printed(result)["values"]
    assert (command_value, parent_value, nested_exit) == (15.0, 4.0, 3)
    assert {ending: returncode for ending, (_, returncode) in statuses.items()} == {"sys.exit": 3, "raise": 1, "os._exit": 4, "kill": -9}
    with tputrace.open(trace_path) as trace:
        origins = fork_origins(trace.meta)
        assert host_pid not in {origin.pid for origin in origins.values()}
        by_pid = {origin.pid: origin for origin in origins.values()}
        assert set(by_pid) == {pid for pid, _ in statuses.values()}
        assert {(origin.start_method, origin.parent_rank) for origin in origins.values()} == {("command", 0)}
        exited, raised, exited_at_once, killed = (next(run for run in trace.runs if run.rank == by_pid[pid].rank) for pid, _ in statuses.values())
        assert exited.script == str(tmp_path / "other.py") and exited.argv == ("5", "sys.exit")
        assert all(run.finished and run.eager_mode == "DEFER_NEVER" for run in (exited, raised, exited_at_once))
        assert (exited.exit_status, raised.exit_status, exited_at_once.exit_status) == (3, 1, 4)
        assert exited.error is None and "ValueError: the command failed" in raised.error
        assert not killed.finished and killed.exit_status == 128 + 9  # written by the parent: SIGKILL left no end record
        assert _op_counts(trace, exited.rank)["aten.mul.Tensor"] == 1
    assert "started as a command by rank 0" in result.stderr and "exit status not seen" not in result.stderr
    summary_lines = {line.strip().partition(":")[0]: line for line in result.stderr.splitlines()}
    for run in (exited, raised, exited_at_once):
        line = summary_lines[f"rank {run.rank}"]
        assert f"process {run.pid}, started as a command by rank 0" in line and line.endswith(f", exit {run.exit_status}")
    assert summary_lines[f"rank {killed.rank}"].endswith(", exit 137 (killed by SIGKILL) without an end record: its last ops may be missing")
    info = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "info", str(trace_path)], capture_output=True, text=True, check=True)
    assert "exit 3" in info.stdout and "exit 4" in info.stdout and "raised ValueError: the command failed" in info.stdout
    with tputrace.open(tmp_path / "nested.tptrace") as nested:  # a nested `tputrace run` records on its own
        assert nested.ranks == [0] and not fork_origins(nested.meta) and nested.run.argv == ("2", "sys.exit")
        assert nested.run.exit_status == 3


def test_data_loader_workers_forked_after_the_runtime_started_leave_the_trace_whole(tmp_path: Path) -> None:
    result, trace_path = _run(
        tmp_path,
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        model = torch.nn.Linear(8, 2).to("tpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = 0
        for inputs, labels in DataLoader(data, batch_size=16, num_workers=2, multiprocessing_context="fork"):
            loss = torch.nn.functional.cross_entropy(model(inputs.to("tpu")), labels.to("tpu"))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            batches += 1
        print("batches", batches)
        """,
    )
    assert _printed(result)["batches"] == 4
    with tputrace.open(trace_path) as trace:
        assert trace.ranks == [0] and not fork_origins(trace.meta)
        assert len(list(trace.records("steps", where="source = 'optimizer'"))) == 4
        assert _op_counts(trace, 0)["aten.addmm.default"] == 4
    assert "forked processes" not in result.stderr


def test_children_of_nproc_ranks_get_ranks_of_their_own(tmp_path: Path) -> None:
    result, trace_path = _run(
        tmp_path,
        """
        import json, os, sys
        import torch
        rank = int(os.environ["RANK"])
        pid = os.fork()
        if pid == 0:
            torch.ones(3, device="tpu").mul_(rank + 1).sum().item()
            sys.exit(0)
        os.waitpid(pid, 0)
        print(f"rank{rank}", json.dumps([os.getpid(), pid, (torch.ones(2, device="tpu") + rank).sum().item()]))
        """,
        "--nproc",
        "2",
    )
    printed = _printed(result)
    assert [printed[f"rank{rank}"][2] for rank in (0, 1)] == [2.0, 4.0]
    with tputrace.open(trace_path) as trace:
        origins = fork_origins(trace.meta)
        assert {(origin.pid, origin.parent_rank, origin.parent_pid) for origin in origins.values()} == {
            (printed[f"rank{rank}"][1], rank, printed[f"rank{rank}"][0]) for rank in (0, 1)
        }
        assert sorted(trace.ranks) == [0, 1, 2, 3] and {run.world_size for run in trace.runs} == {2}
        assert trace.distributed_ranks == [0, 1] and summarize(trace).ranks == (0, 1)
        for rank, origin in origins.items():
            assert "aten.mul_.Tensor" in _op_counts(trace, rank)
            assert "aten.mul_.Tensor" not in _op_counts(trace, origin.parent_rank)
        assert not any(run.error for run in trace.runs)
    assert "merged 2 of 2 ranks and 2 forked processes" in result.stderr


def test_a_writer_told_not_to_create_its_file_keeps_rows_until_it_does(tmp_path: Path) -> None:
    unused_path, used_path = tmp_path / "unused.tptrace", tmp_path / "used.tptrace"
    TraceWriter(unused_path, create_file=False).close()
    assert not unused_path.exists()
    writer = TraceWriter(used_path, create_file=False)
    writer.append("annotations", (0, writer.intern("kept in memory"), "annotate", 0, 1, None, 0))
    writer.flush()
    assert not used_path.exists()
    writer.create_file()
    writer.close()
    with tputrace.open(used_path) as trace:
        assert [trace.string(sid) for (sid,) in trace.sql("SELECT name_sid FROM annotations")] == ["kept in memory"]


def test_a_forked_child_never_writes_into_the_parents_trace_file(tmp_path: Path) -> None:
    trace_path = tmp_path / "writer.tptrace"
    writer = TraceWriter(trace_path)
    writer.append("annotations", (0, writer.intern("before fork"), "annotate", 0, 1, None, 0))
    pid = os.fork()
    if pid == 0:
        writer.append("annotations", (0, writer.intern("in the child"), "annotate", 2, 1, None, 0))
        writer.close()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    writer.append("annotations", (0, writer.intern("after fork"), "annotate", 4, 1, None, 0))
    writer.close()
    assert status == 0
    with tputrace.open(trace_path) as trace:
        names = [trace.string(sid) for (sid,) in trace.sql("SELECT name_sid FROM annotations ORDER BY start_ns")]
        assert names == ["before fork", "after fork"]
        assert trace.sql("PRAGMA integrity_check") == [("ok",)]
