"""Within the recording side: the event sink (the interface the backend reports through, the recorder and its
execution watcher, live notes, sharding records and recording window) never imports the backend, torch, jax or the lifecycle that
loads them; only the lifecycle does. Read from the source, every import counted (`tests/trace/test_architecture.py` holds the layers)."""

from __future__ import annotations

import pytest

from product_modules import imports_of, product_modules

EVENT_SINK = ("tputrace.recording.interface", "tputrace.recording.recorder", "tputrace.recording.executions",
              "tputrace.recording.live", "tputrace.recording.sharding_records", "tputrace.recording.recording_window",
              "tputrace.recording.user_frames")


def _within(name: str, *packages: str) -> bool:
    return any(name == package or name.startswith(f"{package}.") for package in packages)


@pytest.mark.parametrize("module_name", EVENT_SINK)
def test_the_event_sink_imports_neither_the_backend_nor_the_lifecycle(module_name: str) -> None:
    violations = [
        str(statement)
        for statement in imports_of(product_modules()[module_name])
        if _within(statement.target, "tputrace.backend", "torch", "jax", "jaxlib")
        or (_within(statement.target, "tputrace.recording") and statement.target != "tputrace.recording"
            and not _within(statement.target, *EVENT_SINK))
    ]
    assert not violations, "\n".join(violations)


def test_the_lifecycle_is_what_imports_the_backend() -> None:
    importers = {statement.importer.name for module in product_modules().values() if _within(module.name, "tputrace.recording")
                 for statement in imports_of(module) if _within(statement.target, "tputrace.backend")}
    assert importers and not importers & set(EVENT_SINK)
