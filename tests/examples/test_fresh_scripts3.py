"""Scripts of kinds the other fresh-script tests leave out, each with a problem planted at a known line (or none),
run under `tputrace run` in a subprocess: decoding loops that mark no step (a KV cache grown with `torch.cat`, a
sequence encoded again at each token, a preallocated cache that should read clean), `clip_grad_norm_(...,
error_if_nonfinite=True)`, a metric moved to the CPU after `optimizer.step()`, torch.compile'd functions (a batch dim
marked dynamic while the script picks the batch size, a branch on an `.item()`), a batch made on the chip at a
changing size, and an LSTM over packed sequences."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

import tputrace

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

KV_CAT_DECODE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    D, H, V = 32, 2, 50


    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.qkv = nn.Linear(D, 3 * D)
            self.out = nn.Linear(D, D)
            self.head = nn.Linear(D, V)

        def forward(self, ids, cache=None):
            b, t = ids.shape
            q, k, v = self.qkv(self.emb(ids)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
            if cache is not None:
                k = torch.cat([cache[0], k], dim=2)  {marker}
                v = torch.cat([cache[1], v], dim=2)
            att = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return self.head(self.out(att.transpose(1, 2).reshape(b, t, D))), (k, v)


    model = LM().to("tpu").eval()
    prompt = torch.randint(0, V, (1, 6), device="tpu")
    with torch.no_grad():
        logits, cache = model(prompt)
        out = []
        for i in range(9):
            tok = logits[:, -1].argmax(-1, keepdim=True)
            if tok.item() == V:
                break
            out.append(tok)
            logits, cache = model(tok, cache)
    print(torch.cat(out, 1).cpu())
'''

STATIC_CACHE_DECODE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    D, H, V, MAXLEN = 32, 2, 50, 24


    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.qkv = nn.Linear(D, 3 * D)
            self.out = nn.Linear(D, D)
            self.head = nn.Linear(D, V)

        def forward(self, ids, kc, vc, pos):
            q, k, v = self.qkv(self.emb(ids)).split(D, dim=-1)
            q, k, v = (t.view(1, 1, H, D // H).transpose(1, 2) for t in (q, k, v))
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            mask = torch.arange(MAXLEN, device=ids.device)[None, :] <= pos[:, None]
            att = torch.nn.functional.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)  {marker}
            return self.head(self.out(att.transpose(1, 2).reshape(1, 1, D)))


    model = LM().to("tpu").eval()
    kc, vc = torch.zeros(1, H, MAXLEN, D // H, device="tpu"), torch.zeros(1, H, MAXLEN, D // H, device="tpu")
    tok, out = torch.randint(0, V, (1, 1), device="tpu"), torch.zeros(1, 12, dtype=torch.long, device="tpu")
    with torch.no_grad():
        for i in range(12):
            tok = model(tok, kc, vc, torch.tensor([i], device="tpu"))[:, -1].argmax(-1, keepdim=True)
            out[:, i] = tok[:, 0]
    print(out.cpu())
'''

REENCODED_DECODE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    V, D = 40, 32
    model = nn.ModuleDict(dict(emb=nn.Embedding(V, D), body=nn.Linear(D, D), head=nn.Linear(D, V))).to("tpu").eval()
    ids = torch.randint(1, V, (2, 4), device="tpu")
    with torch.no_grad():
        while ids.shape[1] < 12:
            h = torch.tanh(model["body"](model["emb"](ids))).cumsum(1)
            nxt = model["head"](h[:, -1]).argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)  {marker}
            if (nxt == 0).all():
                break
    print(ids.cpu())
'''

CLIP_NONFINITE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64).to("tpu"), torch.randint(0, 8, (32,)).to("tpu")
    for step in range(5):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)  {marker}
        optimizer.step()
        optimizer.zero_grad()
    print(loss.item())
'''

METRIC_AFTER_STEP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 32, device="tpu"), torch.randint(0, 5, (64,), device="tpu")
    history = []
    for step in range(6):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append((logits.argmax(-1) == y).float().mean().cpu())  {marker}
        history.append(logits.argmax(-1).max().cpu())
        history.append(logits.argmin(-1).max().cpu())
    print(history[-1])
'''

DYNAMIC_COMPILED = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


    @torch.compile(backend="tpu")
    def train_loss(x, y):
        loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
        print("traced")
        return loss


    for step in range(6):
        n = 16 + 4 * (step % 3)
        x = torch.randn(n, 32, device="tpu")  {marker}
        y = torch.randn(n, device="tpu")
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(y, 0)
        loss = train_loss(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

CHIP_MADE_BATCH = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, n in enumerate([16, 20, 24, 18, 26, 22, 30]):
        x = torch.randn(n, 16, device="tpu")  {marker}
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

DATA_AFTER_OPTIMIZER = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32, device="tpu"), torch.randint(0, 4, (16,), device="tpu")  {marker}
    for step in range(4):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

PACKED_LSTM = '''
    import torch
    from torch import nn
    from torch.nn.utils.rnn import pack_padded_sequence

    torch.manual_seed(0)
    emb, lstm, head = nn.Embedding(50, 8).to("tpu"), nn.LSTM(8, 8, batch_first=True).to("tpu"), nn.Linear(8, 2).to("tpu")
    optimizer = torch.optim.SGD([*emb.parameters(), *lstm.parameters(), *head.parameters()], lr=0.1)
    for lengths in ([3, 2, 4, 2], [5, 3, 2, 2], [2, 2, 3, 2], [6, 4, 3, 5], [4, 4, 2, 3]):
        ids, y = torch.randint(1, 50, (4, 6)).to("tpu"), torch.randint(0, 2, (4,)).to("tpu")
        packed = pack_padded_sequence(emb(ids), torch.tensor(lengths), batch_first=True, enforce_sorted=False)  {marker}
        _, (h, _) = lstm(packed)
        loss = nn.functional.cross_entropy(head(h[-1]), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

COMPILED_BRANCH = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4)).to("tpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 32, device="tpu"), torch.randint(0, 4, (32,), device="tpu")


    @torch.compile(backend="tpu")
    def step_loss(x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        if loss.item() > 5.0:  {marker}
            loss = loss * 0.5
        return loss


    for step in range(5):
        loss = step_loss(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_a_kv_cache_grown_by_cat_in_a_decoding_loop_is_a_growing_storm(tmp_path: Path, mode: str) -> None:
    """A decoding loop marks no step. In DeferAndFuse each token's graph is the same ops on a cache one longer, which
    the first graph's other inputs (the prompt's) must not hide: a recompile, and a storm at the `torch.cat` that grows
    by one. In strict mode a weight copied by `.to("tpu")` that has the bytes of the one-token query is no batch copied
    from the host. The stopping check's read gets a decoding loop's advice, not a training loop's."""
    report, script, line = _run(tmp_path, f"kv_cat_{mode}", KV_CAT_DECODE, ("--mode", mode))
    storms = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert len(storms) == 1, [finding.title for finding in storms]
    (storm,) = storms
    assert "grows by 1 at each compile" in storm.title, storm.title
    assert storm.file == str(script) and storm.line in (line, line + 1), (storm.line, line)
    assert storm.module is None, storm.module  # the cat's line, not the attention's module
    assert "static KV cache" in storm.suggestion and "copied" not in storm.title
    with tputrace.open(tmp_path / f"kv_cat_{mode}.tptrace") as trace:
        ((recompiles,),) = trace.sql("SELECT COUNT(*) FROM compiles WHERE reason = 'recompile'")
    assert recompiles >= 6, recompiles  # of 8 graphs of one layout
    (stop,) = [finding for finding in report.findings if finding.analyzer == "syncs" and "(item)" in finding.title]
    assert "loss.detach()" not in stop.suggestion and "stopping check" in stop.suggestion, stop.suggestion


def test_a_preallocated_cache_in_strict_mode_is_no_storm(tmp_path: Path) -> None:
    """Strict mode compiles a view program per tensor the attention line reads (the query, each cache): programs of
    a few shapes compiled in the loop's first iterations and reused to its end are no storm in a run without steps.
    The token written at a Python-int position (`out[:, i] = tok[:, 0]`) compiles a view program per position: that
    is the run's only storm, an index storm at the write's line."""
    report, script, line = _run(tmp_path, "static_cache", STATIC_CACHE_DECODE, ("--mode", "strict"))
    storms = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    write_line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "out[:, i] = " in text)
    assert all("a Python int indexing a tensor" in storm.title and storm.line == write_line for storm in storms), \
        [(storm.title, storm.line) for storm in storms]
    assert line != write_line


def test_a_sequence_grown_by_cat_and_encoded_again_is_a_storm_at_the_cat_outside_the_embedding(tmp_path: Path) -> None:
    """Without a cache the whole sequence is encoded again at each token: the storm is at the `torch.cat` that grows it,
    a line outside the embedding module that first takes the shape, and the `if` that stops the loop gets a decoding
    loop's advice."""
    report, script, line = _run(tmp_path, "reencoded", REENCODED_DECODE)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert (storm.file, storm.line, storm.module) == (str(script), line, None), (storm.title, storm.module)
    assert f"the tensor `torch.cat` extends at {script.name}:{line}" in storm.suggestion, storm.suggestion
    (stop,) = [finding for finding in report.findings if finding.analyzer == "syncs" and "(bool)" in finding.title]
    assert "stopping check" in stop.suggestion and "every N steps" not in stop.suggestion, stop.suggestion


def test_clip_grad_norm_error_if_nonfinite_is_named_with_its_switch(tmp_path: Path) -> None:
    """`error_if_nonfinite=True` reads the total norm's finiteness on the host every step: the finding names that
    read and its switch, not the `if tensor:` advice for a user's own condition."""
    report, script, line = _run(tmp_path, "clip_nonfinite", CLIP_NONFINITE)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "error_if_nonfinite=True" in sync.explanation, sync.explanation
    assert sync.suggestion.startswith("Drop `error_if_nonfinite=True`"), sync.suggestion


def test_a_metric_moved_to_the_cpu_after_the_step_is_not_told_to_move_after_the_step(tmp_path: Path) -> None:
    """The reads already follow `optimizer.step()`; each makes a program of its own: the fusion finding says to
    compute the metric before the step and read it every N steps, not to move it after the step."""
    report, script, line = _run(tmp_path, "metric_after_step", METRIC_AFTER_STEP)
    (fusion,) = [finding for finding in report.findings if finding.analyzer == "fusion"]
    assert "every N steps" in fusion.suggestion and "before `optimizer.step()`" in fusion.suggestion, fusion.suggestion
    assert "after the step, not between layers" not in fusion.suggestion


def test_a_dynamic_compiled_graph_fed_a_size_the_script_picks_is_one_storm_at_the_making_line(tmp_path: Path) -> None:
    """The script picks the batch size: the compiled graph's programs (marked dynamic, compiled per size by XLA) and
    the batch's own eager program (which first compiled that size at another line) are one storm at the line making
    the batch, not at the `print` inside the compiled function where the graph runs; it says marking the dim
    dynamic saves no XLA compiles."""
    report, script, line = _run(tmp_path, "dynamic_compiled", DYNAMIC_COMPILED)
    storms = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert len(storms) == 1, [finding.title for finding in storms]
    (storm,) = storms
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert "one XLA program per concrete size" in storm.explanation, storm.explanation


def test_a_branch_on_an_item_inside_a_compiled_function_is_told_to_use_where(tmp_path: Path) -> None:
    """The `.item()` that breaks the graph picks a branch: the suggestion is `torch.where` inside the compiled
    function, not the loss-logging advice to accumulate `loss.detach()`."""
    report, script, line = _run(tmp_path, "compiled_branch", COMPILED_BRANCH)
    (graph_break,) = [finding for finding in report.findings if finding.analyzer == "graph_breaks"]
    assert (graph_break.file, graph_break.line) == (str(script), line), graph_break.title
    assert graph_break.suggestion.startswith(f"The value picks a branch at {script.name}:{line}"), graph_break.suggestion
    assert "loss.detach()" not in graph_break.suggestion


def test_a_batch_made_on_the_chip_at_a_changing_size_is_not_told_to_pad_in_a_collate_fn(tmp_path: Path) -> None:
    """The size is the script's `torch.randn(n, ...)` on the chip: the storm says to pick that tensor's size from a
    few buckets where the script chooses it, not to pad in a data pipeline it does not have."""
    report, script, line = _run(tmp_path, "chip_made_batch", CHIP_MADE_BATCH)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert storm.suggestion.startswith(f"Give the tensor made on the chip at {script.name}:{line}"), storm.suggestion
    assert "collate_fn" not in storm.suggestion


def test_a_packed_sequence_whose_lengths_change_the_graph_is_one_storm_at_the_packing(tmp_path: Path) -> None:
    """Packing unrolls the LSTM over each batch's lengths: every step's graph has another op count and so another
    name, which no storm by program name finds. The recompiles' diffs name the packed length entering at the
    packing line: one storm there, told to pad instead of packing."""
    report, script, line = _run(tmp_path, "packed_lstm", PACKED_LSTM)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert "programs of different op counts" in storm.title, storm.title
    assert storm.suggestion.startswith(f"`pack_padded_sequence` at {script.name}:{line}"), storm.suggestion


def test_set_up_work_of_several_ops_reads_as_one_piece_of_work(tmp_path: Path) -> None:
    """Two tensors made after the optimizer ran in the first step's graph: the finding at their line names them as
    the set-up work, not as "2 ops ... was"."""
    report, script, line = _run(tmp_path, "data_after_optimizer", DATA_AFTER_OPTIMIZER)
    (set_up,) = [finding for finding in report.findings if finding.analyzer == "set_up_work"]
    assert (set_up.file, set_up.line) == (str(script), line), set_up.title
    assert set_up.explanation.startswith("The set-up work (2 ops, "), set_up.explanation


RECOMPILE_LIMIT = '''
    import torch
    import torch._dynamo
    from torch import nn

    torch._dynamo.config.recompile_limit = 2
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="tpu")
    for step in range(6):
        x = torch.randn(*([2] * min(step, 3)), 8, 16).to("tpu")  # another rank each of the first steps
        loss = compiled(x).pow(2).mean()  {marker}
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
'''


def test_a_function_past_dynamos_recompile_limit_is_named_at_its_call(tmp_path: Path) -> None:
    """Inputs of a new rank fail the compiled graphs' guards until Dynamo's recompile_limit (2 here) stops
    compiling the model: only a log warning says so, and the model runs uncompiled from then on. The finding names
    the calling line, the limit and the last guard failure."""
    report, script, line = _run(tmp_path, "recompile_limit", RECOMPILE_LIMIT)
    (finding,) = [finding for finding in report.findings if finding.analyzer == "recompile_limit"]
    assert (finding.file, finding.line) == (str(script), line), finding.title
    assert finding.title.startswith(f"torch.compile stopped compiling the call at {script.name}:{line}: Dynamo hit "
                                    "its recompile_limit (2) in step "), finding.title
    assert "rank mismatch" in finding.explanation and finding.severity == "warning"
    assert "mark_dynamic" in finding.suggestion and finding.cost_total_ns > 0
