"""Real captures made by the tools tputrace imports, each in a fresh Python process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

JAX_STEP = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    @jax.jit
    def step(w, x):
        return w - 0.1 * jax.grad(loss)(w, x)

    w, x = jnp.ones((64, 64)), jnp.ones((32, 64))
    step(w, x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(3):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x)
        w.block_until_ready()
""")

# Two programs compiled inside the trace, one of them twice (a second input shape).
JAX_COMPILE = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    with jax.profiler.trace(sys.argv[1]):
        @jax.jit
        def step(w, x):
            return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)

        w, x = jnp.ones((32, 32)), jnp.ones((8, 32))
        step(w, x).block_until_ready()
        step(w, x[:4]).block_until_ready()
""")

# A shard_map over 4 virtual XLA:CPU devices with a psum and an all_gather, run 3 times.
JAX_COLLECTIVES = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(jax.devices(), ("d",))

    @jax.jit
    def f(x):
        def shard(x):
            total = jax.lax.psum(jnp.sum(x), "d")
            return (jnp.sum(jax.lax.all_gather(x, "d")) + total)[None]
        return jax.shard_map(shard, mesh=mesh, in_specs=P("d"), out_specs=P("d"))(x)

    x = jnp.ones((8, 16))
    f(x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for _ in range(3):
            f(x).block_until_ready()
""")

# A ring of `jax.lax.ppermute` hops in a `shard_map` (4 MiB a device a hop, little compute between hops) over 4
# virtual devices: XLA's collective-permutes take much of each of the 3 annotated steps.
JAX_PPERMUTE_RING = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(jax.devices(), ("d",))
    ring = [(i, (i + 1) % 4) for i in range(4)]

    @jax.jit
    def f(x):
        def shard(x):
            acc = x
            for _ in range(8):
                x = jax.lax.ppermute(x, "d", ring)
                acc = acc + x
            return acc
        return jax.shard_map(shard, mesh=mesh, in_specs=P("d"), out_specs=P("d"))(x)

    x = jnp.ones((4096, 1024))
    f(x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(3):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                x = f(x).block_until_ready()
""")

# A jitted step with a lax.scan and a while_loop: XLA:CPU runs each as a `while` op whose events hold the
# loop body's ops; two steps annotated.
JAX_LOOPS = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    @jax.jit
    def step(w, x):
        def body(carry, xi):
            return carry + jnp.tanh(xi @ w), None
        carry, _ = jax.lax.scan(body, jnp.zeros((4, 16)), x)
        _, carry = jax.lax.while_loop(lambda v: v[0] < 3, lambda v: (v[0] + 1, v[1] * 0.5), (0, carry))
        return w - 0.01 * jnp.mean(carry)

    w, x = jnp.ones((16, 16)), jnp.ones((6, 4, 16))
    step(w, x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(2):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x)
        w.block_until_ready()
""")

# A jitted step (its weights donated) that prints with `jax.debug.print` (line 11) and computes on the host with a
# `jax.pure_callback` (line 12); three annotated steps.
JAX_CALLBACKS = textwrap.dedent("""\
    import sys, time, functools, numpy as np, jax, jax.numpy as jnp

    def on_host(y):
        time.sleep(0.002)
        return np.asarray(y) * 2.0

    @functools.partial(jax.jit, donate_argnums=(0,))
    def step(w, x):
        y = jnp.tanh(x @ w)
        jax.debug.print("loss {l}", l=jnp.sum(y))
        z = jax.pure_callback(on_host, jax.ShapeDtypeStruct(y.shape, y.dtype), y)
        return w - 0.01 * (x.T @ z)

    w, x = jnp.ones((32, 32)), jnp.ones((16, 32))
    w = step(w, x)
    w.block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(3):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x)
        w.block_until_ready()
""")

# Two `jax.profiler.trace` sessions of one process, a second apart (each writes its own session folder),
# three annotated steps each.
JAX_TWO_SESSIONS = textwrap.dedent("""
    import sys, time, jax, jax.numpy as jnp

    @jax.jit
    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)

    w, x = jnp.ones((64, 64)), jnp.ones((32, 64))
    step(w, x).block_until_ready()
    for session in range(2):
        with jax.profiler.trace(sys.argv[1]):
            for i in range(3):
                with jax.profiler.StepTraceAnnotation("train", step_num=10 * session + i):
                    w = step(w, x)
            w.block_until_ready()
        time.sleep(1.1)
""")

# A jitted data-parallel training step (batch sharded over 4 virtual XLA:CPU devices, weights replicated, so XLA
# all-reduces the gradients) with `jax.named_scope`s, steps numbered 5 to 8. XLA:CPU runs each step's ops after the
# host has launched all four: the host's launch event of each run (its `run_id`) says which step it belongs to.
JAX_SHARDED = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(jax.devices(), ("data",))

    def loss(w, x, y):
        with jax.named_scope("forward"):
            out = jnp.tanh(x @ w["w1"]) @ w["w2"]
        with jax.named_scope("loss"):
            return jnp.mean((out - y) ** 2)

    @jax.jit
    def step(w, x, y):
        with jax.named_scope("backward"):
            grads = jax.grad(loss)(w, x, y)
        with jax.named_scope("update"):
            return jax.tree.map(lambda p, g: p - 0.1 * g, w, grads)

    w = jax.device_put({"w1": jnp.ones((16, 32)), "w2": jnp.ones((32, 4))}, NamedSharding(mesh, P()))
    x = jax.device_put(jnp.ones((64, 16)), NamedSharding(mesh, P("data")))
    y = jax.device_put(jnp.zeros((64, 4)), NamedSharding(mesh, P("data")))
    jax.block_until_ready(step(w, x, y))
    with jax.profiler.trace(sys.argv[1]):
        for i in range(5, 9):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x, y)
        jax.block_until_ready(w)
""")

# A graph break (print) on line 5 and a recompile (a 1-d then a 2-d input).
TORCH_COMPILE = textwrap.dedent("""\
    import torch

    def f(x):
        y = torch.sin(x) * 2
        print("break here")
        return y.cos() + 1

    g = torch.compile(f, backend="eager")
    g(torch.ones(4))
    g(torch.ones(4, 4))
""")

# A data-dependent branch (a break whose reason is on the "Graph Break Reason" line) in a function compiled for
# two sizes; a guard on a global that recompiles `h` until the recompile limit (3) is hit; an explicit
# `graph_break()` and a `tolist()` break (reasons on the line after the reason's preamble); a compiled module,
# whose code object is torch's wrapper, called on line 29; a print in a loop (line 34), where Dynamo gives up
# on the whole function.
# A torch.nn module torch's own code defines, compiled whole: Dynamo compiles it through torch's wrapper `inner`.
TORCH_COMPILED_SEQUENTIAL = textwrap.dedent("""\
    import torch

    net = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()))
    for _ in range(2):
        out = net(torch.ones(4, 8))
""")

TORCH_GUARDS = textwrap.dedent("""\
    import torch, torch._dynamo
    torch._dynamo.config.cache_size_limit = 3

    def f(x):
        if x.sum() > 0:
            x = x + 1
        return x.relu()

    g = torch.compile(f, backend="eager")
    g(torch.ones(4))
    g(torch.ones(5))
    SCALE = 1
    def h(x):
        return x * SCALE

    hc = torch.compile(h, backend="eager")
    for SCALE in (1, 2, 3, 4, 5):
        hc(torch.ones(3))

    @torch.compile(backend="eager")
    def outer(x):
        y = torch.sin(x)
        torch._dynamo.graph_break()
        return y.tolist()

    outer(torch.ones(2))

    module = torch.compile(torch.nn.Linear(4, 2), backend="eager")
    module(torch.ones(3, 4))

    def skipped(x):
        for i in range(2):
            x = x + i
            print(i)
        return x

    torch.compile(skipped, backend="eager")(torch.ones(2))
""")

# torch.compile with automatic dynamic shapes (`dynamic=None`: four sizes, one recompile that makes the size
# dynamic), two prints in one function (lines 5 and 7: three graphs), and a compiled optimizer step, where torch's
# optimizer breaks the graph in its own code (called on line 19).
TORCH_DYNAMIC = textwrap.dedent("""\
    import torch

    def f(x, n):
        y = torch.sin(x) * n
        print("first")
        y = y.cos()
        print("second")
        return y.sum()

    g = torch.compile(f, backend="eager", dynamic=None)
    for size in (4, 5, 6, 7):
        g(torch.ones(size), 2)

    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.compile(backend="eager")
    def opt_step():
        opt.step()

    for _ in range(3):
        model(torch.randn(2, 8)).sum().backward()
        opt_step()
        opt.zero_grad()
""")

TORCH_PROFILER = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True, profile_memory=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
    prof.export_chrome_trace(sys.argv[1])
""")

# A model compiled inside the profile (aot_eager: Dynamo and AOTAutograd, no Inductor), recompiled for a
# second batch size; its ops nest (`aten::linear` holds `aten::addmm`).
TORCH_PROFILED_COMPILE = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for size in (8, 7, 6):
            compiled(x[:size]).sum().backward()
            model(x).sum().backward()
    prof.export_chrome_trace(sys.argv[1])
""")

# A profiling schedule of two windows of two steps each (steps 2, 3 and 6, 7 of 9), gzipped: the handler
# writes one file per window.
TORCH_SCHEDULE = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1], use_gzip=True), record_shapes=True) as prof:
        for _ in range(9):
            with record_function("forward_backward"):
                model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
""")

# One process, two captures of it in one folder: torch.profiler windows (a schedule of 4 active steps that repeats,
# so stopping after them leaves a last window holding only the step marker the next cycle opened) and TORCH_TRACE
# (a compiled model, recompiled for a third batch size).
TORCH_PROFILE_AND_TRACE = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="aot_eager")
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=4), record_shapes=True,
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as prof:
        for size in (8, 8, 6, 8):
            compiled(torch.randn(size, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
""")

# Two gloo ranks, three all_reduces of 1000 floats each, profiled with shapes; one JSON per rank.
# An Inductor torch.compile loop profiled step by step, with its TORCH_TRACE log: 8 batches of 32, then a last batch
# of 5, for which Dynamo compiles the model again (its size guard fails) in the last step.
TORCH_LAST_BATCH = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model)
    data = torch.randn(8 * 32 + 5, 64)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=9),
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as prof:
        for batch in data.split(32):
            loss = compiled(batch).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
""")

# A profile without a schedule (no `prof.step()`, so no `ProfilerStep#N`): four iterations each inside the user's
# `record_function("train_step")` (with a `forward` range nested in it), each after a shorter top-level `load` range;
# all threads profiled, and a second thread opens its own range five times, each longer than an iteration, around
# a few ops.
TORCH_UNSCHEDULED = textwrap.dedent("""
    import sys, threading, time, torch
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile, record_function

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    started = threading.Event()

    def poll():
        for _ in range(5):
            with record_function("poll"):
                started.set()
                torch.ones(2).add(1)
                time.sleep(0.02)

    with profile(activities=[ProfilerActivity.CPU],
                 experimental_config=_ExperimentalConfig(profile_all_threads=True)) as prof:
        poller = threading.Thread(target=poll)
        poller.start()
        started.wait()
        for _ in range(4):
            with record_function("load"):
                x = torch.randn(8, 16)
            with record_function("train_step"):
                with record_function("forward"):
                    loss = model(x).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
        poller.join()
    prof.export_chrome_trace(sys.argv[1])
""")

# A schedule that records one step in four (wait 2, warmup 1, active 1, repeat 3): three windows, one file each, with
# the unrecorded steps between them (each step sleeps 5 ms outside the profiler's windows too).
TORCH_REPEATED_WINDOWS = textwrap.dedent("""
    import sys, time, torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=2, warmup=1, active=1, repeat=3),
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as prof:
        for _ in range(12):
            for _ in range(5):
                model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.005)
            prof.step()
""")

TORCH_GLOO = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.profiler import ProfilerActivity, profile

    def run(rank, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        x = torch.ones(1000)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(3):
                dist.all_reduce(x)
        prof.export_chrome_trace(f"{out}/rank{rank}.json")
        dist.barrier()  # a rank that left first would close its connection under the other's last collective
        # Both files are written: leave without tearing gloo down, whose threads a busy host can still have running
        # when they are destroyed (the process then aborts: "terminate called without an active exception").
        os._exit(0)

    if __name__ == "__main__":
        os.makedirs(sys.argv[1], exist_ok=True)
        mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
""")


# Two DDP ranks over gloo, profiled with shapes and stacks (one JSON per rank); rank 1 sleeps 50 ms before each of its
# three steps (line 14), so rank 0 waits for it in every gradient all-reduce (the ranks' profilers start unaligned, so a
# busy host can hide one of the waits).
TORCH_DDP = textwrap.dedent("""\
    import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile

    def run(rank, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
        x = torch.randn(8, 16)
        model(x).sum().backward()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True) as prof:
            for _ in range(3):
                if rank == 1:
                    time.sleep(0.15)
                model(x).sum().backward()
        prof.export_chrome_trace(f"{out}/rank{rank}.json")
        dist.barrier()
        os._exit(0)  # as TORCH_GLOO: gloo's threads are not torn down under a busy host

    if __name__ == "__main__":
        os.makedirs(sys.argv[1], exist_ok=True)
        mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
""")


# Two DDP ranks over gloo under a profiling schedule (4 active steps, one file per rank): a CPU process group's
# capture with steps and collectives and no program runs.
TORCH_DDP_STEPS = textwrap.dedent("""\
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, schedule

    def run(rank, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)))
        x = torch.randn(8, 64)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=4),
                     on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank{rank}.json")) as prof:
            for _ in range(5):
                model(x).sum().backward()
                prof.step()
        dist.barrier()
        os._exit(0)  # as TORCH_GLOO: gloo's threads are not torn down under a busy host

    if __name__ == "__main__":
        os.makedirs(sys.argv[1], exist_ok=True)
        mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
""")


# A training loop (in `train`) fed by a DataLoader whose one worker takes 50 ms a sample (a batch of 8 every 400 ms)
# while a step computes in well under that; 3 profiled steps. (Two workers would deliver batches in pairs whenever
# they run in phase, so every other step would find its batch ready.)
TORCH_LOADER = textwrap.dedent("""\
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    class Slow(Dataset):
        def __len__(self):
            return 48

        def __getitem__(self, index):
            time.sleep(0.05)
            return torch.randn(16), torch.randn(4)

    def train(out):
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(Slow(), batch_size=8, num_workers=1)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                     on_trace_ready=tensorboard_trace_handler(out), with_stack=True) as prof:
            for x, y in loader:
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                prof.step()

    if __name__ == "__main__":
        train(sys.argv[1])
""")


# A compiled model whose first call (its compile) is in a profiling schedule's `wait` step, outside the profile's
# window of 2 steps; the process's TORCH_TRACE log has the compile.
TORCH_COMPILE_BEFORE_WINDOW = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    compiled = torch.compile(model, backend="aot_eager")
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=0, active=2, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as prof:
        for _ in range(3):
            compiled(torch.randn(8, 16)).sum().backward()
            prof.step()
""")


def _run(script: Path, *args: str, env: dict[str, str] | None = None) -> None:
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, f"{script.name} exited with {result.returncode}: {result.stderr[-3000:]}"


def _capture(folder: Path, script_name: str, source: str, output: str, *args: str, env: dict[str, str] | None = None) -> Path:
    """Run `source` as `folder/script_name` with the capture's path (`folder/output`) and `args`; that path."""
    script = folder / script_name
    script.write_text(source)
    _run(script, str(folder / output), *args, env=env)
    return folder / output


def _torch_trace(folder: Path, script_name: str, source: str, output: str) -> tuple[Path, Path]:
    """Run `source` as `folder/script_name` with `TORCH_TRACE=folder/output`; that directory, and the script."""
    script = folder / script_name
    script.write_text(source)
    _run(script, env={**os.environ, "TORCH_TRACE": str(folder / output)})
    return folder / output, script


def jax_capture(folder: Path) -> Path:
    """A `jax.profiler.trace` log dir of three steps of a jitted training step (XLA:CPU)."""
    return _capture(folder, "jax_step.py", JAX_STEP, "logdir")


def four_device_env() -> dict[str, str]:
    """The environment of a capture script that runs JAX on 4 virtual XLA:CPU devices."""
    return {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}


def jax_compile_capture(folder: Path) -> Path:
    """A `jax.profiler.trace` log dir in which `step` is compiled twice (two input shapes)."""
    return _capture(folder, "jax_compile.py", JAX_COMPILE, "compile_logdir")


def jax_collectives_capture(folder: Path) -> Path:
    """A `jax.profiler.trace` log dir of `JAX_COLLECTIVES` on 4 virtual devices."""
    return _capture(folder, "jax_collectives.py", JAX_COLLECTIVES, "collectives_logdir", env=four_device_env())


def jax_ppermute_capture(folder: Path) -> Path:
    """A `jax.profiler.trace` log dir of `JAX_PPERMUTE_RING` on 4 virtual devices."""
    return _capture(folder, "jax_ring.py", JAX_PPERMUTE_RING, "ring_logdir", env=four_device_env())


def jax_sharded_capture(folder: Path) -> Path:
    """A `jax.profiler.trace` log dir of `JAX_SHARDED` on 4 virtual devices."""
    return _capture(folder, "jax_sharded.py", JAX_SHARDED, "sharded_logdir", env=four_device_env())


def jax_loops_capture(folder: Path) -> Path:
    """A `jax.profiler.trace` log dir of `JAX_LOOPS`."""
    return _capture(folder, "jax_loops.py", JAX_LOOPS, "loops_logdir")


def jax_callbacks_capture(folder: Path) -> Path:
    """A `jax.profiler.trace` log dir of `JAX_CALLBACKS`."""
    return _capture(folder, "jax_callbacks.py", JAX_CALLBACKS, "callbacks_logdir")


def jax_two_sessions_capture(folder: Path) -> Path:
    """A `jax.profiler.trace` log dir of `JAX_TWO_SESSIONS` (two `vm.xplane.pb`, one per session folder)."""
    return _capture(folder, "jax_two_sessions.py", JAX_TWO_SESSIONS, "sessions_logdir")


def torch_trace_capture(folder: Path) -> tuple[Path, Path]:
    """A `TORCH_TRACE` directory of `TORCH_COMPILE`, and the script."""
    return _torch_trace(folder, "compiled.py", TORCH_COMPILE, "torch_trace")


def torch_sequential_capture(folder: Path) -> tuple[Path, Path]:
    """The TORCH_TRACE dir of `TORCH_COMPILED_SEQUENTIAL`, and the script."""
    return _torch_trace(folder, "sequential.py", TORCH_COMPILED_SEQUENTIAL, "sequential_trace")


def torch_guards_capture(folder: Path) -> tuple[Path, Path]:
    """A `TORCH_TRACE` directory of `TORCH_GUARDS`, and the script."""
    return _torch_trace(folder, "guards.py", TORCH_GUARDS, "guards_trace")


def torch_dynamic_capture(folder: Path) -> tuple[Path, Path]:
    """A `TORCH_TRACE` directory of `TORCH_DYNAMIC`, and the script."""
    return _torch_trace(folder, "dynamic.py", TORCH_DYNAMIC, "dynamic_trace")


def torch_profiled_compile_capture(folder: Path) -> Path:
    """torch.profiler's Chrome JSON of `TORCH_PROFILED_COMPILE`."""
    return _capture(folder, "profiled_compile.py", TORCH_PROFILED_COMPILE, "compiled_profile.json")


def torch_schedule_capture(folder: Path) -> Path:
    """The `tensorboard_trace_handler` directory of `TORCH_SCHEDULE` (two `*.pt.trace.json.gz` files)."""
    return _capture(folder, "scheduled.py", TORCH_SCHEDULE, "tb")


def torch_last_batch_capture(folder: Path) -> Path:
    """A folder holding `TORCH_LAST_BATCH`'s torch.profiler window (`tb/`) and its TORCH_TRACE log; Inductor's caches
    are off, so the recompile compiles as a first run of the script would."""
    run = folder / "run"
    env = {**os.environ, "TORCH_TRACE": str(run / "torch_trace"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
           "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    _capture(folder, "last_batch.py", TORCH_LAST_BATCH, "run/tb", env=env)
    return run


def free_port() -> str:
    """A TCP port on 127.0.0.1 free now, for a distributed run's rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def jax_processes_capture(folder: Path, name: str, source: str) -> Path:
    """The folder of the captures of `source` run as two `jax.distributed` processes on the CPU (the script takes the
    log folder, its process index and the rendezvous port)."""
    script = folder / name
    script.write_text(source)
    port, logs = free_port(), folder / "logs"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    processes = [subprocess.Popen([sys.executable, str(script), str(logs), str(index), port], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for index in (0, 1)]
    for process in processes:
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
    return logs


def torch_gloo_capture(folder: Path) -> Path:
    """The folder of `TORCH_GLOO`'s two torch.profiler JSON files, one per rank."""
    return _capture(folder, "gloo.py", TORCH_GLOO, "gloo", free_port())


def torch_ddp_capture(folder: Path) -> Path:
    """The folder of `TORCH_DDP`'s two torch.profiler JSON files, one per rank."""
    return _capture(folder, "ddp.py", TORCH_DDP, "ddp", free_port())


def torch_ddp_steps_capture(folder: Path) -> Path:
    """The folder of `TORCH_DDP_STEPS`'s two torch.profiler JSON files, one per rank."""
    return _capture(folder, "ddp_steps.py", TORCH_DDP_STEPS, "ddp_steps", free_port())


def torch_loader_capture(folder: Path) -> Path:
    """The `tensorboard_trace_handler` folder of `TORCH_LOADER` (one window of 3 steps)."""
    return _capture(folder, "loader.py", TORCH_LOADER, "loader_tb")


def torch_compile_before_window_capture(folder: Path) -> Path:
    """A folder holding `TORCH_COMPILE_BEFORE_WINDOW`'s torch.profiler window (`tb/`) and its TORCH_TRACE log."""
    run = folder / "early"
    env = {**os.environ, "TORCH_TRACE": str(run / "torch_trace")}
    _capture(folder, "compile_before_window.py", TORCH_COMPILE_BEFORE_WINDOW, "early/tb", env=env)
    return run


def torch_profile_and_trace_capture(folder: Path) -> Path:
    """A folder holding `TORCH_PROFILE_AND_TRACE`'s torch.profiler windows (`tb/`) and its TORCH_TRACE log."""
    run = folder / "run"
    env = {**os.environ, "TORCH_TRACE": str(run / "torch_trace")}
    _capture(folder, "profile_and_trace.py", TORCH_PROFILE_AND_TRACE, "run/tb", env=env)
    return run


def torch_profiler_capture(folder: Path) -> Path:
    """torch.profiler's Chrome JSON of two training steps of a small CPU model."""
    return _capture(folder, "profiled.py", TORCH_PROFILER, "profile.json")


def torch_unscheduled_capture(folder: Path) -> Path:
    """torch.profiler's Chrome JSON of `TORCH_UNSCHEDULED` (no step markers)."""
    return _capture(folder, "unscheduled.py", TORCH_UNSCHEDULED, "unscheduled.json")


def torch_repeated_windows_capture(folder: Path) -> Path:
    """The `tensorboard_trace_handler` folder of `TORCH_REPEATED_WINDOWS` (three windows of one step)."""
    return _capture(folder, "repeated_windows.py", TORCH_REPEATED_WINDOWS, "repeated_tb")


# A `torch.compile`d training function whose backend raises, with Dynamo's errors suppressed: the compile fails once
# and the function runs eagerly on every call. Profiled with Python stacks (4 steps) beside its TORCH_TRACE log.
TORCH_FAILED_COMPILE = textwrap.dedent("""
    import sys, torch
    import torch._dynamo
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    torch._dynamo.config.suppress_errors = True

    def lowering_backend(gm, example_inputs):
        raise RuntimeError("cannot lower aten.addmm: unsupported layout\\nmore detail on a second line")

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_of(x):
        return model(x).square().mean()

    compiled = torch.compile(loss_of, backend=lowering_backend)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=4, repeat=1),
                 with_stack=True, on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as prof:
        for _ in range(4):
            compiled(torch.randn(32, 64)).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
""")


def torch_failed_compile_capture(folder: Path) -> Path:
    """A folder holding `TORCH_FAILED_COMPILE`'s torch.profiler window (`tb/`) and its TORCH_TRACE log."""
    run = folder / "failed"
    env = {**os.environ, "TORCH_TRACE": str(run / "torch_trace")}
    _capture(folder, "failed_compile.py", TORCH_FAILED_COMPILE, "failed/tb", env=env)
    return run


# Three JAX functions recompiled at every one of 5 annotated steps, each for another reason: `update` for a learning
# rate passed as a static argument (same shapes, other constants), `rejitted` for a lambda jitted anew in the loop
# (the very same program), `fit` for a batch that grows by a row (a shape storm).
JAX_RECOMPILE_CAUSES = textwrap.dedent("""
    import sys, functools, jax, jax.numpy as jnp
    import numpy as np

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    @functools.partial(jax.jit, static_argnames=("lr",))
    def update(w, x, lr):
        return w - lr * jax.grad(loss)(w, x)

    @jax.jit
    def fit(w, x):
        return w - 0.01 * jax.grad(loss)(w, x)

    w, x = jnp.ones((32, 32)), jnp.ones((8, 32))
    with jax.profiler.trace(sys.argv[1]):
        for i in range(5):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = update(w, x, lr=0.1 / (i + 1))
                rejitted = jax.jit(lambda w, x: w * 0.5 + jnp.mean(x))
                w = rejitted(w, x)
                w = fit(w, np.ones((8 + i, 32), np.float32))
        w.block_until_ready()
""")


def jax_recompile_causes_capture(folder: Path) -> Path:
    """A `jax.profiler.trace` log dir of `JAX_RECOMPILE_CAUSES`."""
    return _capture(folder, "jax_recompile_causes.py", JAX_RECOMPILE_CAUSES, "causes_logdir")


# A JAX loop of 8 annotated steps whose batches come from slow Python (30 ms each): from a generator the loop calls
# (argv[2] `generator`), from a thread filling a queue of 2 (`queue`), or from the generator inside a
# `TraceAnnotation("load_batch")` with the Python tracer off (`traceme`); the jitted step takes well under a millisecond.
JAX_INPUT_BOUND = textwrap.dedent("""
    import sys, time, queue, threading, jax, jax.numpy as jnp
    import numpy as np

    def make_batch():
        time.sleep(0.03)
        return np.random.rand(32, 64).astype(np.float32)

    def generated():
        while True:
            yield make_batch()

    def queued():
        batches = queue.Queue(maxsize=2)
        threading.Thread(target=lambda: [batches.put(make_batch()) for _ in iter(int, 1)], daemon=True).start()
        while True:
            yield batches.get()

    @jax.jit
    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)

    data = queued() if sys.argv[2] == "queue" else generated()
    w = step(jnp.ones((64, 64)), next(data)).block_until_ready()
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0 if sys.argv[2] == "traceme" else 1
    with jax.profiler.trace(sys.argv[1], profiler_options=options):
        for i in range(8):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                with jax.profiler.TraceAnnotation("load_batch"):
                    x = next(data)
                w = step(w, x)
        w.block_until_ready()
""")


def jax_input_bound_capture(folder: Path, source: str) -> Path:
    """A `jax.profiler.trace` log dir of `JAX_INPUT_BOUND`, its batches from `source` (`generator`, `queue`, `traceme`)."""
    return _capture(folder, f"jax_input_{source}.py", JAX_INPUT_BOUND, f"input_{source}_logdir", source)


# A jitted JAX step over a dataset of 8 batches of 64 rows and a last batch of 5, sliced in the loop (9 annotated
# steps): the last batch compiles the step again.
JAX_LAST_BATCH = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    import numpy as np

    @jax.jit
    def step(w, x):
        return w - 0.01 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)

    data = np.random.rand(8 * 64 + 5, 256).astype(np.float32)
    w = jnp.ones((256, 256))
    with jax.profiler.trace(sys.argv[1]):
        for i, start in enumerate(range(0, len(data), 64)):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, data[start:start + 64])
        w.block_until_ready()
""")


def jax_last_batch_capture(folder: Path) -> Path:
    """A `jax.profiler.trace` log dir of `JAX_LAST_BATCH`."""
    return _capture(folder, "jax_last_batch.py", JAX_LAST_BATCH, "last_batch_logdir")


# A `torch.compile(fullgraph=True)` function that branches on a tensor's value: its compile fails (Unsupported) at
# each of 3 calls, and the script falls back to the uncompiled function.
TORCH_FULLGRAPH_FAILED = textwrap.dedent("""
    import torch

    model = torch.nn.Linear(16, 4)

    def step(x):
        y = model(x)
        if y.sum() > 0:
            y = y * 2
        return y.relu().mean()

    compiled = torch.compile(step, fullgraph=True)
    for _ in range(3):
        x = torch.randn(8, 16)
        try:
            compiled(x)
        except Exception:
            step(x)
""")


def torch_fullgraph_failed_capture(folder: Path) -> Path:
    """The TORCH_TRACE dir of `TORCH_FULLGRAPH_FAILED`."""
    return _torch_trace(folder, "fullgraph_failed.py", TORCH_FULLGRAPH_FAILED, "fullgraph_trace")[0]
