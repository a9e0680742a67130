"""`tputrace report` on imported captures whose findings were read wrong: a failed recompile that ended the run, two
DDP ranks that take turns arriving last, the collectives of a JAX loop that does not wait for each step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from captures import _capture, free_port, jax_processes_capture
from tputrace.cli.main import main

# A compiled function whose input is marked dynamic after it compiled for one size, while its code branches on that
# size: the recompile fails with a ConstraintViolationError, which is not caught, and the script dies there.
MARKED_DYNAMIC = textwrap.dedent("""\
    import torch

    def step(x):
        if x.shape[0] == 4:
            return x.sum()
        return (x * 2).sum()

    compiled = torch.compile(step)
    compiled(torch.randn(8, 16))
    y = torch.randn(4, 16)
    torch._dynamo.mark_dynamic(y, 0)
    compiled(y)
""")


def test_a_failed_recompile_that_ended_the_run_is_a_critical_finding_at_the_users_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "marked_dynamic.py"
    script.write_text(MARKED_DYNAMIC)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TORCH_TRACE": str(tmp_path / "trace")})
    assert result.returncode != 0 and "ConstraintViolationError" in result.stderr, result.stderr[-2000:]
    assert main(["import", str(tmp_path / "trace"), "-o", str(tmp_path / "md.tptrace")]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "md.tptrace"), "--json"]) == 0
    findings = [finding for finding in json.loads(capsys.readouterr().out)["findings"]
                if "ConstraintViolationError" in finding["explanation"]]
    assert len(findings) == 1, findings
    (finding,) = findings
    assert finding["severity"] == "critical"
    assert "stopped the run" in finding["title"]
    assert (os.path.basename(finding["file"] or ""), finding["line"]) == ("marked_dynamic.py", 4)
    assert "as dynamic but your code specialized it" in finding["explanation"]


# Two DDP ranks over gloo with a torch.compile'd model, profiled (one JSON per rank): each rank sleeps 150 ms before
# every other step, rank 0 before the even ones and rank 1 before the odd ones, so each waits for the other in turn.
TORCH_DDP_TURNS = textwrap.dedent("""\
    import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile

    def run(rank, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        net = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
        model = torch.compile(net)
        x = torch.randn(8, 16)
        model(x).sum().backward()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for step in range(4):
                if step % 2 == rank:
                    time.sleep(0.15)
                model(x).sum().backward()
        prof.export_chrome_trace(f"{out}/rank{rank}.json")
        dist.barrier()
        os._exit(0)  # as the shared gloo captures: gloo's threads are not torn down under a busy host

    if __name__ == "__main__":
        os.makedirs(sys.argv[1], exist_ok=True)
        mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
""")


def test_ranks_that_take_turns_arriving_last_have_no_straggler(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    capture = _capture(tmp_path, "ddp_turns.py", TORCH_DDP_TURNS, "turns", free_port())
    assert main(["import", str(capture), "-o", str(tmp_path / "turns.tptrace")]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "turns.tptrace"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    waits = {row["rank"]: row["wait_ns"] for row in report["results"]["collectives"]["wait_by_rank"]}
    # each rank waited for the other's sleeps: about as long as the other, not one rank waiting for the other
    assert min(waits.values()) > 0.5 * max(waits.values()), waits
    assert not [finding for finding in report["findings"] if "Straggler" in finding["title"]], report["findings"]


# One process of a two-process `jax.distributed` run on XLA:CPU (gloo collectives), a device each: a data-parallel step
# whose gradient is all-reduced, in a loop that does not wait for each step (its device work runs after the host's
# step markers end). Each process profiles its own log dir.
JAX_PROCESS_ASYNC = textwrap.dedent("""
    import sys, jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logdir, process, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process)
    import numpy as np, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    batch = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), PartitionSpec("d"))
    x = jax.make_array_from_callback((256, 128), batch, lambda index: np.ones((256, 128), np.float32)[index])
    step = jax.jit(lambda w, x: w - 0.1 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w))
    w = step(jnp.ones((128, 128)), x).block_until_ready()
    with jax.profiler.trace(f"{logdir}/process{process}"):
        for i in range(4):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x)
        w.block_until_ready()
""")


def test_collectives_of_a_loop_that_does_not_wait_are_a_share_of_the_devices_steps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jax_processes_capture(tmp_path, "jax_process_async.py", JAX_PROCESS_ASYNC)
    assert main(["import", str(tmp_path / "logs"), "-o", str(tmp_path / "async.tptrace")]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "async.tptrace"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    shares = [finding for finding in report["findings"] if finding["title"].startswith("Collectives take")]
    # the device ran the steps' matmuls and tanh besides the all-reduce: never all of its step
    assert report["results"]["collectives"]["collective_share_of_step"] < 1.0
    assert shares and all("100%" not in finding["title"] for finding in shares), report["findings"]
    assert all("the device's time in each step" in finding["title"] for finding in shares), shares
