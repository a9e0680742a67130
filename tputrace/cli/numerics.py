"""`tputrace numerics script.py [args...]`: record per-module digests of a run on the tpu device, replay the
first steps' module calls on the CPU, and name the first module whose values leave the CPU's;
`tputrace numerics --compare A B`: the same report for two numerics recordings of one script
(docs/numerics-tool.md)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from tputrace.store.errors import TputraceError

MODES = ("defer", "strict")
DEFAULT_REPLAY_STEPS = 2
DEFAULT_BUDGET_MB = 256


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "numerics",
        help="find the first module whose values on the tpu leave the CPU's",
        description="Run a script on the tpu device with module hooks that record digests of every module's outputs "
        "and input gradients, replay the first steps' module calls on the CPU, and report the first module that "
        "diverges and the first NaN/Inf. With --compare, compare two such recordings instead.",
        usage="tputrace numerics [-o PATH] [--mode {defer,strict}] [--steps N] [--modules NAME,...] [--ops] [--budget-mb MB] "
        "script.py [args ...] | tputrace numerics --compare A B",
    )
    parser.add_argument(
        "-o", "--output", metavar="PATH", help="numerics recording (default: ./tputrace-numerics-<script>-<time>.tpnum)"
    )
    parser.add_argument(
        "--mode", choices=MODES, default="defer", help="eager mode: defer (DEFER_AND_FUSE, default) or strict"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_REPLAY_STEPS,
        metavar="N",
        help=f"replay the module calls of the first N steps on the CPU (default {DEFAULT_REPLAY_STEPS}); later steps get digests only",
    )
    parser.add_argument(
        "--modules",
        metavar="NAME,...",
        default="",
        help="also store the full output tensors of these modules (names as the report prints them)",
    )
    parser.add_argument(
        "--ops",
        action="store_true",
        help="run the first divergent module call again op by op on the tpu and the CPU and report the first divergent op",
    )
    parser.add_argument(
        "--budget-mb",
        type=float,
        default=DEFAULT_BUDGET_MB,
        metavar="MB",
        help=f"largest host copy of one call's inputs and parameters for the replay (default {DEFAULT_BUDGET_MB})",
    )
    parser.add_argument(
        "--compare", nargs=2, metavar=("A", "B"), help="compare numerics recording A against B (the reference) and exit"
    )
    parser.add_argument("target", nargs="?", metavar="script.py", help="the script to run")
    script_args = parser.add_argument(
        "target_args", nargs=argparse.REMAINDER, metavar="args", help="arguments for the script"
    )
    script_args.required = False
    return parser


def run(args: argparse.Namespace) -> int:
    from tputrace.numerics.findings import compare_report, render, replay_report
    from tputrace.numerics.store import read_recording

    if args.compare:
        if args.target:
            raise TputraceError("--compare takes two recordings and no script")
        first, reference = (read_recording(Path(path)) for path in args.compare)
        print(render(compare_report(first, reference)))
        return 0
    if not args.target:
        raise TputraceError("give a script to run, or --compare A B")
    if args.steps < 0:
        raise TputraceError(f"--steps must be at least 0, not {args.steps}")
    from tputrace.cli.run import Target, check_target, execute

    target = Target(args.target, False)
    check_target(target)
    output = Path(args.output or f"tputrace-numerics-{target.stem}-{time.strftime('%Y%m%d-%H%M%S')}.tpnum").resolve()
    if output.exists() and not _is_numerics_file(output):
        raise TputraceError(f"{output} exists and is not a numerics recording; not writing over it")
    lifecycle = _NumericsLifecycle(
        output,
        replay_steps=args.steps,
        full_modules=frozenset(name for name in args.modules.split(",") if name),
        budget_bytes=int(args.budget_mb * 2**20),
        ops=args.ops,
    )
    exit_status = execute(target, list(args.target_args), lifecycle, None, args.mode)
    print(file=sys.stderr)
    print(render(replay_report(read_recording(output))))
    print(f"tputrace: numerics recording saved to {output}", file=sys.stderr)
    return exit_status


def _is_numerics_file(path: Path) -> bool:
    from tputrace.numerics.store import read_recording

    try:
        read_recording(path)
    except TputraceError:
        return False
    return True


class _NumericsLifecycle:
    """The recording lifecycle `tputrace.cli.run.execute` drives, with the numerics hooks installed between the
    backend's start (no trace) and its stop."""

    def __init__(
        self, output: Path, *, replay_steps: int, full_modules: frozenset[str], budget_bytes: int, ops: bool
    ) -> None:
        self._ops = ops
        self._recorder: Any = importlib.import_module("tputrace.recording.lifecycle")
        self._output = output
        self._replay_steps = replay_steps
        self._full_modules = full_modules
        self._budget_bytes = budget_bytes
        self._session: Any = None
        self._writer: Any = None

    def live_counts(self) -> Any:
        return self._recorder.live_counts()

    def start(self, path: str | None, *, script: str, argv: list[str], mode: str, window: Any = None) -> None:
        self._recorder.start(path, script=script, argv=argv, mode=mode, window=window)
        from tputrace.numerics.recording import NumericsSession
        from tputrace.numerics.store import NumericsWriter

        info = {"script": script, "argv": json.dumps(argv), "mode": mode, "replay_steps": str(self._replay_steps)}
        self._writer = NumericsWriter(self._output, info)
        self._session = NumericsSession(
            self._writer, self._replay_steps, self._full_modules, self._budget_bytes, self._ops
        )
        self._session.install()

    def stop(self, exit_status: int | None, error: str | None = None) -> None:
        try:
            if self._session is not None:
                self._session.remove()
            if self._writer is not None:
                self._writer.close()
        finally:
            self._recorder.stop(exit_status=exit_status, error=error)
