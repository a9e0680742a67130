"""A TORCH_TRACE log in which Dynamo compiled frames of a library's functions: DDP's forward enters contextlib's
context managers, which break its graph, so Dynamo compiles `contextlib`'s `helper` and `__init__` frames too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import tputrace
from tputrace.cli.main import main

DDP_COMPILE = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", sys.argv[1]
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = torch.compile(torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8)), backend="eager")
    model(torch.randn(2, 8)).sum().backward()
    dist.destroy_process_group()
""")


def test_a_library_functions_compile_is_named_with_its_file_at_the_users_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a free port for the process group's store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = tmp_path / "ddp_compile.py"
    script.write_text(DDP_COMPILE)
    logs = tmp_path / "torch_trace"
    subprocess.run([sys.executable, str(script), str(port)], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "TORCH_TRACE": str(logs)})
    output = tmp_path / "ddp_compile.tptrace"
    assert main(["import", str(logs), "-o", str(output)]) == 0
    call_line = next(number for number, text in enumerate(DDP_COMPILE.splitlines(), 1) if text.startswith("model("))
    with tputrace.open(output) as trace:
        compiles = sorted(trace.records("compiles"), key=lambda row: json.loads(row.detail)["compile_id"])
    assert compiles[0].name == "model"
    library = compiles[1:]
    # contextlib's frames keep their function's name, with the file it is in (not the user's `helper` or `__init__`)
    assert library and all(row.name.endswith(" (contextlib.py)") for row in library)
    assert {row.name for row in library} >= {"helper (contextlib.py)", "__init__ (contextlib.py)"}
    # ... and are placed at the user's line that called the model.
    assert {(Path(row.source.file).name, row.source.line) for row in compiles} == {("ddp_compile.py", call_line)}
