"""Collectives on edge inputs, on two real ranks: empty tensor lists and zero-element tensors behave on
the "tpu" process group as on gloo with CPU tensors (the same script is run both ways and every case
compared), and what only NCCL takes (`all_to_all` of uneven pieces, some empty; `ReduceOp.PREMUL_SUM`)
against hand-computed results.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

RANKS = 2

EDGE_SCRIPT = r'''
"""Each case's outcome on this rank, as ["ok", [[shape, values], ...]] or ["error", type, message]."""
import json, sys
from datetime import timedelta
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol

backend = sys.argv[1]
if backend == "tpu":
    import tputrace.backend  # noqa: F401
device = "tpu" if backend == "tpu" else "cpu"
dist.init_process_group(backend, timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
peer = 1 - rank


def empty(*shape):
    return torch.empty(shape, device=device)


def full(shape, value, dtype=torch.float32):
    return torch.full(shape, value, dtype=dtype, device=device)


def all_reduce():
    values = empty(0); dist.all_reduce(values); return values

def all_reduce_max_zero_rows():
    values = empty(0, 3); dist.all_reduce(values, op=dist.ReduceOp.MAX); return values

def all_reduce_coalesced_zero_size():
    values = [empty(0), empty(0, 2)]; dist.all_reduce_coalesced(values); return values

def all_reduce_coalesced_no_tensors():
    dist.all_reduce_coalesced([]); return []

def all_gather():
    outputs = [empty(0) for _ in range(world)]; dist.all_gather(outputs, empty(0)); return outputs

def all_gather_into_tensor():
    output = empty(0, 2); dist.all_gather_into_tensor(output, empty(0, 2)); return output

def reduce_scatter():
    output = empty(0); dist.reduce_scatter(output, [empty(0) for _ in range(world)]); return output

def reduce_scatter_tensor():
    output = empty(0); dist.reduce_scatter_tensor(output, empty(0)); return output

def reduce_scatter_tensor_zero_columns():
    output = empty(1, 0); dist.reduce_scatter_tensor(output, empty(world, 0)); return output

def broadcast():
    values = empty(0, 2); dist.broadcast(values, src=0); return values

def reduce():
    values = empty(0); dist.reduce(values, dst=0); return values

def gather():
    outputs = [empty(0) for _ in range(world)] if rank == 0 else None
    dist.gather(empty(0), outputs, dst=0); return outputs or []

def scatter():
    output = empty(0); dist.scatter(output, [empty(0) for _ in range(world)] if rank == 0 else None, src=0); return output

def all_to_all_single():
    output = empty(0); dist.all_to_all_single(output, empty(0)); return output

def all_to_all_single_zero_splits():
    output = empty(0); dist.all_to_all_single(output, empty(0), [0] * world, [0] * world); return output

def all_to_all_single_some_zero_splits():
    """Every rank sends rank + 1 values to rank 1 and none to rank 0."""
    received = [r + 1 for r in range(world)] if rank == 1 else [0] * world
    output = empty(sum(received))
    sent = [0] * world; sent[1] = rank + 1
    dist.all_to_all_single(output, torch.arange(float(rank + 1), device=device) + 10 * rank, received, sent); return output

def all_to_all_zero_size():
    outputs = [empty(0) for _ in range(world)]; dist.all_to_all(outputs, [empty(0) for _ in range(world)]); return outputs

def all_to_all_no_tensors():
    dist.all_to_all([], []); return []

def all_to_all_fewer_tensors_than_ranks():
    outputs = [empty(1)]; dist.all_to_all(outputs, [full((1,), 1.0)]); return outputs

def send_recv():
    values = empty(0)
    if rank == 0:
        dist.send(values, dst=1)
    else:
        dist.recv(values, src=0)
    return values

def batch_isend_irecv():
    received = empty(0, 3)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, empty(0, 3), peer), dist.P2POp(dist.irecv, received, peer)]):
        work.wait()
    return received

def funcol_all_reduce():
    return funcol.all_reduce(empty(0), "sum", dist.group.WORLD) + 0

def funcol_all_gather():
    return funcol.all_gather_tensor(empty(0, 2), 0, dist.group.WORLD) + 0

def funcol_reduce_scatter():
    return funcol.reduce_scatter_tensor(empty(0), "sum", 0, dist.group.WORLD) + 0

def funcol_all_to_all_single():
    return funcol.all_to_all_single(empty(0), [0] * world, [0] * world, dist.group.WORLD) + 0

def funcol_all_reduce_coalesced():
    return [tensor + 0 for tensor in funcol.all_reduce_coalesced([empty(0), empty(2, 0)], "sum", dist.group.WORLD)]

def funcol_all_gather_coalesced():
    return [tensor + 0 for tensor in funcol.all_gather_into_tensor_coalesced([empty(0), empty(0, 2)], dist.group.WORLD)]

def funcol_reduce_scatter_coalesced():
    return [tensor + 0 for tensor in funcol.reduce_scatter_tensor_coalesced([empty(0), empty(world, 0)], "sum", [0, 0], dist.group.WORLD)]

def dtensor_with_an_empty_shard():
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = DeviceMesh(device, list(range(world)))
    sharded = distribute_tensor(torch.arange(3.0).reshape(1, 3).to(device), mesh, [Shard(0)])
    return [sharded.to_local(), sharded.redistribute(mesh, [Replicate()]).to_local(), (sharded * 2).full_tensor()]


CASES = [value for name, value in list(globals().items()) if callable(value) and name not in ("empty", "full") and getattr(value, "__module__", "") == "__main__"]
outcomes = {}
for case in CASES:
    try:
        result = case()
        tensors = [result] if isinstance(result, torch.Tensor) else result
        outcomes[case.__name__] = ["ok", [[list(tensor.shape), tensor.cpu().tolist()] for tensor in tensors]]
    except Exception as error:  # the outcome to compare
        outcomes[case.__name__] = ["error", type(error).__name__, str(error)]
dist.barrier()

failures = []
if backend == "tpu":
    def check(name, got, want):
        if got.dtype != want.dtype or not torch.equal(got.cpu(), want):
            failures.append(f"{name}: got {got.cpu()}, want {want}")

    pieces_in = [full((peer_rank * (rank + 1),), 10.0 * rank + peer_rank) for peer_rank in range(world)]
    pieces_out = [empty(rank * (peer_rank + 1)) for peer_rank in range(world)]
    dist.all_to_all(pieces_out, pieces_in)  # uneven, some pieces empty: NCCL takes them, gloo refuses
    for peer_rank, piece in enumerate(pieces_out):
        check(f"all_to_all uneven from {peer_rank}", piece, torch.full((rank * (peer_rank + 1),), 10.0 * peer_rank + rank))

    # PREMUL_SUM: each rank scales its own data by its own factor, then the ranks sum.
    data = [torch.tensor([1.0, -2.5, 3.0, 0.75]) * (r + 1) for r in range(world)]
    factors = [0.5 * (r + 1) for r in range(world)]
    want = sum(data[r] * factors[r] for r in range(world))
    for label, factor in (("float", factors[rank]), ("tpu tensor", torch.tensor(factors[rank], device="tpu")), ("cpu tensor", torch.tensor(factors[rank]))):
        values = data[rank].to("tpu")
        dist.all_reduce(values, op=dist._make_nccl_premul_sum(factor))
        check(f"all_reduce premul_sum, {label} factor", values, want)
    bf16 = data[rank].to(torch.bfloat16).to("tpu")
    dist.all_reduce(bf16, op=dist._make_nccl_premul_sum(torch.tensor(factors[rank], dtype=torch.bfloat16, device="tpu")))
    check("all_reduce premul_sum bf16", bf16, want.to(torch.bfloat16))
    rows = [torch.arange(2.0 * world).reshape(world, 2) + r for r in range(world)]
    want_rows = sum(rows[r] * factors[r] for r in range(world))
    shard = empty(1, 2)
    dist.reduce_scatter_tensor(shard, rows[rank].to("tpu"), op=dist._make_nccl_premul_sum(factors[rank]))
    check("reduce_scatter_tensor premul_sum", shard, want_rows[rank : rank + 1])
    shard = empty(2)
    dist.reduce_scatter(shard, [row.to("tpu") for row in rows[rank]], op=dist._make_nccl_premul_sum(torch.tensor(factors[rank], device="tpu")))
    check("reduce_scatter premul_sum", shard, want_rows[rank])
    values = data[rank].to("tpu")
    dist.reduce(values, dst=0, op=dist._make_nccl_premul_sum(factors[rank]))
    if rank == 0:
        check("reduce premul_sum", values, want)
    funcol_values = funcol.all_reduce(data[rank].to("tpu"), "sum", dist.group.WORLD) + 0
    check("sum after premul_sum", funcol_values, sum(data))
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int64, device="tpu"), op=dist._make_nccl_premul_sum(2.0))
        failures.append("premul_sum of int64 did not raise")
    except TypeError as error:
        outcomes["premul_sum int64"] = ["error", type(error).__name__, str(error)]

json.dump({"outcomes": outcomes, "failures": failures}, open(f"{backend}.rank{rank}.json", "w"))
dist.destroy_process_group()
'''


def _run(command: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a launcher in its own session, so that a hang is stopped with all its ranks."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=dict(os.environ, PYTHONWARNINGS="ignore"), start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(command[:6])} did not finish in {timeout:.0f} s:\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _report_paths(tmp_path: Path, backend: str) -> list[Path]:
    return [tmp_path / f"{backend}.rank{rank}.json" for rank in range(RANKS)]


def _reports(tmp_path: Path, backend: str, result: subprocess.CompletedProcess) -> list[dict]:
    paths = _report_paths(tmp_path, backend)
    assert result.returncode == 0 and all(path.exists() for path in paths), result.stderr[-6000:]
    return [json.loads(path.read_text()) for path in paths]


def _gloo_reports(script: Path, tmp_path: Path) -> list[dict]:
    """The script's reports with torch's own gloo on CPU tensors. gloo now and then aborts a rank as it
    shuts down ("terminate called without an active exception"): a run whose ranks all wrote their
    reports (the script's last step before `destroy_process_group`) is kept, and one that died before
    that is run once more."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS), str(script), "gloo"]
    paths = _report_paths(tmp_path, "gloo")
    result = _run(command, tmp_path)
    if result.returncode != 0 and not all(path.exists() for path in paths):
        result = _run(command, tmp_path)
    assert all(path.exists() for path in paths), result.stderr[-6000:]
    return [json.loads(path.read_text()) for path in paths]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """The script's reports per backend: gloo on CPU tensors, and the "tpu" group under `tputrace run`."""
    tmp_path = tmp_path_factory.mktemp("edge_inputs")
    script = tmp_path / "edge_inputs.py"
    script.write_text(EDGE_SCRIPT)
    gloo = _gloo_reports(script, tmp_path)
    tpu = _run([sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", str(RANKS), "--no-trace", str(script), "tpu"], tmp_path)
    return {"gloo": gloo, "tpu": _reports(tmp_path, "tpu", tpu)}


def test_empty_and_zero_element_inputs_behave_as_on_gloo(reports: dict[str, list[dict]]) -> None:
    for rank, (gloo, tpu) in enumerate(zip(reports["gloo"], reports["tpu"])):
        assert set(gloo["outcomes"]) <= set(tpu["outcomes"])
        for case, gloo_outcome in gloo["outcomes"].items():
            tpu_outcome = tpu["outcomes"][case]
            assert tpu_outcome[0] == gloo_outcome[0], f"rank {rank}, {case}: gloo {gloo_outcome}, tpu {tpu_outcome}"
            if gloo_outcome[0] == "ok":
                assert tpu_outcome == gloo_outcome, f"rank {rank}, {case}"
            else:
                assert "\n" not in tpu_outcome[2], f"rank {rank}, {case}: {tpu_outcome[2]}"
    outcomes = reports["tpu"][0]["outcomes"]
    assert outcomes["all_to_all_no_tensors"][1:] == ["ValueError", "all_to_all on a tpu process group takes one input and one output tensor per rank (2), got 0 inputs and 0 outputs"]
    assert outcomes["all_to_all_fewer_tensors_than_ranks"][1] == "ValueError"
    assert outcomes["all_reduce_coalesced_no_tensors"][1:] == ["ValueError", "all_reduce on a tpu process group needs at least one tensor, got an empty list"]
    empty_shard = reports["tpu"][1]["outcomes"]["dtensor_with_an_empty_shard"]
    assert empty_shard == ["ok", [[[0, 3], []], [[1, 3], [[0.0, 1.0, 2.0]]], [[1, 3], [[0.0, 2.0, 4.0]]]]]


def test_uneven_all_to_all_and_premul_sum_match_hand_computed_results(reports: dict[str, list[dict]]) -> None:
    assert all(not report["failures"] for report in reports["tpu"]), [report["failures"] for report in reports["tpu"]]
    refused = reports["tpu"][0]["outcomes"]["premul_sum int64"]
    assert refused[1:] == ["PremulSumError", "all_reduce with ReduceOp.PREMUL_SUM takes floating-point or complex tensors, as NCCL does; got int64"]
