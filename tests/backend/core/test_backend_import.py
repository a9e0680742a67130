"""What `import tputrace.backend` loads: not Dynamo, export's tracer, AOTAutograd or sympy (seconds
of every process's start); what a first op and a first training step load: not Dynamo either; and
what waits for them still works when first used."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tputrace.backend.compat import import_hooks

REPO_ROOT = Path(__file__).resolve().parents[3]
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
NOT_LOADED_BY_A_FIRST_STEP = tuple(name for name in DEFERRED_MODULES if name not in LOADED_BY_TORCH_AT_THE_FIRST_OP)

# A script's first op and a first training step (an MLP and the GPT example's model: forward,
# backward, gradient clipping, an SGD update written out, `loss.item()`), each checked against the CPU.
FIRST_STEP = """
    import copy, json, sys
    import torch
    import tputrace.backend

    sys.path.insert(0, "examples")
    import gpt_train

    torch.tpu.set_eager_mode(sys.argv[1])
    x = torch.arange(16.0).reshape(4, 4)
    assert torch.equal(((x.to("tpu") + 1) @ x.to("tpu")).cpu(), (x + 1) @ x)
    after_an_op = [name for name in sys.argv[2:] if name in sys.modules]


    def step(model, inputs, targets):
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= 0.1 * parameter.grad
        return loss.item()


    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    mlp_tpu = copy.deepcopy(mlp).to("tpu")
    inputs, labels = torch.randn(5, 8), torch.tensor([0, 2, 1, 1, 0])
    assert abs(step(mlp_tpu, inputs.to("tpu"), labels.to("tpu")) - step(mlp, inputs, labels)) < 1e-5
    assert torch.allclose(mlp_tpu[0].weight.cpu(), mlp[0].weight, atol=1e-5)

    config = gpt_train.GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=8, vocab_size=64)
    gpt = gpt_train.GPT(config)
    gpt_tpu = copy.deepcopy(gpt).to("tpu")
    tokens, targets = gpt_train.synthetic_batches(config, 2, 1)[0]
    loss = gpt(tokens, targets)[1]
    loss_tpu = gpt_tpu(tokens.to("tpu"), targets.to("tpu"))[1]
    loss.backward()
    loss_tpu.backward()
    assert abs(loss_tpu.item() - loss.item()) < 1e-4
    assert torch.allclose(gpt_tpu.lm_head.weight.grad.cpu(), gpt.lm_head.weight.grad, atol=1e-4)
    after_a_step = [name for name in sys.argv[2:] if name in sys.modules]
    print(json.dumps([after_an_op, after_a_step]))
"""


def _run_fresh(code: str, *args: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
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


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_a_first_op_and_training_step_load_no_dynamo(mode: str) -> None:
    """Meta-shape inference and decompositions run torch's references, whose Dynamo-disable wrappers
    would import Dynamo at their first call (`refs_before_dynamo`)."""
    after_an_op, after_a_step = json.loads(_run_fresh(FIRST_STEP, mode, *NOT_LOADED_BY_A_FIRST_STEP))
    assert after_an_op == []
    assert after_a_step == []


def test_compile_export_cond_and_dtensor_work_after_a_first_op(tmp_path: Path) -> None:
    """After the references ran without Dynamo, importing it gives them their real Dynamo-disable
    form (as in stock torch), and what Dynamo or export's tracer runs still works."""
    code = f"""
        import sys
        import torch
        import torch.distributed as dist
        import tputrace.backend
        from torch.export import Dim, export

        def disable_wrapper_function(reference):
            wrapper_code = torch._compile._disable_dynamo(lambda: None).__code__
            while reference.__code__ is not wrapper_code:
                reference = reference.__wrapped__
            return dict(zip(wrapper_code.co_freevars, reference.__closure__))["fn"].cell_contents

        x = torch.randn(4, 3)
        assert torch.allclose((x.to("tpu") + 1).cpu(), x + 1)
        add = disable_wrapper_function(torch._refs.add)
        assert "torch._dynamo" not in sys.modules and add.__dynamo_disable is add

        def cond_of(value):
            return torch.cond(value.sum() > 0, lambda v: v * 2 + 1, lambda v: v - 1, (value,))

        assert torch.allclose(cond_of(x.to("tpu")).cpu(), cond_of(x))
        assert "torch._dynamo" in sys.modules
        torch.ones(2, device="meta") + 1
        assert add.__dynamo_disable is not add and add.__dynamo_disable._torchdynamo_disable

        def scaled(value):
            return torch.nn.functional.layer_norm(torch.softmax(value * 2 + 1, dim=-1), (3,)).sum(0)

        compiled = torch.compile(scaled, backend="tpu")
        assert torch.allclose(compiled(x.to("tpu")).cpu(), scaled(x), atol=1e-5)

        class Scaled(torch.nn.Module):
            def forward(self, value):
                return scaled(value)

        program = export(Scaled(), (x.to("tpu"),), dynamic_shapes={{"value": {{0: Dim("rows")}}}})
        other = torch.randn(7, 3)
        assert torch.allclose(program.module()(other.to("tpu")).cpu(), scaled(other), atol=1e-5)

        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import Shard, distribute_tensor

        dist.init_process_group("tpu", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
        try:
            sharded = distribute_tensor(x.to("tpu"), DeviceMesh("tpu", [0]), [Shard(0)])
            assert torch.allclose((sharded * 2 + 1).full_tensor().cpu(), x * 2 + 1)
        finally:
            dist.destroy_process_group()
        print("ok")
    """
    assert _run_fresh(code).strip().endswith("ok")


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
