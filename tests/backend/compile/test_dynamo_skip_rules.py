"""When Dynamo is imported the backend marks tputrace's files as skipped by Dynamo (all but the module-call hooks,
which compiled code traces through), rebuilding Dynamo's skip pattern once for them all, not once per module."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

SKIP_RULES = """
    import json
    import tputrace.backend
    import torch._dynamo.trace_rules as trace_rules
    import tputrace.backend.compile as backend_compile
    import tputrace.backend.core.hooks, tputrace.backend.ops.nn, tputrace.cli.main, tputrace.analysis.report

    rebuilds = []
    rebuild = trace_rules._recompile_re
    trace_rules._recompile_re = lambda: (rebuilds.append(1), rebuild())[1]
    backend_compile._keep_dynamo_out()
    modules = {"hooks": tputrace.backend.core.hooks, "nn": tputrace.backend.ops.nn, "cli": tputrace.cli.main,
               "analysis": tputrace.analysis.report}
    skipped = {name: bool(trace_rules.SKIP_DIRS_RE.match(module.__file__)) for name, module in modules.items()}
    print(json.dumps({"rebuilds": len(rebuilds), "skipped": skipped}))
"""


def test_tputrace_files_are_skipped_with_one_rebuild_of_the_pattern() -> None:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(SKIP_RULES)], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.splitlines()[-1])
    assert measured["skipped"] == {"hooks": False, "nn": True, "cli": True, "analysis": True}
    assert measured["rebuilds"] == 1
