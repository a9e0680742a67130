"""Scripts that read wrong before: a seq2seq model validated every 4 steps by a greedy decode that stops on
`(token == eos).all()` (its reads said `every step` and `10 times every 7 steps`, and told to check the training loop's
stop less often); a graph network whose graphs change both their node and edge counts (told to pad in a collate_fn and
mask attention); a loss over `masked_select` (the backward's own wait told to use a fixed-shape form at
`loss.backward()`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

GREEDY_VALIDATION = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    V, H, T, BOS, EOS = 24, 32, 6, 1, 2


    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, H)
            self.cell = nn.GRUCell(H, H)
            self.out = nn.Linear(H, V)

        def encode(self, src):
            return torch.tanh(self.emb(src).mean(1))

        def forward(self, src, tgt):
            h, inp, logits = self.encode(src), torch.full((src.size(0),), BOS, device=src.device), []
            for t in range(tgt.size(1)):
                h = self.cell(self.emb(inp), h)
                logits.append(self.out(h))
                inp = tgt[:, t]  # teacher forcing
            return torch.stack(logits, 1)

        @torch.no_grad()
        def greedy(self, src):
            h, inp, outs = self.encode(src), torch.full((src.size(0),), BOS, device=src.device), []
            for t in range(T):
                h = self.cell(self.emb(inp), h)
                inp = self.out(h).argmax(-1)
                outs.append(inp)
                if (inp == EOS).all():  {marker}
                    break
            return torch.stack(outs, 1)


    model = Seq2Seq().to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(8):
        src = torch.randint(3, V, (16, T), device="tpu")
        tgt = src.flip(1)
        loss = nn.functional.cross_entropy(model(src, tgt).reshape(-1, V), tgt.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 4 == 3:
            model.eval()
            acc = (model.greedy(src) == tgt).float().mean().item()  # accuracy
            model.train()
            print(step, loss.item(), acc)  # logged
'''


def test_a_greedy_decode_every_4_steps_reads_at_its_period_and_is_told_to_decode_a_fixed_length(tmp_path: Path) -> None:
    """The validation runs after `optimizer.step()`, so its reads land in the next step, the last in the run's tail:
    the stop check reads 6 times every 4 steps (not `every step`), the check stops the decoding loop (told to keep a
    `done` mask on the chip, not to check the training loop's stop less often), and the accuracy and the logged loss
    read together every 4 steps."""
    report, script, line = _run(tmp_path, "greedy_validation", GREEDY_VALIDATION)
    assert report.step_count == 8
    (stop,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert stop.title.startswith(f"Host sync 6 times every 4 steps at {script.name}:{line} (bool)"), stop.title
    assert "stop an inner loop" in stop.explanation, stop.explanation
    assert "`done` mask" in stop.suggestion and "step % 100" not in stop.suggestion, stop.suggestion
    lines = script.read_text().splitlines()
    accuracy = next(number for number, text in enumerate(lines, 1) if "# accuracy" in text)
    logged = next(number for number, text in enumerate(lines, 1) if "# logged" in text)
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == accuracy]
    assert "1 time every 4 steps" in read.title, read.title
    assert f"reads in the same steps as {script.name}:{logged}" in read.suggestion, read.suggestion


GRAPHS_OF_CHANGING_SIZE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    def random_graph():
        n = int(torch.randint(8, 20, ()).item())
        return torch.randn(n, 16), torch.randint(0, n, (2, int(torch.randint(2 * n, 4 * n, ()).item()))), torch.randn(1)


    class GCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(16, 32)
            self.head = nn.Linear(32, 1)

        def forward(self, x, edges):
            h = torch.relu(self.l1(x))
            src, dst = edges
            agg = torch.zeros_like(h).index_add_(0, dst, h[src])
            return self.head(agg.mean(0))


    graphs = [random_graph() for _ in range(8)]
    model = GCN().to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, edges, y in graphs:
        x, edges, y = x.to("tpu"), edges.to("tpu"), y.to("tpu")  {marker}
        loss = nn.functional.mse_loss(model(x, edges), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_graphs_changing_nodes_and_edges_are_told_to_pad_the_edge_list_with_a_dummy_node(tmp_path: Path) -> None:
    """The node count enters first (the first layer's matmul), the edge count at the scatter: the storm of the copied
    graphs says they hold index lists (at the scatter's line) padded with a dummy row, and to pad the nodes too, not
    to pad in a collate_fn and mask attention."""
    report, script, line = _run(tmp_path, "graphs_changing_size", GRAPHS_OF_CHANGING_SIZE)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert f"copied to the chip at {script.name}:{line}" in storm.explanation, storm.explanation
    scatter = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "index_add_" in text)
    assert f"{script.name}:{scatter} scatters with them" in storm.suggestion, storm.suggestion
    assert "dummy row" in storm.suggestion and "nodes" in storm.suggestion, storm.suggestion
    assert "attention" not in storm.suggestion and "collate_fn" not in storm.explanation, storm.suggestion


MASKED_SELECT_LOSS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 32)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(6):
        x = torch.randn(16, 32, device="tpu")
        err = model(x) - x
        loss = err.masked_select(err.abs() > 0.05).pow(2).mean()  {marker}
        opt.zero_grad()
        loss.backward()  # backward
        opt.step()
    print(loss.item())
'''


def test_a_backwards_wait_for_a_masked_selects_gradient_points_at_the_selection(tmp_path: Path) -> None:
    """`masked_select`'s backward scatters the gradient through the same mask and waits for its count at
    `loss.backward()`: that finding says the wait is the selection's and the fix is at the selection's line."""
    report, script, line = _run(tmp_path, "masked_select_loss", MASKED_SELECT_LOSS)
    backward = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "# backward" in text)
    (wait,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == backward]
    assert f"the backward of the selection at {script.name}:{line}" in wait.explanation, wait.explanation
    assert wait.suggestion.startswith(f"Nothing at {script.name}:{backward} can change"), wait.suggestion
    assert [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]


DIFFUSION_SAMPLED_AFTER_TRAINING = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    T = 6
    betas = torch.linspace(1e-4, 0.02, T, device="tpu")
    alpha_bar = torch.cumprod(1 - betas, 0)
    model = nn.Sequential(nn.Linear(17, 64), nn.SiLU(), nn.Linear(64, 16)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(256, 16)
    for step in range(4):
        x0 = data[torch.randint(0, 256, (32,))].to("tpu")  # batch
        t = torch.randint(0, T, (32,), device="tpu")
        noise = torch.randn_like(x0)
        ab = alpha_bar[t].unsqueeze(1)
        loss = nn.functional.mse_loss(model(torch.cat([ab.sqrt() * x0 + (1 - ab).sqrt() * noise, ab], 1)), noise)
        opt.zero_grad()
        loss.backward()
        opt.step()

    with torch.no_grad():
        x = torch.randn(8, 16, device="tpu")
        for t in reversed(range(T)):
            eps = model(torch.cat([x, alpha_bar[t].expand(8, 1)], 1))  {marker}
            x = (x - betas[t] / (1 - alpha_bar[t]).sqrt() * eps) / (1 - betas[t]).sqrt()
            print(t, x.std().item())
'''


def test_a_sampling_loop_after_training_indexing_the_schedule_by_timestep_is_a_storm(tmp_path: Path) -> None:
    """`betas[t]` with a Python int `t` makes a program per timestep in the sampling loop after the training loop (each
    timestep's read ends its program):
    all its recompiles are in the run's `end` step, and they are one finding at the indexing line, costed once with no
    per-step figure (there was none: no steady step recompiled). The batch copied as rows of an in-memory host
    tensor is told to keep the tensor on the chip, not that the line's `torch.randint` draws are copied."""
    report, script, line = _run(tmp_path, "diffusion_sampling", DIFFUSION_SAMPLED_AFTER_TRAINING)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles" and finding.line == line]
    assert "after the loop as a Python int indexing a tensor changes" in storm.title, storm.title
    assert storm.cost_per_step_ns is None and "after the training loop" in storm.explanation, storm.explanation
    batch = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "# batch" in text)
    (copy,) = [finding for finding in report.findings if finding.analyzer == "transfers" and finding.line == batch]
    assert "rows picked from the host tensor `data`" in copy.suggestion, copy.suggestion
    assert "draws random numbers" not in copy.suggestion, copy.suggestion


REINFORCE_WITH_A_HOST_ENVIRONMENT = '''
    import random
    import torch
    from torch import nn

    torch.manual_seed(0)
    random.seed(0)


    class Walk:
        def reset(self):
            self.s, self.left = [0.0] * 4, random.randint(3, 16)  # the episode's length
            return self.s

        def step(self, action):
            self.s, self.left = [x + (0.1 if action == 1 else -0.1) for x in self.s], self.left - 1
            return self.s, 1.0, self.left == 0


    policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)).to("tpu")
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    env = Walk()
    for episode in range(6):
        state, log_probs, done = env.reset(), [], False
        while not done:
            obs = torch.tensor(state, device="tpu")  {marker}
            dist = torch.distributions.Categorical(logits=policy(obs), validate_args=False)
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            state, reward, done = env.step(action.item())  # environment
        loss = -torch.stack(log_probs).sum() / 12
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def test_a_policy_gradient_loops_observation_copies_are_told_to_batch_environments(tmp_path: Path) -> None:
    """Each episode steps the host environment a different number of times: the reads and copies per step say `about
    N per step` (not a period such as `146 times every 5 steps`), and the observation copied at each environment step
    is told the copy stays with the environment on the host and to vectorize it, not to build a constant once."""
    report, script, line = _run(tmp_path, "reinforce", REINFORCE_WITH_A_HOST_ENVIRONMENT)
    (copy,) = [finding for finding in report.findings if finding.analyzer == "transfers" and finding.line == line]
    environment = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "# environment" in text)
    assert f"once per environment step, as {script.name}:{environment} steps it" in copy.suggestion, copy.suggestion
    assert "constant" not in copy.suggestion, copy.suggestion
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == environment]
    assert read.title.startswith("Host sync about ") and " times per step at " in read.title, read.title
    assert copy.title.endswith(" copies per step") and "about " in copy.title, copy.title


CAUSAL_MASK_BUILT_ON_THE_HOST = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Block(nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
            self.head = nn.Linear(d, 16)

        def forward(self, x):
            mask = torch.triu(torch.ones(x.size(1), x.size(1), dtype=torch.bool), 1).to(x.device)  {marker}
            return self.head(x + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0])


    model = nn.Sequential(nn.Embedding(16, 32), Block()).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(5):
        idx = torch.randint(0, 16, (8, 12), device="tpu")
        loss = nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def test_a_causal_mask_built_on_the_host_each_forward_is_told_to_be_built_on_the_chip(tmp_path: Path) -> None:
    """`torch.triu(torch.ones(n, n))` without `device=` is built on the host and copied every forward: the copy's
    finding names `torch.ones` and tells to build it on the chip or once as a buffer, not `if it is the input batch`."""
    report, script, line = _run(tmp_path, "host_causal_mask", CAUSAL_MASK_BUILT_ON_THE_HOST)
    (copy,) = [finding for finding in report.findings if finding.analyzer == "transfers" and finding.line == line]
    assert "a constant built on the host by `torch.ones`" in copy.explanation, copy.explanation
    assert "`torch.ones(..., device=x.device)`" in copy.suggestion and "input batch" not in copy.suggestion


BUCKETED_SAMPLER_KEEPING_PARTIAL_BATCHES = '''
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset, Sampler

    torch.manual_seed(0)
    BUCKETS = (8, 16)


    class Sentences(Dataset):
        def __init__(self, n=44):
            self.lengths = torch.randint(2, 17, (n,)).tolist()

        def __len__(self):
            return len(self.lengths)

        def __getitem__(self, i):
            return torch.randint(1, 50, (self.lengths[i],))


    class BucketSampler(Sampler):
        def __init__(self, lengths, batch_size):
            self.batches = []
            for low, high in zip((0,) + BUCKETS, BUCKETS):
                rows = [i for i, n in enumerate(lengths) if low < n <= high]
                self.batches += [rows[j:j + batch_size] for j in range(0, len(rows), batch_size)]  # keeps partial ones

        def __iter__(self):
            return iter(self.batches)

        def __len__(self):
            return len(self.batches)


    def collate(items):
        n = next(b for b in BUCKETS if b >= max(len(seq) for seq in items))
        tokens = torch.zeros(len(items), n, dtype=torch.long)
        for row, seq in enumerate(items):
            tokens[row, :len(seq)] = seq
        return tokens, torch.tensor([len(seq) % 2 for seq in items])


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 32, padding_idx=0)
            self.head = nn.Linear(32, 2)

        def forward(self, tokens):
            keep = (tokens != 0).unsqueeze(-1)
            return self.head((self.emb(tokens) * keep).sum(1) / keep.sum(1))


    data = Sentences()
    loader = DataLoader(data, batch_sampler=BucketSampler(data.lengths, 8), collate_fn=collate)
    model = Model().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for tokens, labels in loader:
        tokens, labels = tokens.to("tpu"), labels.to("tpu")  {marker}
        loss = nn.functional.cross_entropy(model(tokens), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def test_partial_batches_of_a_bucketing_sampler_are_told_to_be_dropped_not_padded_in_length(tmp_path: Path) -> None:
    """Two length buckets, each ending in a smaller batch: the sizes that change are the batch's number of examples
    (dim 0 of the tokens and the labels), told to drop or pad the partial batches, not to pad each batch's longest
    sequence in a collate_fn."""
    report, script, line = _run(tmp_path, "bucketed_partial_batches", BUCKETED_SAMPLER_KEEPING_PARTIAL_BATCHES)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert f"copied to the chip at {script.name}:{line}" in storm.title, storm.title
    assert "at 8 examples: drop the partial batches (`drop_last=True`" in storm.suggestion, storm.suggestion
    assert "longest" not in storm.suggestion + storm.explanation, storm.explanation


PREDICTIONS_GATHERED_IN_AN_EVALUATION = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 5)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    val = [(torch.randn(16, 32), torch.randint(0, 5, (16,))) for _ in range(3)]
    for step in range(8):
        x, y = torch.randn(16, 32, device="tpu"), torch.randint(0, 5, (16,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 4 == 3:
            preds, labels = [], []
            with torch.no_grad():
                for vx, vy in val:
                    preds.append(model(vx.to("tpu")).argmax(-1).cpu())  {marker}
                    labels.append(vy)
            print(step, (torch.cat(preds) == torch.cat(labels)).float().mean())
'''


def test_predictions_gathered_with_cpu_in_an_evaluation_are_told_to_be_copied_once(tmp_path: Path) -> None:
    """An evaluation every 4 steps, after `optimizer.step()`, copies each batch's predictions to the host into a list:
    the reads are told to append the tensors and copy once after the evaluation (not to sum a value into a total), and
    the validation batches' copies read `3 copies every 4 steps` (not `in one step`, the last evaluation landing in the
    run's tail)."""
    report, script, line = _run(tmp_path, "gathered_predictions", PREDICTIONS_GATHERED_IN_AN_EVALUATION)
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "append the tensors themselves" in read.suggestion and "`total += loss`" not in read.suggestion, read.suggestion
    (copy,) = [finding for finding in report.findings if finding.analyzer == "transfers" and finding.line == line]
    assert copy.title.endswith("3 copies every 4 steps"), copy.title
