"""torch.compile(backend="tpu") on patterns found by probing against eager CPU: outputs that are views
(of an input, of each other, of an intermediate), compiled foreach optimizer steps under an LR
schedule, and the `prims.fma` Dynamo writes into graphs any backend may run op by op."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._dynamo

from backend_helpers import eager, host, recorded_fallbacks
from tputrace.backend.compat.device_module import EagerMode


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _strided_view_of_mutated_input(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x[::2]


def _views_of_an_output(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * 2
    return y, y.view(-1), y[0], y.t()


def _views_of_an_intermediate(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x + 1
    return y.view(-1), y.t(), y.split(1)[1]


def _compiled_and_cpu(fn: Callable[..., object], cpu_input: torch.Tensor) -> tuple[object, object, torch.Tensor, torch.Tensor]:
    tpu_input, cpu_copy = cpu_input.to("tpu"), cpu_input.clone()
    return torch.compile(fn, backend="tpu")(tpu_input), fn(cpu_copy), tpu_input, cpu_copy


def test_a_strided_view_of_a_mutated_input_reads_its_input_as_on_the_cpu() -> None:
    ours, theirs, tpu_input, cpu_input = _compiled_and_cpu(_strided_view_of_mutated_input, torch.arange(6.0))
    assert host(ours).tolist() == theirs.tolist() == [0.0, 4.0, 8.0]
    assert ours.stride() == theirs.stride()
    tpu_input.add_(1)
    cpu_input.add_(1)
    assert host(ours).tolist() == theirs.tolist()  # still a view of the input


@pytest.mark.parametrize("fn", [_views_of_an_output, _views_of_an_intermediate])
def test_outputs_that_are_views_of_one_base_alias_each_other_as_on_the_cpu(fn: Callable[..., tuple[torch.Tensor, ...]]) -> None:
    ours, theirs, _, _ = _compiled_and_cpu(fn, torch.arange(6.0).view(2, 3))
    for our, their in zip(ours, theirs):
        assert host(our).tolist() == their.tolist() and our.stride() == their.stride()
    ours[0].add_(10)
    theirs[0].add_(10)
    ours[1].mul_(-1)
    theirs[1].mul_(-1)
    for our, their in zip(ours, theirs):
        assert host(our).tolist() == their.tolist()


def test_view_outputs_of_a_training_graph_give_cpu_gradients() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = (x @ w).tanh()
        return y, y.view(-1), y.t()

    torch.manual_seed(0)
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    tpu_w, cpu_w = w.to("tpu").requires_grad_(), w.clone().requires_grad_()
    ours = torch.compile(fn, backend="tpu")(x.to("tpu"), tpu_w)
    theirs = fn(x, cpu_w)
    sum(out.square().sum() * (index + 1) for index, out in enumerate(ours)).backward()
    sum(out.square().sum() * (index + 1) for index, out in enumerate(theirs)).backward()
    for our, their in zip(ours, theirs):
        assert torch.allclose(host(our), their, atol=1e-6)
    assert torch.allclose(host(tpu_w.grad), cpu_w.grad, atol=1e-5)


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, foreach=True),
        lambda params: torch.optim.Adam(params, lr=0.01, foreach=True),
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True),
    ],
    ids=["adamw", "adam", "sgd"],
)
def test_a_compiled_foreach_step_under_an_lr_schedule_compiles_twice_and_matches_the_cpu(make_optimizer: Callable[..., torch.optim.Optimizer]) -> None:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model.load_state_dict(reference.state_dict())
    model = model.to("tpu")
    cpu_optimizer, optimizer = make_optimizer(reference.parameters()), make_optimizer(model.parameters())
    cpu_schedule = torch.optim.lr_scheduler.StepLR(cpu_optimizer, 1, gamma=0.8)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.8)

    @torch.compile(backend="tpu")
    def step() -> None:
        optimizer.step()

    counters.clear()
    for _ in range(6):
        inputs, targets = torch.randn(5, 6), torch.randn(5, 3)
        torch.nn.functional.mse_loss(reference(inputs), targets).backward()
        cpu_optimizer.step()
        cpu_optimizer.zero_grad()
        cpu_schedule.step()
        torch.nn.functional.mse_loss(model(inputs.to("tpu")), targets.to("tpu")).backward()
        step()
        optimizer.zero_grad()
        schedule.step()
    # The first lr compiles as a constant, the second as a graph input; later lrs reuse that graph.
    assert counters["stats"]["unique_graphs"] == 2
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(host(ours), theirs, atol=1e-5)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "tpu"])
@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE], ids=["strict", "defer"])
def test_a_compiled_adam_step_runs_dynamos_fma_on_the_chip_under_any_backend(backend: str, mode: EagerMode) -> None:
    """Dynamo writes `addcmul_(..., value=)`, `addcdiv_(..., value=)` and `add_(..., alpha=tensor)` as
    `prims.fma`; the eager and aot_eager backends dispatch it to the device op by op."""
    torch.manual_seed(0)
    start, grad = torch.randn(5), torch.randn(5)
    cpu_param, param = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.to("tpu"))
    cpu_optimizer = torch.optim.Adam([cpu_param], lr=0.01, foreach=False)
    optimizer = torch.optim.Adam([param], lr=0.01, foreach=False)
    step = torch.compile(optimizer.step, backend=backend)
    with eager(mode), recorded_fallbacks() as fallbacks:
        for _ in range(3):
            cpu_param.grad, param.grad = grad.clone(), grad.to("tpu")
            cpu_optimizer.step()
            step()
        ours = host(param)
    assert fallbacks == []
    assert torch.allclose(ours, cpu_param.detach(), atol=1e-6)


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE], ids=["strict", "defer"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_compiled_product_of_two_dtypes_raises_torchs_error_at_every_call(mode: EagerMode, dynamic: bool) -> None:
    """Meta kernels let `mm(float32, float64)` through, so Dynamo and AOTAutograd trace it; the CPU
    kernel refuses it at run time, and so does the compiled tpu graph (rather than promoting)."""
    x, y = torch.randn(2, 3), torch.randn(3, 2, dtype=torch.float64)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.mm(x, y)
    compiled = torch.compile(lambda a, b: torch.mm(a, b) * 2, backend="tpu", dynamic=dynamic)
    with eager(mode):
        for _ in range(2):
            with pytest.raises(RuntimeError) as error:
                compiled(x.to("tpu").requires_grad_(), y.to("tpu"))
            assert str(error.value) == str(cpu_error.value)


def _with_an_empty_input(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x + 1, x.sum(0), torch.cat([x, y]), y @ y.t()


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE], ids=["strict", "defer"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_an_empty_tpu_input_compiles_and_matches_the_cpu(mode: EagerMode, dynamic: bool) -> None:
    """Dynamo gives the fake of a tensor whose storage holds 0 bytes an empty storage by resizing it,
    which for a tpu storage torch would leave to PrivateUse1 hooks Python cannot register."""
    x, y = torch.zeros(0, 3), torch.randn(2, 3)
    compiled = torch.compile(_with_an_empty_input, backend="tpu", dynamic=dynamic)
    with eager(mode):
        ours = compiled(x.to("tpu"), y.to("tpu"))
        for our, their in zip(ours, _with_an_empty_input(x, y)):
            assert our.shape == their.shape and torch.allclose(host(our), their)


def _rows_gradient(rows: int, device: str) -> torch.Tensor:
    """A (rows, 2) gradient that is contiguous without a contiguous tensor's strides (a transposed view)."""
    return torch.arange(2.0 * rows, device=device).view(2, rows).t()


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE], ids=["strict", "defer"])
@pytest.mark.parametrize("rows", [0, 1], ids=["empty", "one-row"])
def test_a_contiguous_gradient_without_contiguous_strides_flows_through_a_compiled_module(mode: EagerMode, rows: int) -> None:
    """The gradient of an empty batch's output, or of a one-row one, can be contiguous without a
    contiguous tensor's strides; AOTAutograd restrided its inner tensor into a new tpu tensor, which
    it refused as the plain gradient it traced."""
    cpu_module = torch.nn.Linear(3, 2)
    tpu_module = torch.nn.Linear(3, 2).to("tpu")
    tpu_module.load_state_dict(cpu_module.state_dict())
    x = torch.randn(rows, 3)
    with eager(mode):
        ours = torch.compile(tpu_module, backend="tpu")(x.to("tpu"))
        ours.backward(_rows_gradient(rows, "tpu"))
        theirs = cpu_module(x)
        theirs.backward(_rows_gradient(rows, "cpu"))
        for our, their in ((ours, theirs), (tpu_module.weight.grad, cpu_module.weight.grad), (tpu_module.bias.grad, cpu_module.bias.grad)):
            assert our.shape == their.shape and torch.allclose(host(our), their.detach())


def _into_empty_outs(x: torch.Tensor, product: torch.Tensor, values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
    torch.mul(x, 2, out=product)
    torch.max(x, 1, out=(values, indices))
    return product + 1, values, indices


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE], ids=["strict", "defer"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_an_out_tensor_the_op_resizes_breaks_the_compiled_graph_as_on_the_cpu(mode: EagerMode, dynamic: bool) -> None:
    """An `out=` op resized only the traced wrapper's inner tensor; Dynamo, seeing no resize, kept
    tracing and failed building guards for the wrapper's sizes."""
    x = torch.randn(2, 3)
    cpu_outs, tpu_outs = ((torch.empty(0, device=device), torch.empty(0, device=device), torch.empty(0, dtype=torch.long, device=device)) for device in ("cpu", "tpu"))
    with eager(mode):
        ours = torch.compile(_into_empty_outs, backend="tpu", dynamic=dynamic)(x.to("tpu"), *tpu_outs)
        theirs = _into_empty_outs(x, *cpu_outs)
        for our, their in zip((*ours, *tpu_outs), (*theirs, *cpu_outs)):
            assert our.shape == their.shape and host(our).tolist() == their.tolist()
        assert ours[1] is tpu_outs[1] and ours[2] is tpu_outs[2]
