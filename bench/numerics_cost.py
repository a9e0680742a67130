"""What `tputrace numerics` costs a training step (ms per step) on a small MLP on `tpu` in DEFER_AND_FUSE: no
hooks, digests only (the steps after the replayed ones), and digests with the CPU replay of every module call
(the first steps). A discarded round first compiles the programs; then each case runs in rounds of a few steps, the rounds of all cases interleaved; each figure is
the median over rounds of the wall time per step, with the min-max spread (a shared machine's other processes
count in wall time)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.compat.device_module import EagerMode, set_eager_mode
from tputrace.numerics.recording import NumericsSession
from tputrace.numerics.store import NumericsWriter

from results import write_section  # type: ignore[import-not-found]

WIDTH = 64
BATCH = 32
CASES = ("no hooks", "digests only", "digests and CPU replay")


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1)
    ).to("tpu")
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = ((model(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    loss.item()  # the step's end: its programs have run


def _round(case: str, steps: int, directory: Path) -> float:
    """Wall seconds per step of `steps` steps of `case`, after one warm-up step."""
    model, optimizer = _model()
    x, y = torch.randn(BATCH, WIDTH, device="tpu"), torch.randn(BATCH, 1, device="tpu")
    session: NumericsSession | None = None
    writer: NumericsWriter | None = None
    if case != "no hooks":
        writer = NumericsWriter(directory / "bench.tpnum", {"script": "bench"})
        session = NumericsSession(
            writer,
            replay_steps=10**9 if case == "digests and CPU replay" else 0,
            full_modules=frozenset(),
            budget_bytes=2**28,
        )
        session.install()
    try:
        _step(model, optimizer, x, y)
        start = time.perf_counter()
        for _ in range(steps):
            _step(model, optimizer, x, y)
        return (time.perf_counter() - start) / steps
    finally:
        if session is not None and writer is not None:
            session.remove()
            writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-write", action="store_true", help="print the table without writing bench/RESULTS.md")
    args = parser.parse_args()
    set_eager_mode(EagerMode.DEFER_AND_FUSE)
    times: dict[str, list[float]] = {case: [] for case in CASES}
    with tempfile.TemporaryDirectory() as directory:
        for case in CASES:  # a discarded round: the programs compile here
            _round(case, 1, Path(directory))
        for _ in range(args.rounds):
            for case in CASES:
                times[case].append(_round(case, args.steps, Path(directory)))
    baseline = statistics.median(times["no hooks"])
    rows = ["| case | ms per step (median) | min-max | × no hooks |", "|---|---|---|---|"]
    for case in CASES:
        median = statistics.median(times[case])
        rows.append(
            f"| {case} | {median * 1e3:.2f} | {min(times[case]) * 1e3:.2f}-{max(times[case]) * 1e3:.2f} | {median / baseline:.1f} |"
        )
    text = (
        f"A {WIDTH}-wide 3-layer MLP (6 module calls a step: 5 layers and the Sequential), batch {BATCH}, SGD, "
        f"DEFER_AND_FUSE; {args.rounds} rounds of {args.steps} steps per case, interleaved.\n\n" + "\n".join(rows)
    )
    print(text)
    if not args.no_write:
        write_section("Numerics recording cost (bench/numerics_cost.py)", text)


if __name__ == "__main__":
    main()
