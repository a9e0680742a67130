"""Runs a script with the sharding records off (no collective causes, placements, meshes, round trips or
repeated reductions): the baseline that bench/sharding_records.py measures the records against.

    tputrace run --nproc N bench/sharding_records_off.py SCRIPT [ARGS ...]
"""

from __future__ import annotations

from script_runner import run_named_script


def main() -> None:
    from tputrace.backend.distributed import causes, placements, redistributions, sharding_hooks

    sharding_hooks._installed = True  # the hooks are never installed
    causes.cause_id = lambda *args, **kwargs: None  # type: ignore[assignment]
    placements.has_pending = lambda: False  # type: ignore[assignment]
    redistributions.reduces_again = lambda *args, **kwargs: False  # type: ignore[assignment]
    run_named_script()


if __name__ == "__main__":
    main()
