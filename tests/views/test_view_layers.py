"""The layers of the views, read from the source (function-level imports included): `tputrace.derived`
builds only on the store; the TUI and the viewers never import the backend, the recorder, torch or
jax; the TUI never imports plotly, and the viewers never import Textual."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = next(folder for folder in Path(__file__).resolve().parents if (folder / "pyproject.toml").is_file())
BACKEND_SIDE = ("tputrace.backend", "tputrace.recording", "torch", "jax", "jaxlib")
DERIVED_MAY_IMPORT = ("tputrace.derived", "tputrace.dtypes", "tputrace.schema", "tputrace.store", "tputrace.wording")
THIRD_PARTY = ("plotly", "textual", "rich", "numpy", "pandas", "torch", "jax", "jaxlib", "google")


def _imports(folder: str) -> dict[str, set[str]]:
    """Every module each file under `folder` imports, at any depth of its code."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO_ROOT / folder).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
        found[str(path.relative_to(REPO_ROOT))] = names
    return found


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def test_the_view_folders_exist() -> None:
    for folder in ("tputrace/derived", "tui", "viewers/report", "viewers/export"):
        assert _imports(folder), folder


DERIVED_OPTIONAL = {"tputrace/derived/op_columns.py": ("numpy",), "tputrace/derived/op_ranking_columns.py": ("numpy",)}
"""numpy sums millions of ops' columns where it is installed (with the views); `op_ranking` imports these modules
only then (`test_ops_rank_without_numpy`)."""


def test_derived_builds_only_on_the_store() -> None:
    wrong = {
        path: sorted(name for name in names
                     if (name.startswith("tputrace") and not _within(name, DERIVED_MAY_IMPORT))
                     or (_within(name, THIRD_PARTY) and not _within(name, DERIVED_OPTIONAL.get(path, ()))))
        for path, names in _imports("tputrace/derived").items()
    }
    assert not {path: names for path, names in wrong.items() if names}


def test_ops_rank_without_numpy() -> None:
    """Without numpy (a core install) the op ranking, and the summary built on it, read the ops row by row."""
    script = (
        "import sys; sys.modules['numpy'] = None\n"
        "from fixtures.make_traces import build_trace_with_a_flush_inside_an_op\n"
        "import tempfile, pathlib\n"
        "from tputrace.store.reader import open_trace\n"
        "from tputrace.derived.op_ranking import rank_ops, rank_ops_by_rows\n"
        "from tputrace.summary import summarize\n"
        "path = build_trace_with_a_flush_inside_an_op(pathlib.Path(tempfile.mkdtemp()) / 'nested.tptrace')\n"
        "with open_trace(path) as trace:\n"
        "    assert rank_ops(trace, 0) == rank_ops_by_rows(trace, 0)\n"
        "    summarize(trace)\n"
        "assert 'numpy' not in [name for name, module in sys.modules.items() if module is not None]\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "tests")})
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.mark.parametrize(("folder", "forbidden"), [
    ("tui", (*BACKEND_SIDE, "plotly", "tputrace.viewers")),
    ("viewers", (*BACKEND_SIDE, "textual", "tputrace.tui")),
])
def test_views_keep_to_their_side(folder: str, forbidden: tuple[str, ...]) -> None:
    wrong = {path: sorted(name for name in names if _within(name, forbidden)) for path, names in _imports(folder).items()}
    assert not {path: names for path, names in wrong.items() if names}
