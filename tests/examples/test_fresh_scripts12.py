"""Scripts of kinds that read wrong before: a beam search whose token sequence grows by `torch.cat` while a `nonzero`
finds the finished beams (the storm was the nonzero's, told to route experts with a fixed capacity); class weights
counted by `torch.bincount` (told `minlength` keeps the shape); a Gaussian process fitted through
`torch.linalg.cholesky` (its read was an `if tensor:`); a linear-chain CRF over batches padded to their longest
sequence (the storm was at the embedding, not at the batch's copy); a recommender's `nn.EmbeddingBag` fed flat ids
of a changing length (told to mask the padding in attention); a CUDA script's `nn.DataParallel` under `--as-cuda` (it
raised); a custom Function's backward branching on a read value (told to accumulate a loss); DP-SGD's per-sample
gradients by `vmap` (a pile-up at `?:None`); MAML's second-order backward compiled again for its ops' order (a storm
told to pad a weight's dim)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

BEAM_SEARCH = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    V, H, BEAM, MAXLEN, EOS = 50, 32, 4, 10, 2


    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, H)
            self.rnn = nn.GRUCell(H, H)
            self.out = nn.Linear(H, V)

        def step(self, tok, h):
            h = self.rnn(self.emb(tok), h)
            return torch.log_softmax(self.out(h), -1), h


    @torch.no_grad()
    def beam_search(dec, h0):
        h = h0.expand(BEAM, -1).contiguous()
        tokens = torch.zeros(BEAM, 1, dtype=torch.long, device=h0.device)
        scores = torch.zeros(BEAM, device=h0.device)
        finished = []
        for t in range(MAXLEN):
            logp, h = dec.step(tokens[:, -1], h)
            top, idx = (scores[:, None] + logp).view(-1).topk(BEAM)
            beam_idx, tok = idx // V, idx % V
            tokens = torch.cat([tokens[beam_idx], tok[:, None]], 1)  {marker}
            h, scores = h[beam_idx], top
            done = (tok == EOS).nonzero().squeeze(1)  # finished beams
            for d in done.tolist():
                finished.append((scores[d].item(), tokens[d]))
            scores = scores.masked_fill(tok == EOS, -1e9)
            if len(finished) >= BEAM:
                break
        return max(finished, key=lambda f: f[0])[1] if finished else tokens[0]


    dec = Decoder().to("tpu")
    opt = torch.optim.Adam(dec.parameters(), lr=1e-3)
    for step in range(3):
        h = torch.zeros(8, H, device="tpu")
        tgt = torch.randint(3, V, (8, 6), device="tpu")
        loss = 0
        for t in range(tgt.size(1) - 1):
            logp, h = dec.step(tgt[:, t], h)
            loss = loss + nn.functional.nll_loss(logp, tgt[:, t + 1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, beam_search(dec, torch.zeros(1, H, device="tpu")).shape)
'''


def test_a_beams_token_sequence_grown_by_cat_is_the_storm_not_the_nonzero_of_finished_beams(tmp_path: Path) -> None:
    """The programs compile once per length of the token sequence (2, 3, ... 11), which `torch.cat` extends; the
    `nonzero` of the finished beams made results of one recorded length (4, the beam), which pads to no more than one
    larger size: it explains no storm of ten sizes. Its own waits are told the nonzero's fixed-shape forms."""
    report, script, line = _run(tmp_path, "beam_search", BEAM_SEARCH)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert storm.line == line and "grows by 1" in storm.title, storm.title
    assert "routing" not in storm.explanation and "capacity" not in storm.suggestion, storm.suggestion
    nonzero_line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "# finished beams" in text)
    (wait,) = [f for f in report.findings if f.analyzer == "syncs" and f.line == nonzero_line]
    assert "data_dependent" in wait.title and "nonzero_static" in wait.suggestion, wait.suggestion


CLASS_WEIGHTS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    C = 10
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 256), nn.ReLU(), nn.Linear(256, C)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(6):
        x = torch.randn(64, 3, 16, 16, device="tpu")
        y = torch.randint(0, C, (64,), device="tpu")
        counts = torch.bincount(y)  {marker}
        weights = counts.sum() / (counts.float() + 1)
        loss = nn.functional.cross_entropy(model(x), y, weight=weights)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_class_weights_counted_by_bincount_are_told_to_count_into_a_fixed_number_of_bins(tmp_path: Path) -> None:
    """A bincount's length is the largest label plus one, which `minlength` does not fix: its wait each step is told to
    count into a fixed number of bins (`one_hot(...).sum(0)`), not the generic list of fixed-shape forms."""
    report, script, line = _run(tmp_path, "class_weights", CLASS_WEIGHTS)
    (wait,) = [f for f in report.findings if f.analyzer == "syncs" and f.line == line]
    assert wait.title.startswith(f"Host sync every step at {script.name}:{line} (data_dependent)"), wait.title
    assert "F.one_hot(x, num_bins).sum(0)" in wait.suggestion and "minlength" not in wait.suggestion, wait.suggestion


GAUSSIAN_PROCESS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class GP(nn.Module):
        def __init__(self):
            super().__init__()
            self.log_ls = nn.Parameter(torch.zeros(()))
            self.log_noise = nn.Parameter(torch.tensor(-2.0))

        def nll(self, x, y):
            d = torch.cdist(x, x)
            eye = torch.eye(x.size(0), device=x.device)
            K = torch.exp(-0.5 * d ** 2 / self.log_ls.exp() ** 2) + self.log_noise.exp() * eye
            L = torch.linalg.cholesky(K)  {marker}
            alpha = torch.cholesky_solve(y[:, None], L)
            return 0.5 * (y[:, None] * alpha).sum() + torch.log(torch.diagonal(L)).sum()


    model = GP().to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    x = torch.rand(100, 2, device="tpu")
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(100, device="tpu")
    for step in range(6):
        loss = model.nll(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_cholesky_in_the_loss_is_named_as_its_error_check_with_the_ex_form(tmp_path: Path) -> None:
    """`torch.linalg.cholesky` reads its `info` on the host to raise for an input that is not positive-definite: the
    wait is named as that check and told `cholesky_ex`, not `if tensor:`."""
    report, script, line = _run(tmp_path, "gaussian_process", GAUSSIAN_PROCESS)
    (wait,) = [f for f in report.findings if f.analyzer == "syncs" and f.line == line]
    assert "`torch.linalg.cholesky` checking on the host" in wait.explanation, wait.explanation
    assert "torch.linalg.cholesky_ex(A)" in wait.suggestion and "`if tensor:`" not in wait.suggestion, wait.suggestion


LINEAR_CHAIN_CRF = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    V, TAGS, H = 100, 5, 32


    class BiLSTMCRF(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, H, padding_idx=0)
            self.lstm = nn.LSTM(H, H // 2, bidirectional=True, batch_first=True)
            self.emit = nn.Linear(H, TAGS)
            self.trans = nn.Parameter(torch.randn(TAGS, TAGS) * 0.1)

        def forward(self, x, tags, mask):
            e = self.emit(self.lstm(self.emb(x))[0])
            alpha = e[:, 0]
            gold = e[:, 0].gather(1, tags[:, :1]).squeeze(1)
            for t in range(1, e.size(1)):
                nxt = torch.logsumexp(alpha[:, :, None] + self.trans[None] + e[:, t, None, :], 1)
                alpha = torch.where(mask[:, t, None], nxt, alpha)
                step = self.trans[tags[:, t - 1], tags[:, t]] + e[:, t].gather(1, tags[:, t:t + 1]).squeeze(1)
                gold = gold + step * mask[:, t]
            return (torch.logsumexp(alpha, 1) - gold).mean()


    model = BiLSTMCRF().to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(6):
        lengths = torch.randint(2, 4 + step * 3 % 5, (8,))
        lengths[0] = 4 + step * 3 % 5  # the batch is padded to its longest sequence
        T = int(lengths.max())
        mask = torch.arange(T)[None] < lengths[:, None]
        x = (torch.randint(1, V, (8, T)) * mask).to("tpu")  {marker}
        tags = torch.randint(0, TAGS, (8, T)).to("tpu")
        loss = model(x, tags, mask.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_crf_over_batches_padded_to_their_longest_is_the_storm_of_the_batches_copy(tmp_path: Path) -> None:
    """The CRF's loop over time steps unrolls to each batch's length, so each length is a graph of other ops: the
    storm is at the line that copies the batch (the embedding where the length enters is named in the advice)."""
    report, script, line = _run(tmp_path, "linear_chain_crf", LINEAR_CHAIN_CRF)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert storm.line == line and f"the batches copied at {script.name}:{line} change shape" in storm.title, storm.title
    assert storm.suggestion.startswith(f"Pad the batches copied to the chip at {script.name}:{line} to one length")
    assert "mask the steps past each sequence's length" in storm.suggestion, storm.suggestion


EMBEDDING_BAGS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    NUM_IDS, DIM = 1000, 16


    class Recommender(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(NUM_IDS, DIM, mode="sum")
            self.dense = nn.Linear(13, DIM)
            self.top = nn.Sequential(nn.Linear(2 * DIM, 32), nn.ReLU(), nn.Linear(32, 1))

        def forward(self, dense, ids, offsets):
            return self.top(torch.cat([self.dense(dense), self.bag(ids, offsets)], 1)).squeeze(1)


    model = Recommender().to("tpu")
    opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
    for step in range(6):
        lengths = torch.randint(1, 6, (64,))
        ids = torch.randint(0, NUM_IDS, (int(lengths.sum()),)).to("tpu")  {marker}
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]).to("tpu")
        dense, y = torch.randn(64, 13, device="tpu"), torch.randint(0, 2, (64,), device="tpu").float()
        loss = nn.functional.binary_cross_entropy_with_logits(model(dense, ids, offsets), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_embedding_bag_ids_of_a_changing_length_are_told_to_pad_with_the_padding_idx(tmp_path: Path) -> None:
    """The flat ids of the bags change length with every batch: the storm is at the ids' line and told to append ids
    of the bag's `padding_idx` to the last bag, not to mask padding in attention."""
    report, script, line = _run(tmp_path, "embedding_bags", EMBEDDING_BAGS)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert storm.line == line, storm.title
    assert "padding_idx" in storm.suggestion and "attention" not in storm.suggestion, storm.suggestion
    assert "Embedding bags of a length that changes" in storm.explanation, storm.explanation


DATA_PARALLEL_FOR_CUDA = '''
    import random
    import torch
    from torch import nn

    random.seed(0)
    torch.manual_seed(0)


    class MultiTask(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Sequential(nn.Linear(64, 128), nn.GELU())
            self.heads = nn.ModuleDict({{"cls": nn.Linear(128, 10), "tag": nn.Linear(128, 5)}})

        def forward(self, x, task):
            return self.heads[task](self.trunk(x))


    model = nn.DataParallel(MultiTask()).cuda()  {marker}
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(4):
        task = random.choice(["cls", "tag"])
        x = torch.randn(32, 64).cuda()
        out = model(x, task)
        loss = nn.functional.cross_entropy(out, torch.randint(0, out.size(1), (32,)).cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_cuda_scripts_data_parallel_trains_over_two_chips_under_as_cuda(tmp_path: Path) -> None:
    """`nn.DataParallel` in a script written for CUDA: under `--as-cuda` it looks the accelerator up as tpu, so it
    splits the batch over both chips (it raised in its constructor asking CUDA's device properties, then at the
    forward for a module on `tpu:0` where it expected `cuda:0`)."""
    report, _, _ = _run(tmp_path, "data_parallel_for_cuda", DATA_PARALLEL_FOR_CUDA, ("--as-cuda", "--chips", "2"))
    assert report.step_count == 4  # the run ended without raising (`record` checks its exit status)


CLIPPING_FUNCTION = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class ClipGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, limit):
            ctx.limit = limit
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            peak = g.abs().max().item()  {marker}
            if peak > ctx.limit:
                g = g * (ctx.limit / peak)
            return g, None


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 128), nn.Linear(128, 10)

        def forward(self, x):
            return self.b(ClipGrad.apply(torch.relu(self.a(x)), 0.01))


    model = Net().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        x = torch.randn(32, 64, device="tpu")
        y = torch.randint(0, 10, (32,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        stats = {{"loss": loss.item(), "norm": norm.item(), "w": model.a.weight.abs().mean().item()}}  # logged
        print(stats)
'''


def test_a_read_that_a_branch_decides_on_is_told_to_decide_on_the_chip(tmp_path: Path) -> None:
    """A custom autograd Function's backward reads the gradient's peak to decide whether to scale it: its wait is told
    to make the branch arithmetic on the chip (not to accumulate the value and read it every N steps); a logging line
    reading three values is told to stack them and read them at once."""
    report, script, line = _run(tmp_path, "clipping_function", CLIPPING_FUNCTION)
    (decided,) = [f for f in report.findings if f.analyzer == "syncs" and f.line == line]
    assert decided.suggestion.startswith(f"The value read into `peak` decides the Python branch at {script.name}:{line + 1}"), \
        decided.suggestion
    logged = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "# logged" in text)
    (stats,) = [f for f in report.findings if f.analyzer == "syncs" and f.line == logged]
    assert "3 times per step" in stats.title, stats.title
    assert stats.suggestion.startswith("The line reads 3 values one after another"), stats.suggestion
    assert "`torch.stack([loss, norm, ...]).tolist()`" in stats.suggestion, stats.suggestion


PER_SAMPLE_GRADIENTS = '''
    import torch
    from torch import nn
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 2)).to("tpu")
    params = {{k: v.detach() for k, v in model.named_parameters()}}


    def loss_one(p, x, y):
        return nn.functional.cross_entropy(functional_call(model, p, (x[None],)), y[None])


    per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))
    for step in range(6):
        x = torch.randn(64, 32, device="tpu")
        y = torch.randint(0, 2, (64,), device="tpu")
        grads = per_sample(params, x, y)
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
        factor = (1.0 / (norms + 1e-6)).clamp(max=1.0)
        for k in params:
            g = (grads[k] * factor.view(-1, *[1] * (grads[k].dim() - 1))).sum(0)
            params[k] = params[k] - 0.1 * (g + 0.5 * torch.randn_like(g)) / x.size(0)
        print(step, norms.mean().item())  {marker}
'''


def test_per_sample_gradients_by_vmap_pile_up_no_value_of_an_unknown_line(tmp_path: Path) -> None:
    """DP-SGD's per-sample gradients by `vmap(grad(...))`: buffers the functorch transforms make have no line, and
    together they are no line's value piling up (the finding named `?:None` as the kept value)."""
    report, script, line = _run(tmp_path, "per_sample_gradients", PER_SAMPLE_GRADIENTS)
    assert not [f for f in report.findings if "None" in f.title or "?:" in f.title], [f.title for f in report.findings]
    assert [f for f in report.findings if f.analyzer == "syncs" and f.line == line]


META_LEARNING = '''
    import torch
    from torch import nn
    from torch.func import functional_call

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 1)).to("tpu")
    meta_opt = torch.optim.Adam(model.parameters(), lr=1e-3)


    def sample_task():
        amp, phase = torch.rand(1) * 4.9 + 0.1, torch.rand(1) * 3.14
        x = torch.rand(20, 1) * 10 - 5
        return x.to("tpu"), (amp * torch.sin(x + phase)).to("tpu")


    for step in range(6):
        meta_loss = 0.0
        for _ in range(4):
            x, y = sample_task()
            params = dict(model.named_parameters())
            for _ in range(3):
                loss = nn.functional.mse_loss(functional_call(model, params, (x[:10],)), y[:10])
                grads = torch.autograd.grad(loss, params.values(), create_graph=True)
                params = {{k: p - 0.01 * g for (k, p), g in zip(params.items(), grads)}}
            meta_loss = meta_loss + nn.functional.mse_loss(functional_call(model, params, (x[10:],)), y[10:])
        meta_opt.zero_grad()
        (meta_loss / 4).backward()  {marker}
        meta_opt.step()
    print(meta_loss.item())
'''


def test_a_meta_learning_backward_compiled_again_for_its_ops_order_is_no_shape_storm(tmp_path: Path) -> None:
    """MAML's second-order backward runs its ops in another order in its first steps, so its program compiles again
    with the same inputs in another order: no shape changed, so no storm tells to pad a dim (it said `input 29 dim 1
    took 2 values (1, 40)`: a weight's two dims)."""
    report, script, line = _run(tmp_path, "meta_learning", META_LEARNING)
    assert report.step_count == 6
    assert not [f for f in report.findings if f.analyzer == "recompiles"], [f.title for f in report.findings]
