"""The torch.profiler importer's per-event shortcuts (a row's step looked up only when its time leaves the latest
step's span, input shapes remembered under one flat key) give what a plain lookup gives, whatever order the events
come in and whatever JSON values their shapes hold."""

from __future__ import annotations

import gzip
import json
import random
import sqlite3
from collections import Counter
from pathlib import Path

from tputrace.cli.main import main
from tputrace.importers.profiler_parts import Shapes


def _rows(trace: Path) -> dict[str, Counter[tuple[object, ...]]]:
    """Each op's and annotation's name, inputs, start and step (what does not depend on the events' order)."""
    connection = sqlite3.connect(trace)
    try:
        return {
            "ops": Counter(connection.execute(
                "SELECT name.text, inputs.text, ops.start_ns, ops.step FROM ops JOIN strings AS name "
                "ON name.id = ops.op_sid LEFT JOIN strings AS inputs ON inputs.id = ops.inputs_sid")),
            "annotations": Counter(connection.execute(
                "SELECT strings.text, source, start_ns, dur_ns, step FROM annotations "
                "JOIN strings ON strings.id = annotations.name_sid")),
        }
    finally:
        connection.close()


def test_events_in_any_order_get_the_steps_of_their_times(tmp_path: Path) -> None:
    from captures import torch_schedule_capture

    capture = torch_schedule_capture(tmp_path)
    shuffled = tmp_path / "shuffled"
    shuffled.mkdir()
    for path in sorted(capture.glob("*.json.gz")):
        document = json.loads(gzip.decompress(path.read_bytes()))
        random.Random(0).shuffle(document["traceEvents"])
        (shuffled / path.name).write_bytes(gzip.compress(json.dumps(document).encode()))
    imported = {}
    for name, folder in (("written", capture), ("shuffled", shuffled)):
        imported[name] = tmp_path / f"{name}.tptrace"
        assert main(["import", str(folder), "-o", str(imported[name])]) == 0
    written, reordered = _rows(imported["written"]), _rows(imported["shuffled"])
    steps = {step for _, _, _, step in written["ops"]}
    assert len(steps) >= 4  # two windows of two steps: rows of every step come before rows of earlier ones
    assert written == reordered


def test_shapes_of_different_json_values_are_told_apart() -> None:
    shapes = Shapes()
    assert shapes(["float", "float"], [[2, 3], ["a", "b"]]) == "float[2,3], float[a,b]"
    assert shapes(["float", "float"], [[2, 3], "ab"]) == "float[2,3], float"
    assert shapes(["float"], [[2, 3], ["a", "b"]]) == "float[2,3]"
    assert shapes(["float", "float"], [[2, 3], []]) == "float[2,3], float"
    assert shapes(["float", "float"], [[2, 3], 5]) == "float[2,3], float"
    assert shapes(["float", "int"], [[2, 3], [4]]) == "float[2,3], int[4]"
    assert shapes(["float", "int"], [[2, 3], [4]]) == "float[2,3], int[4]"
    assert shapes(["float", ["int"]], [[2], [4]]) == "float[2], ['int'][4]"
    assert shapes(None, [[2]]) == ""
