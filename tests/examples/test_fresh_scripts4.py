"""Scripts of kinds the other fresh-script tests leave out, each with a problem planted at a known line (or none),
run under `tputrace run` in a subprocess: a Llama-style decoding step under torch.compile called with the position
as a Python int, `torch.unique` feeding an embedding, a GAN stepping two optimizers in turn, a CLIP-style loss whose
label tensor is made before the loop, diffusion noise drawn on the host, an evaluation every few steps reading two
metrics, `ReduceLROnPlateau` stepped with the loss, losses written into a chip tensor at the step number, a sampling
loop that reads its tokens only at the end, a graph network's edge lists of changing length, and a clean script
(gradient checkpointing under bfloat16 autocast) that must read clean."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

COMPILED_DECODE_INT_POSITION = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    D, H, V, MAXLEN = 32, 4, 64, 32
    HD = D // H


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.qkv = nn.Linear(D, 3 * D, bias=False)
            self.head = nn.Linear(D, V, bias=False)

        def forward(self, tok, kc, vc, pos: int):
            q, k, v = self.qkv(self.emb(tok)).view(1, 1, 3, H, HD).unbind(2)
            kc[:, pos] = k[:, 0]
            vc[:, pos] = v[:, 0]
            att = nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), kc[:, : pos + 1].transpose(1, 2), vc[:, : pos + 1].transpose(1, 2))
            return self.head(att.transpose(1, 2).reshape(1, 1, D))


    block = Block().to("tpu").eval()
    decode = torch.compile(block)
    kc = torch.zeros(1, MAXLEN, H, HD, device="tpu")
    vc = torch.zeros(1, MAXLEN, H, HD, device="tpu")
    tok = torch.tensor([[1]], device="tpu")
    out = []
    with torch.no_grad():
        for pos in range(10):
            tok = decode(tok, kc, vc, pos).argmax(-1)  {marker}
            out.append(tok)
    print(torch.cat(out, 1).cpu())
'''

UNIQUE_EMBEDDING = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    E, D = 200, 16
    table = nn.Embedding(E, D).to("tpu")
    opt = torch.optim.SGD(table.parameters(), lr=0.1)
    for step in range(6):
        ids = torch.randint(0, E, (64,), device="tpu")
        uniq = torch.unique(ids)  {marker}
        vecs = table(uniq)
        loss = -(vecs @ vecs.T).topk(4, dim=-1).values.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

GAN = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    Z = 16
    G = nn.Sequential(nn.Linear(Z, 64), nn.LeakyReLU(0.2), nn.Linear(64, 32), nn.Tanh()).to("tpu")
    D = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)).to("tpu")
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    real = torch.randn(32, 32).to("tpu")
    ones, zeros = torch.ones(32, 1, device="tpu"), torch.zeros(32, 1, device="tpu")
    history = []
    for step in range(6):
        fake = G(torch.randn(32, Z, device="tpu"))
        d_loss = bce(D(real), ones) + bce(D(fake.detach()), zeros)
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(D(fake), ones)
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
        history.append((d_loss.item(), g_loss.item()))  {marker}
    print(history[-1])
'''

CLIP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    img_enc = nn.Sequential(nn.Linear(48, 64), nn.GELU(), nn.Linear(64, 32)).to("tpu")
    txt_emb = nn.EmbeddingBag(100, 32, mode="mean").to("tpu")
    logit_scale = nn.Parameter(torch.tensor(2.659, device="tpu"))
    opt = torch.optim.AdamW(list(img_enc.parameters()) + list(txt_emb.parameters()) + [logit_scale], lr=1e-3)
    images = torch.randn(16, 48).to("tpu")
    tokens = torch.randint(0, 100, (16, 8)).to("tpu")
    labels = torch.arange(16, device="tpu")  {marker}
    for step in range(6):
        i = nn.functional.normalize(img_enc(images), dim=-1)
        t = nn.functional.normalize(txt_emb(tokens), dim=-1)
        logits = logit_scale.exp().clamp(max=100) * i @ t.T
        loss = (nn.functional.cross_entropy(logits, labels) + nn.functional.cross_entropy(logits.T, labels)) / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

CHECKPOINTED = '''
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)) for _ in range(3))
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            for block in self.blocks:
                x = x + checkpoint(block, x, use_reentrant=False)
            return self.head(x)


    model = Net().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 64).to("tpu"), torch.randint(0, 10, (32,)).to("tpu")
    for step in range(6):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)  {marker}
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

NOISE_FROM_THE_HOST = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.SiLU(), nn.Conv2d(16, 1, 3, padding=1)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    alphas_bar = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 100), 0).to("tpu")
    data = torch.randn(8, 1, 16, 16).to("tpu")
    for step in range(6):
        t = torch.randint(0, 100, (8,), device="tpu")
        noise = torch.randn(8, 1, 16, 16).to("tpu")  {marker}
        a = alphas_bar[t][:, None, None, None]
        loss = nn.functional.mse_loss(model(a.sqrt() * data + (1 - a).sqrt() * noise), noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

EVALUATION_EVERY_FEW_STEPS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 32).to("tpu"), torch.randint(0, 16, (64,)).to("tpu")
    xv, yv = torch.randn(64, 32).to("tpu"), torch.randint(0, 16, (64,)).to("tpu")
    history = []
    for step in range(12):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 3 == 0:
            with torch.no_grad():
                acc = (model(xv).argmax(-1) == yv).float().mean().item()  {marker}
                val_loss = nn.functional.cross_entropy(model(xv), yv).item()
            history.append((acc, val_loss))
    print(history)
'''

PLATEAU_ON_THE_LOSS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=2)
    x, y = torch.randn(128, 32).to("tpu"), torch.randn(128, 1).to("tpu")
    for step in range(8):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lr_scheduler.step(loss)  {marker}
    print(loss.item())
'''

LOSSES_WRITTEN_AT_THE_STEP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 32).to("tpu")
    losses = torch.zeros(8, device="tpu")
    for step in range(8):
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        losses[step] = loss.detach()  {marker}
        opt.step()
    print(losses.cpu())
'''

SAMPLED_DECODE_READ_AT_THE_END = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    V, D, LENGTH = 50, 32, 8
    emb, cell, head = nn.Embedding(V, D).to("tpu"), nn.GRUCell(D, D).to("tpu"), nn.Linear(D, V).to("tpu")
    h = torch.zeros(4, D, device="tpu")
    tok = torch.zeros(4, dtype=torch.long, device="tpu")
    tokens = []
    with torch.no_grad():
        for i in range(LENGTH):
            h = cell(emb(tok), h)
            top = (head(h) / 0.8).topk(10, dim=-1)
            tok = top.indices.gather(1, torch.multinomial(torch.softmax(top.values, -1), 1)).squeeze(1)
            tokens.append(tok)
    print(torch.stack(tokens, 1).cpu())  {marker}
'''

GRAPH_EDGES_PER_BATCH = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    N, D = 64, 32


    class GCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1 = nn.Linear(D, D)
            self.lin2 = nn.Linear(D, 4)

        def forward(self, x, src, dst):
            h = self.lin1(x)
            agg = torch.zeros_like(h).index_add_(0, dst, h[src])
            deg = torch.zeros(x.shape[0], device=x.device).index_add_(0, dst, torch.ones_like(dst, dtype=h.dtype))
            return self.lin2(torch.relu(agg / deg.clamp(min=1)[:, None]))


    model = GCN().to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(N, D, device="tpu"), torch.randint(0, 4, (N,), device="tpu")
    torch.tpu.synchronize()
    for step in range(6):
        edges = torch.randint(0, N, (2, int(torch.randint(100, 200, ()).item()))).to("tpu")  {marker}
        loss = nn.functional.cross_entropy(model(x, edges[0], edges[1]), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_compiled_step_called_with_an_int_position_is_one_finding_at_the_call(tmp_path: Path) -> None:
    """Dynamo specialises the decoding step on `pos` and traces it again at each token until its recompile limit:
    one finding at the calling line, costing those recompiles and their graphs' compiles (most of the run), naming
    the value and the limit, with a tensor position as the fix; the limit's own finding is left out."""
    report, script, line = _run(tmp_path, "compiled_int_position", COMPILED_DECODE_INT_POSITION)
    (guards,) = [finding for finding in report.findings if finding.analyzer == "guard_recompiles"]
    assert (guards.file, guards.line) == (str(script), line), guards.title
    assert "for each value of `pos`" in guards.title and "recompile_limit" in guards.title, guards.title
    assert guards.severity == "critical" and report.findings[0] is guards, [f.title for f in report.findings]
    assert "as a tensor" in guards.suggestion, guards.suggestion
    assert not [finding for finding in report.findings if finding.analyzer == "recompile_limit"]


def test_unique_ids_read_by_an_embedding_are_the_uniques_storm(tmp_path: Path) -> None:
    """The fused program takes `torch.unique`'s result at its padded length and slices it to the count at the
    embedding's line (`op 1 view (...): non-tensor arguments 56 -> 52`): that recompile is the unique's too, so the
    storm is found, at the unique's line, with a fixed-shape rewrite."""
    report, script, line = _run(tmp_path, "unique_embedding", UNIQUE_EMBEDDING)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert "the number of unique values" in storm.title and "one_hot" in storm.suggestion, storm.title
    assert "fragmented-fusion finding" not in storm.explanation  # the run has none: its syncs are the sync finding's


def test_a_read_each_iteration_of_a_loop_stepping_two_optimizers_is_per_iteration(tmp_path: Path) -> None:
    """A GAN steps its discriminator's and its generator's optimizers in turn: each loop iteration is one step, and
    a loss read every iteration reads as such, with the per-step advice, not as a read 'every 2 steps' told to read
    less often."""
    report, script, line = _run(tmp_path, "gan", GAN)
    assert report.step_count == 6
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert f"Host sync 2 times per step at {script.name}:{line} (item)" in sync.title, sync.title
    assert "already reads every" not in sync.suggestion and "loss.detach()" in sync.suggestion, sync.suggestion


def test_set_up_work_compiled_again_once_is_no_critical_finding(tmp_path: Path) -> None:
    """A label tensor made before the loop runs in the first step's graph: the second step compiles once more, a
    large share of a six-step run but paid once, so a warning, not critical."""
    report, script, line = _run(tmp_path, "clip", CLIP)
    (set_up,) = [finding for finding in report.findings if finding.analyzer == "set_up_work"]
    assert (set_up.file, set_up.line) == (str(script), line), set_up.title
    assert set_up.severity == "warning", set_up.severity


def test_gradient_checkpointing_under_bfloat16_autocast_reads_clean(tmp_path: Path) -> None:
    """Recomputed blocks in the backward and autocast to bfloat16: no finding but the compile cache's note. (A
    host-bound finding may come or not: it weighs the host's measured dispatch against the chip's measured time,
    which on a model this small are close and move with the host's load.)"""
    report, script, line = _run(tmp_path, "checkpointed", CHECKPOINTED)
    analyzers = [finding.analyzer for finding in report.findings if finding.analyzer != "host_bound"]
    assert analyzers == ["compile_cache"], [f.title for f in report.findings]


def test_noise_drawn_on_the_host_and_copied_is_told_to_be_drawn_on_the_chip(tmp_path: Path) -> None:
    """A diffusion step's noise drawn with `torch.randn(...)` on the host and moved each step: the copy's finding
    names the host draw and its fix (draw it on the chip), not a constant's or an input batch's."""
    report, script, line = _run(tmp_path, "noise_from_the_host", NOISE_FROM_THE_HOST)
    (copy,) = [finding for finding in report.findings if finding.analyzer == "transfers" and finding.line == line]
    assert "random numbers drawn on the host by `torch.randn`" in copy.explanation, copy.explanation
    assert "`torch.randn(..., device=x.device)`" in copy.suggestion and "input batch" not in copy.suggestion, copy.suggestion


def test_metrics_read_one_after_another_in_the_same_steps_are_told_to_be_read_together(tmp_path: Path) -> None:
    """An evaluation every 3 steps reads an accuracy and a loss, each with `.item()`: both lines' findings say the
    other line reads in the same steps and that one read of both stacked waits once."""
    report, script, line = _run(tmp_path, "evaluation_every_few_steps", EVALUATION_EVERY_FEW_STEPS)
    syncs = {finding.line: finding for finding in report.findings if finding.analyzer == "syncs"}
    assert set(syncs) == {line, line + 1}, [finding.title for finding in syncs.values()]
    assert f"reads in the same steps as {script.name}:{line + 1}" in syncs[line].suggestion, syncs[line].suggestion
    assert "one wait instead of 2" in syncs[line + 1].suggestion, syncs[line + 1].suggestion


def test_a_plateau_scheduler_stepped_with_the_loss_is_named_as_the_read(tmp_path: Path) -> None:
    """`ReduceLROnPlateau.step(loss)` reads the loss with `float()` inside torch: the finding says so and suggests
    stepping it less often with a metric worth the read, not the `.item()` advice for a read the script makes."""
    report, script, line = _run(tmp_path, "plateau_on_the_loss", PLATEAU_ON_THE_LOSS)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "`ReduceLROnPlateau.step(metric)`" in sync.explanation, sync.explanation
    assert sync.suggestion.startswith("Step the plateau scheduler less often"), sync.suggestion


def test_a_tensor_written_at_the_step_number_is_a_storm_with_a_chip_position_as_the_fix(tmp_path: Path) -> None:
    """`losses[step] = loss.detach()` bakes the step number into the program, so it compiles again every step with
    the same input shapes: a storm (the view's index changes), recorded where the write is flushed (the planted line
    or the next), whose fix is a position kept on the chip (`index_copy_`), not bucketing."""
    report, script, line = _run(tmp_path, "losses_written_at_the_step", LOSSES_WRITTEN_AT_THE_STEP)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert storm.file == str(script) and storm.line in (line, line + 1), (storm.line, storm.title)
    assert "as a Python int indexing a tensor changes" in storm.title and storm.severity == "critical", storm.title
    assert "index_copy_" in storm.suggestion and report.findings[0] is storm, storm.suggestion


def test_a_decoding_loop_reading_its_tokens_once_at_the_end_is_an_unrolled_loop_not_a_sync(tmp_path: Path) -> None:
    """A run without steps that reads its result once, after the loop, as its last work: that wait is the result
    itself, with nothing to save, so no host-sync finding. The loop read nothing, so its 8 iterations ran as one
    program: that is the finding, at the loop's lines, with a step mark per iteration as the fix."""
    report, script, line = _run(tmp_path, "sampled_decode", SAMPLED_DECODE_READ_AT_THE_END)
    assert not [finding.title for finding in report.findings if finding.analyzer == "syncs"]
    (unrolled,) = [finding for finding in report.findings if finding.analyzer == "fusion"]
    assert unrolled.title.startswith(f"A loop ran unrolled: 8 iterations of {script.name}:{line - 4}-{line - 2}"), unrolled.title
    assert f"read at {script.name}:{line}" in unrolled.title and "`tputrace.step()`" in unrolled.suggestion


def test_edge_lists_of_changing_length_are_told_to_pad_with_a_dummy_node(tmp_path: Path) -> None:
    """A graph network's edge list, copied at a new length each batch, scatters with `index_add_`: the storm at the
    copying line says to pad it with indices of a dummy row, not to mask padding in attention and the loss."""
    report, script, line = _run(tmp_path, "graph_edges", GRAPH_EDGES_PER_BATCH)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert "dummy row" in storm.suggestion and "attention" not in storm.suggestion, storm.suggestion
    assert "collate_fn" not in storm.explanation, storm.explanation
