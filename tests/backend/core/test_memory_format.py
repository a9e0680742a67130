"""Memory formats on `tpu`: channels_last tensors report the CPU's strides and `is_contiguous` answers,
ops on them give the CPU's output strides (eager, and in graphs compiled with `backend="tpu"`), and values, views
and writes stay correct, in both eager modes."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from backend_helpers import assert_matches_cpu, eager, host
from tputrace.backend.compat.device_module import EagerMode

CL = torch.channels_last
CL3 = torch.channels_last_3d
FORMATS = (torch.contiguous_format, CL, CL3)
MODES = ["DEFER_NEVER", "DEFER_AND_FUSE"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> object:
    with eager(EagerMode[request.param]):
        yield


def _layout(tensor: torch.Tensor) -> tuple:
    """What a tensor says about its layout: strides and each format's `is_contiguous`."""
    formats = tuple(f for f in FORMATS if (f is not CL or tensor.dim() == 4) and (f is not CL3 or tensor.dim() == 5))
    return tuple(tensor.shape), tensor.stride(), tuple(tensor.is_contiguous(memory_format=f) for f in formats)


def _assert_same(cpu: torch.Tensor, tpu: torch.Tensor, values: bool = True, atol: float | None = None) -> None:
    """The CPU's layout, and with `values` its values."""
    assert tpu.device.type == "tpu"
    assert _layout(tpu) == _layout(cpu)
    if values:
        assert_matches_cpu(tpu, cpu, atol=atol)


def _values(*shape: int) -> torch.Tensor:
    torch.manual_seed(sum(shape))
    return torch.randn(*shape)


CONVERSIONS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], bool]] = {
    "to": (lambda x: x.to(memory_format=CL), True),
    "contiguous": (lambda x: x.contiguous(memory_format=CL), True),
    "clone": (lambda x: x.clone(memory_format=CL), True),
    "clone_preserve": (lambda x: x.contiguous(memory_format=CL).clone(), True),
    "back_to_contiguous": (lambda x: x.contiguous(memory_format=CL).contiguous(), True),
    "to_dtype_preserves": (lambda x: x.contiguous(memory_format=CL).to(torch.float64), True),
    "to_dtype_and_format": (lambda x: x.to(torch.float16, memory_format=CL), True),
    "empty_like": (lambda x: torch.empty_like(x, memory_format=CL), False),
    "empty_like_preserve": (lambda x: torch.empty_like(x.contiguous(memory_format=CL)), False),
    "zeros_like_preserve": (lambda x: torch.zeros_like(x.contiguous(memory_format=CL)), True),
    "ones_like": (lambda x: torch.ones_like(x, memory_format=CL), True),
    "full_like_preserve": (lambda x: torch.full_like(x.contiguous(memory_format=CL), 2.0), True),
    "randn_like_preserve": (lambda x: torch.randn_like(x.contiguous(memory_format=CL)), False),
    "empty": (lambda x: torch.empty(2, 3, 4, 5, device=x.device, memory_format=CL), False),
    "empty_strided": (lambda x: torch.empty_strided((2, 3, 4, 5), (60, 1, 15, 3), device=x.device), False),
    "new_empty_strided": (lambda x: x.new_empty_strided((2, 3, 4, 5), (60, 1, 15, 3)), False),
    "empty_like_3d": (lambda x: torch.empty_like(x.reshape(2, 3, 2, 2, 5), memory_format=CL3), False),
    "to_3d": (lambda x: x.reshape(2, 3, 2, 2, 5).to(memory_format=CL3), True),
    "size_one_spatial": (lambda x: x[:, :, :1, :1].contiguous(memory_format=CL), True),
}


@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_conversions_give_the_cpus_strides(name: str, mode: object) -> None:
    convert, compare_values = CONVERSIONS[name]
    values = _values(2, 3, 4, 5)
    _assert_same(convert(values), convert(values.to("tpu")), compare_values)


def test_transfers_keep_channels_last_both_ways(mode: object) -> None:
    values = _values(2, 3, 4, 5).contiguous(memory_format=CL)
    on_chip = values.to("tpu")
    _assert_same(values, on_chip)
    back = on_chip.cpu()
    assert back.stride() == values.stride() and torch.equal(back, values)
    assert on_chip.to("cpu", memory_format=torch.contiguous_format).is_contiguous()
    assert host(on_chip.permute(0, 2, 3, 1)).is_contiguous()


def test_module_to_channels_last_converts_4d_parameters(mode: object) -> None:
    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(64, 2))

    cpu, tpu = model(), model().to("tpu")
    cpu.to(memory_format=CL)
    tpu.to(memory_format=CL)
    for (name, want), got in zip(cpu.named_parameters(), tpu.parameters()):
        assert isinstance(got, nn.Parameter) and got.requires_grad, name
        _assert_same(want.detach(), got.detach())


def _conv_weight() -> torch.Tensor:
    return _values(4, 3, 3, 3)


# Each op takes (x, w) on one device: x a channels_last (2, 3, 8, 8) input, w a (4, 3, 3, 3) weight.
OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "conv2d": lambda x, w: F.conv2d(x, w, padding=1),
    "conv2d_bias_stride": lambda x, w: F.conv2d(x, w, torch.ones(4, device=x.device), stride=2),
    "conv2d_channels_last_weight": lambda x, w: F.conv2d(x.contiguous(), w.contiguous(memory_format=CL)),
    "conv2d_groups": lambda x, w: F.conv2d(x, w[:, :1].repeat(1, 1, 1, 1)[:3], groups=3),
    "conv_transpose2d": lambda x, w: F.conv_transpose2d(x, w.transpose(0, 1).contiguous(), stride=2),
    "batch_norm_train": lambda x, w: F.batch_norm(x, None, None, torch.ones(3, device=x.device) * 2, torch.zeros(3, device=x.device), training=True),
    "batch_norm_eval": lambda x, w: F.batch_norm(x, torch.zeros(3, device=x.device) + 0.5, torch.ones(3, device=x.device) * 2, training=False),
    "relu": lambda x, w: F.relu(x),
    "gelu": lambda x, w: F.gelu(x),
    "silu": lambda x, w: F.silu(x),
    "sigmoid": lambda x, w: torch.sigmoid(x),
    "hardtanh": lambda x, w: F.hardtanh(x),
    "add_self": lambda x, w: x + x,
    "add_contiguous": lambda x, w: x + x.contiguous() * 2,
    "contiguous_add_channels_last": lambda x, w: x.contiguous() + x,
    "add_channel_bias": lambda x, w: x + torch.arange(3.0, device=x.device).reshape(3, 1, 1),
    "mul_scalar": lambda x, w: x * 3,
    "where": lambda x, w: torch.where(x > 0, x, torch.zeros_like(x)),
    "max_pool2d": lambda x, w: F.max_pool2d(x, 2),
    "max_pool2d_indices": lambda x, w: F.max_pool2d(x, 2, return_indices=True)[1],
    "avg_pool2d": lambda x, w: F.avg_pool2d(x, 2),
    "adaptive_avg_pool2d_1": lambda x, w: F.adaptive_avg_pool2d(x, 1),
    "adaptive_avg_pool2d_3": lambda x, w: F.adaptive_avg_pool2d(x, 3),
    "interpolate_nearest": lambda x, w: F.interpolate(x, scale_factor=2, mode="nearest"),
    "cat": lambda x, w: torch.cat([x, x * 2], dim=1),
    "mean_hw": lambda x, w: x.mean(dim=(2, 3), keepdim=True),
    "sum_batch": lambda x, w: x.sum(0),
    "dropout_eval": lambda x, w: F.dropout(x, 0.5, training=False),
    "host_fallback": lambda x, w: torch.special.airy_ai(x),  # no lowering: runs on the host CPU
}


@pytest.mark.parametrize("name", list(OPS))
def test_ops_on_channels_last_give_the_cpus_strides_and_values(name: str, mode: object) -> None:
    op = OPS[name]
    values, weight = _values(2, 3, 8, 8).contiguous(memory_format=CL), _conv_weight()
    _assert_same(op(values, weight), op(values.to("tpu"), weight.to("tpu")), atol=1e-4)


BACKWARD_OPS = ["conv2d", "conv2d_channels_last_weight", "batch_norm_train", "relu", "add_contiguous", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d_1", "adaptive_avg_pool2d_3", "interpolate_nearest"]


def _grads(
    op: Callable, values: torch.Tensor, weight: torch.Tensor, leaf_format: torch.memory_format, inner_format: torch.memory_format = CL
) -> tuple[torch.Tensor, ...]:
    """Gradients of an op's weighted sum: of a leaf in `leaf_format` and of a non-leaf (the
    `inner_format` tensor made from a contiguous leaf, whose gradient keeps the op's own strides)."""
    leaf = values.clone(memory_format=leaf_format).requires_grad_()
    base = values.clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    inner = base.contiguous(memory_format=inner_format)
    inner.retain_grad()
    out = op(leaf, weight)
    other = op(inner, weight)
    scale = torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape)
    ((out * scale).sum() + (other * scale).sum()).backward()
    return leaf.grad, inner.grad, base.grad, weight.grad


@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_gradients_of_channels_last_inputs_give_the_cpus_strides(name: str, mode: object) -> None:
    op = OPS[name]
    values, weight = _values(2, 3, 8, 8), _conv_weight()
    for leaf_format in (CL, torch.contiguous_format):
        for want, got in zip(_grads(op, values, weight, leaf_format), _grads(op, values.to("tpu"), weight.to("tpu"), leaf_format)):
            if want is None:
                assert got is None
            else:
                _assert_same(want, got, atol=1e-4)


def test_views_of_channels_last_tensors(mode: object) -> None:
    values = torch.arange(120.0).reshape(2, 3, 4, 5)
    cpu, tpu = values.contiguous(memory_format=CL), values.to("tpu").contiguous(memory_format=CL)
    for view in (
        lambda x: x[:, 1:],
        lambda x: x[1],
        lambda x: x[..., 2:4],
        lambda x: x.permute(0, 2, 3, 1),
        lambda x: x.permute(0, 2, 3, 1).view(2, -1),
        lambda x: x.transpose(1, 3),
        lambda x: x.unsqueeze(0),
        lambda x: x.as_strided((2, 3), (1, 3), 4),
        lambda x: x.reshape(2, -1),
        lambda x: x.flatten(1),
        lambda x: x.flatten(2),
        lambda x: x[:, [2, 0]],
        lambda x: x[x > 60],
        lambda x: x.narrow(2, 1, 2).contiguous(),
        lambda x: x.unbind(1)[2],
        lambda x: x.chunk(2, dim=3)[1],
    ):
        _assert_same(view(cpu), view(tpu))


def test_view_that_needs_contiguity_raises_as_on_the_cpu(mode: object) -> None:
    values = torch.arange(120.0).reshape(2, 3, 4, 5)
    with pytest.raises(RuntimeError) as cpu_error:
        values.contiguous(memory_format=CL).view(2, -1)
    with pytest.raises(RuntimeError) as tpu_error:
        values.to("tpu").contiguous(memory_format=CL).view(2, -1)
    assert str(tpu_error.value) == str(cpu_error.value)


def _writes(device: str) -> list[torch.Tensor]:
    values = torch.arange(120.0, device=device).reshape(2, 3, 4, 5).contiguous(memory_format=CL)
    values[:, 1] = -1
    values[0, :, 2:, 1:3].mul_(10)
    nhwc = values.permute(0, 2, 3, 1)
    nhwc[1, 0].fill_(7)
    flat = nhwc.view(2, -1)
    flat[:, ::7] += 0.5
    values.relu_()
    values.add_(torch.ones(3, 1, 1, device=device))
    moved = values.as_strided((4,), (2,), 3)
    moved.zero_()
    copied = torch.empty_like(values).copy_(values * 2)
    return [values, nhwc, flat, copied, values.contiguous()]


def test_writes_through_views_and_in_place_ops(mode: object) -> None:
    for want, got in zip(_writes("cpu"), _writes("tpu")):
        _assert_same(want, got)


def test_save_and_load_keep_strides_and_values(mode: object) -> None:
    values = _values(2, 3, 4, 5).to("tpu").contiguous(memory_format=CL)
    view = values[:, 1:]
    buffer = io.BytesIO()
    torch.save({"values": values, "view": view}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    cpu = host(values)
    _assert_same(cpu, loaded["values"])
    _assert_same(cpu[:, 1:], loaded["view"])
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu")
    assert on_cpu["values"].stride() == cpu.stride() and torch.equal(on_cpu["values"], cpu)


class _Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + x)


def _small_resnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        _Block(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )


def _train(device: str, steps: int, backend: str | None = None) -> tuple[list[float], list[tuple]]:
    """Losses of SGD steps on the small ResNet in channels_last (run through `torch.compile` with
    `backend` if given), then the layouts of its gradients and parameters."""
    model = _small_resnet().to(device).to(memory_format=CL)
    forward = model if backend is None else torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    images = torch.randn(4, 3, 12, 12).to(device).contiguous(memory_format=CL)
    labels = torch.tensor([0, 1, 2, 3], device=device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(forward(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    layouts = [_layout(parameter.grad) for parameter in model.parameters()] + [_layout(parameter.detach()) for parameter in model.parameters()]
    return losses, layouts


def test_small_resnet_trains_in_channels_last_as_on_the_cpu(mode: object) -> None:
    cpu_losses, cpu_layouts = _train("cpu", 4)
    tpu_losses, tpu_layouts = _train("tpu", 4)
    assert tpu_losses == pytest.approx(cpu_losses, rel=1e-3, abs=1e-4)
    assert tpu_layouts == cpu_layouts


def _compiled(op: Callable, backend: str) -> Callable:
    """`op` under `torch.compile`, after a Dynamo reset (each test compiles one op per device)."""
    torch._dynamo.reset()
    return torch.compile(op, backend=backend)


# Compiled on tpu, against the CPU under `torch.compile(backend="aot_eager")`: the compiled graph's
# outputs, and the gradients its backward graph gives, take the strides the traced graph says.
COMPILED_OPS: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], tuple[int, ...], tuple[int, ...], torch.memory_format]] = {
    "conv2d": (OPS["conv2d"], (2, 3, 8, 8), (4, 3, 3, 3), CL),
    "conv2d_channels_last_weight": (OPS["conv2d_channels_last_weight"], (2, 3, 8, 8), (4, 3, 3, 3), CL),
    "conv_bn_relu_pool": (lambda x, w: F.max_pool2d(F.relu(F.batch_norm(F.conv2d(x, w, padding=1), None, None, training=True)), 2), (2, 3, 8, 8), (4, 3, 3, 3), CL),
    "view_of_conv_output": (lambda x, w: F.conv2d(x, w, padding=1)[:, 1:].permute(0, 2, 3, 1), (2, 3, 8, 8), (4, 3, 3, 3), CL),
    "conv3d": (lambda x, w: F.conv3d(x, w, padding=1), (2, 3, 4, 6, 6), (4, 3, 3, 3, 3), CL3),
    "max_pool3d_scaled": (lambda x, w: F.max_pool3d(x, 2) * w.sum(), (2, 3, 4, 6, 6), (4, 3, 3, 3, 3), CL3),
}


@pytest.mark.parametrize("name", list(COMPILED_OPS))
def test_compiled_graphs_give_outputs_and_gradients_the_cpus_strides(name: str, mode: object) -> None:
    op, shape, weight_shape, memory_format = COMPILED_OPS[name]
    values, weight = _values(*shape), _values(*weight_shape)
    inputs = values.contiguous(memory_format=memory_format)
    _assert_same(_compiled(op, "aot_eager")(inputs, weight), _compiled(op, "tpu")(inputs.to("tpu"), weight.to("tpu")), atol=1e-4)
    for leaf_format in (memory_format, torch.contiguous_format):
        want = _grads(_compiled(op, "aot_eager"), values, weight, leaf_format, memory_format)
        got = _grads(_compiled(op, "tpu"), values.to("tpu"), weight.to("tpu"), leaf_format, memory_format)
        for want_grad, got_grad in zip(want, got):
            _assert_same(want_grad, got_grad, atol=1e-4)


def test_small_resnet_compiled_on_tpu_trains_in_channels_last_as_on_the_cpu(mode: object) -> None:
    cpu_losses, cpu_layouts = _train("cpu", 3, "aot_eager")
    tpu_losses, tpu_layouts = _train("tpu", 3, "tpu")
    assert tpu_losses == pytest.approx(cpu_losses, rel=1e-3, abs=1e-4)
    assert tpu_layouts == cpu_layouts
    cpu_model, tpu_model = _small_resnet().to(memory_format=CL), _small_resnet().to("tpu").to(memory_format=CL)
    images = _values(4, 3, 12, 12).contiguous(memory_format=CL)
    for end in (4, 5):  # after the pooling, and after the residual block
        want = _compiled(cpu_model[:end], "aot_eager")(images)
        got = _compiled(tpu_model[:end], "tpu")(images.to("tpu"))
        _assert_same(want.detach(), got.detach(), atol=1e-4)


def test_dynamic_shape_graphs_keep_channels_last_for_each_size(mode: object) -> None:
    def model(device: str) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).to(device).to(memory_format=CL)

    torch._dynamo.reset()
    cpu, tpu = torch.compile(model("cpu"), backend="aot_eager", dynamic=True), torch.compile(model("tpu"), backend="tpu", dynamic=True)
    for size in (6, 9):
        images = _values(2, 3, size, size).contiguous(memory_format=CL)
        cpu_images, tpu_images = images.clone().requires_grad_(), images.to("tpu").requires_grad_()
        want, got = cpu(cpu_images), tpu(tpu_images)
        _assert_same(want.detach(), got.detach(), atol=1e-4)
        (want * want).sum().backward()
        (got * got).sum().backward()
        _assert_same(cpu_images.grad, tpu_images.grad, atol=1e-4)
