"""On virtual chips the backend turns off LLVM's loop unrolling in XLA:CPU's kernels: a small elementwise
loop (a layer norm's `rsqrt` over a batch's rows) compiles to about as much code as a large one, where
unrolled it was several times more. A user's own backend options are kept, other platforms get none, and
the programs still compute torch's values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from backend_helpers import assert_matches_cpu, eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core import chips

REPO_ROOT = Path(__file__).resolve().parents[3]
UNROLLING_OFF = f"--xla_backend_extra_options={chips.LOOP_UNROLLING_OFF}"

# Compiles rsqrt over a small and a large array after importing the backend; prints each kernel's optimized
# LLVM IR size in lines.
KERNEL_SIZES = """
    import glob, json, os, sys
    import tputrace.backend
    import jax, jax.numpy as jnp
    from jax import lax

    lines = {}
    for shape in [(8, 32), (256, 128)]:
        folder = os.path.join(sys.argv[1], "x".join(map(str, shape)))
        jax.jit(lambda x: lax.rsqrt(x * 0.0078125 + 1e-5)).lower(jnp.ones(shape)).compile({"xla_dump_to": folder})
        (ir,) = glob.glob(os.path.join(folder, "*rsqrt*ir-with-opt.ll"))
        lines["x".join(map(str, shape))] = open(ir).read().count("\\n")
    print(json.dumps({"lines": lines, "flags": os.environ["XLA_FLAGS"]}))
"""


def test_small_loops_compile_to_as_little_code_as_large_ones(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("XLA_FLAGS", "TPUTRACE_PLATFORM")}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(KERNEL_SIZES), str(tmp_path)], capture_output=True, text=True,
                            timeout=600, cwd=REPO_ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.splitlines()[-1])
    assert UNROLLING_OFF in measured["flags"].split()
    # Unrolled, the 256-element loop's kernel was about six times the 32,768-element one's.
    assert measured["lines"]["8x32"] <= 1.5 * measured["lines"]["256x128"], measured


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, [UNROLLING_OFF]),
        ({"TPUTRACE_PLATFORM": "cpu"}, [UNROLLING_OFF]),
        ({"TPUTRACE_PLATFORM": "gpu"}, []),
        ({"XLA_FLAGS": "--xla_backend_extra_options=xla_cpu_disable_slp_vectorizer"}, ["--xla_backend_extra_options=xla_cpu_disable_slp_vectorizer"]),
    ],
    ids=["virtual chips", "cpu named", "gpu", "user's own options"],
)
def test_configure_adds_the_option_only_for_xla_cpu_chips(monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], expected: list[str]) -> None:
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("TPUTRACE_PLATFORM", raising=False)
    monkeypatch.setenv("TPUTRACE_CHIPS", "2")
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    chips.configure()
    flags = os.environ["XLA_FLAGS"].split()
    assert [flag for flag in flags if flag.startswith("--xla_backend_extra_options")] == expected
    assert "--xla_force_host_platform_device_count=2" in flags


def test_transformer_layer_still_matches_cpu_in_one_program() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    tokens = torch.randn(8, 32, 32)
    padding = torch.arange(32)[None] >= torch.tensor([32, 30, 20, 9, 32, 1, 17, 25])[:, None]

    def step(device: str) -> list[torch.Tensor]:
        model = layer.to(device)
        model.zero_grad()
        out = model(tokens.to(device), src_key_padding_mask=padding.to(device))
        (out * out).mean().backward()
        return [host(out), *(host(parameter.grad) for parameter in model.parameters())]

    expected = step("cpu")
    with eager(EagerMode.DEFER_AND_FUSE):
        actual = step("tpu")
    assert_matches_cpu(actual, expected, what="output or gradient")
