"""The launcher's exit status when the rank it names first ended its script cleanly."""

from __future__ import annotations

from tputrace.cli.launch import RankFailure, first_failure
from tputrace.recording.exits import ScriptEnd

PEER_ERROR = (
    "Traceback (most recent call last):\n"
    '  File "/work/out_of_step.py", line 16, in <module>\n'
    "    dist.all_reduce(total)\n"
    "_group.CollectiveError: all_reduce on the tpu process group failed: Connection closed by peer [127.0.0.1]:18625.\n"
)


def test_a_rank_that_ended_cleanly_then_was_stopped_passes_on_the_failed_rank_status() -> None:
    # Rank 1 skipped a collective and ended its script (status 0); rank 0, waiting on it, raised; the
    # launcher then stopped rank 1 while it was exiting.
    failures = {0: RankFailure(1, "exited with status 1", 12.0), 1: RankFailure(143, "killed by SIGTERM (signal 15)", 12.5)}
    ends = {0: ScriptEnd(1, PEER_ERROR, 11_000_000_000), 1: ScriptEnd(0, None, 10_000_000_000)}
    first = first_failure(failures, [], ends)
    assert first is not None
    assert first.rank == 1 and first.text().startswith("rank 1 failed first (its script ended with status 0")
    assert first.exit_status == 1


def test_a_rank_whose_script_failed_passes_on_its_own_status() -> None:
    failures = {0: RankFailure(3, "exited with status 3", 12.0), 1: RankFailure(143, "killed by SIGTERM (signal 15)", 12.5)}
    ends = {0: ScriptEnd(3, "Traceback (most recent call last):\nValueError: bad batch\n", 11_000_000_000)}
    first = first_failure(failures, [], ends)
    assert first is not None and first.rank == 0 and first.exit_status == 3
