"""Scripts that run `torch.compile(backend="tpu")` as users write them, read wrong before: a forward calling a helper
wrapped with `torch.compiler.disable`; a generation loop whose compiled step takes the prompt, then one token a call,
with a KV cache that grows at every call; a float learning rate or dropout probability that changes each call; an
`if` on a tensor; an int attribute a compiled method increments."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")


def _line(script: Path, text: str) -> int:
    return next(number for number, source in enumerate(script.read_text().splitlines(), 1) if text in source)


DISABLED_HELPER = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    @torch.compiler.disable
    def centre(h):
        return h - h.mean(0)


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 16)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            return self.fc2(centre(h))


    model = torch.compile(Block().to("tpu"), backend="tpu")
    with torch.no_grad():
        for step in range(3):
            out = model(torch.randn(8, 16, device="tpu"))
    print(out.sum().item())
'''


def test_a_break_at_a_disabled_helper_names_the_wrapper_not_the_call_to_remove(tmp_path: Path) -> None:
    """Dynamo's hint "Remove the `torch.compiler.disable` call" is about the decorator: the finding names the function
    and the decorator's line, and says how to keep it uncompiled (call it outside) where it must stay so; it does not
    tell to remove the call the break is at, nor quote the function's memory address."""
    script = tmp_path / "disabled.py"
    script.write_text(textwrap.dedent(DISABLED_HELPER))
    report = record(script, tmp_path / "disabled.tptrace", [])
    call = _line(script, "return self.fc2(centre(h))")
    (disabled,) = [finding for finding in report.findings if finding.analyzer == "graph_breaks" and finding.line == call]
    assert "(centre(), wrapped with torch.compiler.disable)" in disabled.title, disabled.title
    decorator = _line(script, "@torch.compiler.disable")
    assert disabled.suggestion.startswith(
        f"Dynamo's hint to remove the `torch.compiler.disable` call means the wrapper at {script.name}:{decorator}, "
        f"not the call at {script.name}:{call}"), disabled.suggestion
    assert "call `centre` outside the compiled function" in disabled.suggestion, disabled.suggestion
    assert "Otherwise move the call" not in disabled.suggestion
    assert " at 0x" not in disabled.explanation and all(" at 0x" not in item.text for item in disabled.evidence)


GROWING_CACHE = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)


    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.qkv = nn.Linear(16, 48)
            self.out = nn.Linear(16, 32)

        def forward(self, ids, k_cache, v_cache):
            q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
            k_cache = torch.cat([k_cache, k], 1)
            v_cache = torch.cat([v_cache, v], 1)
            return self.out(F.scaled_dot_product_attention(q, k_cache, v_cache)[:, -1]), k_cache, v_cache


    decode = torch.compile(TinyLM().to("tpu").eval(), backend="tpu")
    k_cache = v_cache = torch.zeros(1, 0, 16, device="tpu")
    with torch.no_grad():
        logits, k_cache, v_cache = decode(torch.randint(0, 32, (1, 4), device="tpu"), k_cache, v_cache)
        for t in range(5):
            logits, k_cache, v_cache = decode(logits.argmax(-1, keepdim=True), k_cache, v_cache)
    print(logits.sum().item())
'''


SLICED_POSITION = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, h, cache, pos: int):
            cache[:, pos:pos + h.shape[1]] = self.proj(h)
            return cache.mean(1, keepdim=True)


    step = torch.compile(Step().to("tpu"), backend="tpu")
    cache = torch.zeros(1, 16, 8, device="tpu")
    with torch.no_grad():
        h = step(torch.randn(1, 4, 8, device="tpu"), cache, 0)
        for t in range(5):
            h = step(h, cache, 4 + t)
    print(h.sum().item())
'''


def test_a_generation_loops_size_guards_are_told_its_prompt_and_its_cache_not_to_pad(tmp_path: Path) -> None:
    """A compiled decoding step fed a 4-token prompt, then one token a call, with a KV cache it extends and returns:
    the guard that fails at the first token is paid once, and padding the token to the prompt's length would cost
    every step, so it is an `info` that keeps the two shapes; the guard that fails when the cache first grows is told
    the growth (the dynamic graph then compiles a size a call), and, as the storm of the cache's sizes is, to write at
    positions kept as a tensor, since a slice at a Python int compiles the graph again per value on tpu, as a second
    script's slice at an int `pos` shows, its int named by the script's name for it."""
    script = tmp_path / "generate.py"
    script.write_text(textwrap.dedent(GROWING_CACHE))
    report = record(script, tmp_path / "generate.tptrace", [])
    guards = [finding for finding in report.findings if finding.title.startswith("torch.compile traced TinyLM")]
    (prompt,) = [finding for finding in guards if "went from 4 to 1 along dim 1" in finding.title]
    assert prompt.title.endswith("paid once") and prompt.severity == "info", prompt.title
    assert prompt.line == _line(script, "for t in range(5):") + 1
    assert prompt.suggestion.startswith("Keep the two shapes") and "mask the padding" not in prompt.suggestion
    (cache,) = [finding for finding in guards if finding is not prompt]
    assert cache.title.endswith("a tensor growing by 1 at each call"), cache.title
    (storm,) = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    assert "grows by 1 at each compile" in storm.title, storm.title
    for finding in (cache, storm):
        assert "positions kept as a tensor on the chip" in finding.suggestion, finding.suggestion
        assert "compiles one XLA program per value of it" in finding.suggestion
        assert "mask the padding" not in finding.suggestion and "dynamic=False" not in finding.suggestion
    # a cache written at a Python int position: the int's own guard never failed (the prompt's size guard failed
    # first), so its name is the one the recording took from Dynamo's graph, not AOT's `arg3_1`
    script = tmp_path / "sliced.py"
    script.write_text(textwrap.dedent(SLICED_POSITION))
    report = record(script, tmp_path / "sliced.tptrace", [])
    (position,) = [finding for finding in report.findings if "for each value of the int" in finding.title]
    assert "for each value of the int `pos`" in position.title, position.title


DECAYING_LR = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(8, 8).to("tpu")
    params = list(model.parameters())


    @torch.compile(backend="tpu")
    def sgd_update(params, grads, lr):
        for p, g in zip(params, grads):
            p.add_(g, alpha=-lr)


    for step in range(4):
        loss = model(torch.randn(4, 8, device="tpu")).pow(2).mean()
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            sgd_update(params, grads, 0.1 * 0.9 ** step)
    print(loss.item())
'''


ANNEALED_DROPOUT = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    torch._dynamo.config.cache_size_limit = 2
    model = nn.Linear(8, 8).to("tpu")


    @torch.compile(backend="tpu")
    def noisy(x, p):
        return F.dropout(model(x), p=p)


    with torch.no_grad():
        for step in range(4):
            out = noisy(torch.randn(4, 8, device="tpu"), 0.1 + 0.1 * step)
    print(out.sum().item())
'''


def test_a_float_learning_rate_guard_is_told_tensor_arithmetic_not_a_cache_position(tmp_path: Path) -> None:
    """A compiled update taking a decaying float `lr` as `alpha=` is traced again for each value: the finding names
    the line that reads it (Dynamo quotes it in the first failure only) and tells a 0-d tensor used in arithmetic,
    not the int position's `index_copy_` into a cache nor `torch.tensor([lr])`, which `alpha=` would refuse. A
    dropout probability that reaches the recompile limit on such a guard is told the same, not to pad a dim."""
    script = tmp_path / "decaying_lr.py"
    script.write_text(textwrap.dedent(DECAYING_LR))
    report = record(script, tmp_path / "decaying_lr.tptrace", [])
    (guard,) = [finding for finding in report.findings if "for each value of `lr`" in finding.title]
    assert "(`p.add_(g, alpha=-lr)` reads it)" in guard.explanation, guard.explanation
    assert "0-d tensor on the chip" in guard.suggestion and "`p.sub_(lr * g)`" in guard.suggestion, guard.suggestion
    assert "index_copy_" not in guard.suggestion and "torch.tensor([lr]" not in guard.suggestion
    script = tmp_path / "annealed_dropout.py"
    script.write_text(textwrap.dedent(ANNEALED_DROPOUT))
    report = record(script, tmp_path / "annealed_dropout.tptrace", [])
    (limit,) = [finding for finding in report.findings if finding.analyzer == "recompile_limit"]
    assert "(the last guard that failed: `p == 0.2`, read by `return F.dropout(model(x), p=p)`" in limit.explanation
    assert "0-d tensor on the chip" in limit.suggestion and "pad the changing dim" not in limit.suggestion


TENSOR_BRANCH = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 8)

        def forward(self, x):
            if x.mean() > 0:
                return self.a(x)
            return self.b(x)


    model = torch.compile(Gated().to("tpu"), backend="tpu")
    with torch.no_grad():
        for step in range(3):
            out = model(torch.randn(4, 8, device="tpu"))
    print(out.sum().item())
'''

COUNTING_METHOD = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Trainer:
        def __init__(self):
            self.model = nn.Linear(8, 1).to("tpu")
            self.calls = 0

        @torch.compile(backend="tpu")
        def loss(self, x):
            self.calls += 1
            return self.model(x).square().mean()


    trainer = Trainer()
    for step in range(6):
        loss = trainer.loss(torch.randn(4, 8, device="tpu"))
        loss.backward()
    print(loss.item())
'''


def test_a_branch_on_a_tensor_and_an_int_attribute_are_told_in_the_scripts_terms(tmp_path: Path) -> None:
    """An `if` on a tensor in a compiled forward is named as such, not by Dynamo's `generic_jump TensorVariable()`,
    and told `torch.cond` beside `torch.where` (the sides are layers of their own); an int attribute a compiled
    method increments, made an input after its first guard failed, compiles once per value on tpu and is told to
    stay a tensor or out of the graph, not to be passed to the function it is no argument of."""
    script = tmp_path / "gated.py"
    script.write_text(textwrap.dedent(TENSOR_BRANCH))
    report = record(script, tmp_path / "gated.tptrace", [])
    (branch,) = [finding for finding in report.findings if finding.analyzer == "graph_breaks"]
    assert "(a Python branch on a tensor's value)" in branch.title, branch.title
    assert "`torch.cond(condition, true_fn, false_fn, (x,))`" in branch.suggestion, branch.suggestion
    script = tmp_path / "counting.py"
    script.write_text(textwrap.dedent(COUNTING_METHOD))
    report = record(script, tmp_path / "counting.tptrace", [])
    (counter,) = [finding for finding in report.findings if "for each value of the int `self.calls`" in finding.title]
    assert counter.suggestion.startswith("`self.calls` is an attribute, not an argument"), counter.suggestion
    assert "`self.calls.add_(1)`" in counter.suggestion and "Pass `self.calls`" not in counter.suggestion
