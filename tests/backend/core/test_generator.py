"""`torch.Generator(device="tpu")`: reproducible draws, independence from the default generator,
state round trips, torch's wrong-device error, and no new programs in a steady-state loop, in both
eager modes."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.dispatch import dispatcher

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]
TORCH_DEFAULT_SEED = 67280421310721

Draw = Callable[[torch.Generator], torch.Tensor]

# What diffusers-style code and samplers call with `generator=`.
DRAWS: dict[str, Draw] = {
    "randn": lambda g: torch.randn(2, 3, generator=g, device="tpu"),
    "rand": lambda g: torch.rand(5, generator=g, device="tpu"),
    "randint": lambda g: torch.randint(0, 100, (6,), generator=g, device="tpu"),
    "randperm": lambda g: torch.randperm(8, generator=g, device="tpu"),
    "randn_like": lambda g: torch.randn_like(torch.zeros(4, device="tpu"), generator=g),
    "normal_": lambda g: torch.empty(4, device="tpu").normal_(2.0, 0.5, generator=g),
    "uniform_": lambda g: torch.empty(4, device="tpu").uniform_(-1.0, 1.0, generator=g),
    "bernoulli_": lambda g: torch.empty(16, device="tpu").bernoulli_(0.5, generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(3, 10, device="tpu"), 4, generator=g),
}


def _draw_all(generator: torch.Generator) -> list[torch.Tensor]:
    return [host(draw(generator)) for draw in DRAWS.values()]


def _equal(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_a_tpu_generator_is_a_torch_generator_on_the_chip() -> None:
    generator = torch.Generator(device="tpu")
    assert isinstance(generator, torch.Generator)
    assert generator.device == torch.device("tpu", 0)
    assert generator.initial_seed() == TORCH_DEFAULT_SEED  # as a new CUDA generator
    assert torch.Generator("tpu:0").device == torch.Generator(torch.device("tpu")).device == torch.device("tpu", 0)
    cpu_generator = torch.Generator()
    assert type(cpu_generator) is torch.Generator and cpu_generator.device == torch.device("cpu")


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_the_same_seed_draws_the_same_values(mode: EagerMode) -> None:
    with eager(mode):
        first = _draw_all(torch.Generator(device="tpu").manual_seed(0))
        second = _draw_all(torch.Generator(device="tpu").manual_seed(0))
        other_seed = _draw_all(torch.Generator(device="tpu").manual_seed(1))
    assert _equal(first, second)
    assert not torch.equal(first[0], other_seed[0])
    assert sorted(first[list(DRAWS).index("randperm")].tolist()) == list(range(8))


def test_both_eager_modes_draw_the_same_values() -> None:
    with eager(EagerMode.DEFER_NEVER):
        strict = _draw_all(torch.Generator(device="tpu").manual_seed(3))
    with eager(EagerMode.DEFER_AND_FUSE):
        deferred = _draw_all(torch.Generator(device="tpu").manual_seed(3))
    assert _equal(strict, deferred)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_generator_and_the_default_generator_do_not_touch_each_other(mode: EagerMode) -> None:
    with eager(mode):
        torch.tpu.manual_seed(11)
        default_alone = [host(torch.randn(4, device="tpu")) for _ in range(2)]
        generator_alone = _draw_all(torch.Generator(device="tpu").manual_seed(5))

        torch.tpu.manual_seed(11)
        default_state = torch.tpu.get_rng_state()
        generator = torch.Generator(device="tpu").manual_seed(5)
        interleaved = [host(torch.randn(4, device="tpu"))]
        generator_draws = _draw_all(generator)
        interleaved.append(host(torch.randn(4, device="tpu")))
        torch.tpu.manual_seed(99)  # reseeding the default generator leaves the explicit one alone
        assert generator.initial_seed() == 5
    assert _equal(default_alone, interleaved)
    assert _equal(generator_alone, generator_draws)
    assert not torch.equal(default_state, torch.tpu.get_rng_state())


def test_a_generator_seeded_like_the_default_one_draws_the_same_values() -> None:
    torch.tpu.manual_seed(21)
    default_draw = host(torch.randn(6, device="tpu"))
    assert torch.equal(default_draw, host(torch.randn(6, generator=torch.Generator(device="tpu").manual_seed(21), device="tpu")))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_state_round_trips(mode: EagerMode) -> None:
    with eager(mode):
        generator = torch.Generator(device="tpu").manual_seed(7)
        _draw_all(generator)
        state = generator.get_state()
        assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.numel() == 16
        after_state = _draw_all(generator)
        assert generator.set_state(state) is generator
        assert _equal(after_state, _draw_all(generator))

        generator.set_state(state)
        offset = generator.get_offset()
        assert offset == len(DRAWS)
        clone = generator.clone_state()
        restored = pickle.loads(pickle.dumps(generator))
        copied = copy.deepcopy(generator)
        for other in (clone, restored, copied):
            assert other.device == generator.device and other.initial_seed() == 7 and other.get_offset() == offset
            assert _equal(after_state, _draw_all(other))
        assert generator.get_offset() == offset  # the copies drew, the original did not

        generator.set_offset(offset)
        assert _equal(after_state, _draw_all(generator))


def test_seed_and_seed_checks_are_torch_s() -> None:
    generator = torch.Generator(device="tpu")
    seed = generator.seed()
    assert generator.initial_seed() == seed and generator.get_offset() == 0
    assert generator.manual_seed(-1).initial_seed() == 2**64 - 1  # as torch stores a negative seed
    with pytest.raises(RuntimeError, match="manual_seed expected a long"):
        generator.manual_seed("a")
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        generator.set_state(torch.zeros(16))


def test_a_generator_for_another_device_gets_torch_s_error() -> None:
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.randn(3, generator=torch.Generator(), device="tpu")
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.ones(3, device="tpu").bernoulli_(0.5, generator=torch.Generator())


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_draws_are_well_distributed(mode: EagerMode) -> None:
    generator = torch.Generator(device="tpu").manual_seed(0)
    with eager(mode):
        normal = host(torch.randn(200_000, generator=generator, device="tpu")).double()
        uniform = host(torch.rand(200_000, generator=generator, device="tpu")).double()
        integers = host(torch.randint(0, 10, (200_000,), generator=generator, device="tpu"))
        samples = host(torch.multinomial(torch.tensor([0.1, 0.2, 0.7], device="tpu"), 100_000, replacement=True, generator=generator))
    assert abs(normal.mean()) < 0.01 and abs(normal.std() - 1) < 0.01
    assert abs(uniform.mean() - 0.5) < 0.005 and 0 <= uniform.min() and uniform.max() < 1
    counts = torch.bincount(integers, minlength=10).double() / integers.numel()
    assert torch.allclose(counts, torch.full((10,), 0.1, dtype=torch.float64), atol=0.005)
    frequencies = torch.bincount(samples, minlength=3).double() / samples.numel()
    assert torch.allclose(frequencies, torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64), atol=0.01)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_uniform_draws_stay_below_one_on_torchs_grid(dtype: torch.dtype) -> None:
    """torch draws a half type's uniform as k / 2**digits: never 1 (a float32 draw rounded would be)."""
    generator = torch.Generator(device="tpu").manual_seed(0)
    uniform = host(torch.rand(100_000, dtype=dtype, generator=generator, device="tpu")).double()
    steps = {torch.bfloat16: 256, torch.float16: 2048}[dtype]
    assert uniform.max() == 1 - 1 / steps and uniform.min() == 0
    assert torch.equal(uniform * steps, (uniform * steps).floor())
    assert abs(uniform.mean() - (0.5 - 0.5 / steps)) < 0.005


# Complex draws, with torch's CPU moments of each part (mean, variance, lowest, highest): torch draws
# on `view_as_real`, `randn` and `normal_(mean, std)` with std / sqrt(2) per part and mean on both.
COMPLEX_DRAWS: dict[str, tuple[Callable[[torch.Generator, torch.dtype], torch.Tensor], tuple[float, float, float, float]]] = {
    "randn": (lambda g, dtype: torch.randn(100_000, dtype=dtype, generator=g, device="tpu"), (0.0, 0.5, -6.0, 6.0)),
    "rand": (lambda g, dtype: torch.rand(100_000, dtype=dtype, generator=g, device="tpu"), (0.5, 1 / 12, 0.0, 1.0)),
    "randn_like": (lambda g, dtype: torch.randn_like(torch.zeros(100_000, dtype=dtype, device="tpu"), generator=g), (0.0, 0.5, -6.0, 6.0)),
    "rand_like": (lambda g, dtype: torch.rand_like(torch.zeros(100_000, device="tpu"), dtype=dtype, generator=g), (0.5, 1 / 12, 0.0, 1.0)),
    "normal_": (lambda g, dtype: torch.empty(100_000, dtype=dtype, device="tpu").normal_(1.0, 2.0, generator=g), (1.0, 2.0, -12.0, 14.0)),
    "uniform_": (lambda g, dtype: torch.empty(100_000, dtype=dtype, device="tpu").uniform_(-1.0, 3.0, generator=g), (1.0, 4 / 3, -1.0, 3.0)),
    "normal sized": (lambda g, dtype: torch.normal(1.0, 2.0, (100_000,), dtype=dtype, generator=g, device="tpu"), (1.0, 2.0, -12.0, 14.0)),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
@pytest.mark.parametrize("name", COMPLEX_DRAWS)
def test_complex_draws_draw_both_parts_as_torch_does(mode: EagerMode, dtype: torch.dtype, name: str) -> None:
    draw, (mean, variance, lowest, highest) = COMPLEX_DRAWS[name]
    with eager(mode):
        values = host(draw(torch.Generator(device="tpu").manual_seed(0), dtype))
    assert values.dtype == dtype
    for part in (values.real.double(), values.imag.double()):
        assert abs(part.mean() - mean) < 0.02 and abs(part.var() / variance - 1) < 0.03
        assert lowest <= part.min() and part.max() <= highest
    assert abs(torch.corrcoef(torch.stack([values.real, values.imag]).double())[0, 1]) < 0.02


def test_an_op_run_on_the_host_draws_from_the_generator_reproducibly() -> None:
    inputs = -torch.ones(3, device="tpu")  # rrelu_with_noise_functional has no lowering: a CPU fallback

    def draw(generator: torch.Generator) -> torch.Tensor:
        return host(torch.ops.aten.rrelu_with_noise_functional(inputs, torch.zeros(3, device="tpu"), 0.1, 0.3, True, generator)[1])

    with pytest.warns(RuntimeWarning, match="runs on the host CPU"):
        generator = torch.Generator(device="tpu").manual_seed(2)
        first = draw(generator)
    assert generator.get_offset() == 1
    second = draw(torch.Generator(device="tpu").manual_seed(2))
    assert torch.equal(first, second) and ((first >= 0.1) & (first <= 0.3)).all()


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_new_generator_each_step_compiles_nothing_new(mode: EagerMode) -> None:
    def step(seed: int) -> torch.Tensor:
        generator = torch.Generator(device="tpu").manual_seed(seed)
        latents = torch.randn(2, 4, generator=generator, device="tpu")
        noise = torch.empty_like(latents).normal_(generator=generator)
        return host(latents * 0.5 + noise)

    def compiled() -> tuple[int, int]:
        """Single-op plans (each compiled in DeferNever) and fused programs (DeferAndFuse)."""
        return len(dispatcher.plans), len(getattr(dispatcher.executor, "programs", ()))

    with eager(mode):
        step(0)
        before = compiled()
        results = [step(seed) for seed in (1, 2, 1)]
        assert compiled() == before
    assert torch.equal(results[0], results[2]) and not torch.equal(results[0], results[1])
