"""What `import tputrace.backend` loads: not Dynamo, export's tracer, AOTAutograd or sympy (seconds
of every process's start), and what waits for them still works when first used."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tputrace.backend import import_hooks

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFERRED_MODULES = (
    "torch._dynamo",
    "torch._functorch.aot_autograd",
    "torch._functorch._aot_autograd.runtime_wrappers",
    "torch.export._trace",
    "torch._inductor",
    "torch.fx.experimental.symbolic_shapes",
    "torch.distributed.tensor",
    "sympy",
)
# torch itself imports these at the first op on a tensor subclass (its argument parser looks for DTensor).
LOADED_BY_TORCH_AT_THE_FIRST_OP = ("torch.fx.experimental.symbolic_shapes", "torch.distributed.tensor", "sympy")


def _run_fresh(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_importing_the_backend_loads_no_dynamo_export_tracer_or_sympy() -> None:
    code = f"""
        import json, sys
        import torch
        import tputrace.backend
        after_import = [name for name in {DEFERRED_MODULES!r} if name in sys.modules]
        assert torch.ones(3, device="tpu").sum().item() == 3
        after_an_op = [name for name in {DEFERRED_MODULES!r} if name in sys.modules]
        print(json.dumps([after_import, after_an_op]))
    """
    after_import, after_an_op = json.loads(_run_fresh(code))
    assert after_import == []
    assert [name for name in after_an_op if name not in LOADED_BY_TORCH_AT_THE_FIRST_OP] == []


def test_cond_while_loop_compile_and_export_work_on_first_use_after_the_import() -> None:
    """Each is the first use of what the backend sets up when Dynamo or export's tracer is imported."""
    code = """
        import sys
        import torch
        import tputrace.backend
        from torch.export import Dim, export

        assert "torch._dynamo" not in sys.modules
        x = torch.randn(4, 3)

        def cond_of(value):
            return torch.cond(value.sum() > 0, lambda v: v * 2, lambda v: v - 1, (value,))

        assert torch.allclose(cond_of(x.to("tpu")).cpu(), cond_of(x))
        assert "tpu" in torch._dynamo.list_backends()

        def loop_of(value):
            return torch.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2), (torch.zeros((), dtype=torch.int64, device=value.device), value))[1]

        assert torch.allclose(loop_of(x.to("tpu")).cpu(), loop_of(x))

        def scaled(value):
            return torch.softmax(value * 2, dim=-1).sum(0)

        compiled = torch.compile(scaled, backend="tpu")
        assert torch.allclose(compiled(x.to("tpu")).cpu(), scaled(x), atol=1e-6)

        class Scaled(torch.nn.Module):
            def forward(self, value):
                return scaled(value)

        program = export(Scaled(), (x.to("tpu"),), dynamic_shapes={"value": {0: Dim("rows")}})
        other = torch.randn(7, 3)
        assert torch.allclose(program.module()(other.to("tpu")).cpu(), scaled(other), atol=1e-6)
        print("ok")
    """
    assert _run_fresh(code).strip().endswith("ok")


@pytest.fixture
def package_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    package = tmp_path / "hooked_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "late.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in ("hooked_package.late", "hooked_package"):
        sys.modules.pop(name, None)


def test_a_callback_runs_once_after_the_module_is_imported(package_dir: Path) -> None:
    seen: list[tuple[int, bool]] = []

    def callback(module: object) -> None:
        parent = sys.modules["hooked_package"]
        seen.append((module.VALUE, getattr(parent, "late", None) is module))  # type: ignore[attr-defined]

    import_hooks.when_imported("hooked_package.late", callback)
    assert seen == []
    import hooked_package.late  # noqa: F401

    assert seen == [(41, True)]
    sys.modules.pop("hooked_package.late")
    import hooked_package.late  # noqa: F401, F811 - imported again: the callback does not run twice

    assert seen == [(41, True)]


def test_a_callback_for_an_imported_module_runs_at_once() -> None:
    seen: list[object] = []
    import_hooks.when_imported("json", seen.append)
    assert seen == [json]
