"""Scripts that read wrong before: a WGAN stepping its critic's optimizer five times per generator step, inline or in
helper functions (a step per critic step); a `torch.compile`d model's accuracy read once per epoch after its
evaluation (told to read less often: its forward ran in a compiled graph, not in the ops the read flushed); an Adam
made anew in each epoch, in the loop or in the function it calls (no finding); a contrastive queue extended with
`torch.cat` every step and crops resized to a size drawn per batch (told to pad batches in a collate_fn and mask
attention); a CutMix box (told to bucket a length labelled as its start); a `torch.save` checkpoint, `F.one_hot`
without `num_classes`, a stopping check and an action read for an environment (each told to accumulate a loss on the
chip); `torch.autograd.grad` breaking a compiled function's graph (told to keep values off the host)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

WGAN = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    Z = 16
    G = nn.Sequential(nn.Linear(Z, 64), nn.ReLU(), nn.Linear(64, 32)).to("tpu")
    C = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)).to("tpu")
    opt_g = torch.optim.RMSprop(G.parameters(), lr=5e-5)
    opt_c = torch.optim.RMSprop(C.parameters(), lr=5e-5)
    for it in range(4):
        for _ in range(5):
            real = torch.randn(32, 32, device="tpu")
            fake = G(torch.randn(32, Z, device="tpu")).detach()
            c_loss = C(fake).mean() - C(real).mean()
            opt_c.zero_grad()
            c_loss.backward()
            opt_c.step()
            for p in C.parameters():
                p.data.clamp_(-0.01, 0.01)
        g_loss = -C(G(torch.randn(32, Z, device="tpu"))).mean()
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
        print(it, c_loss.item(), g_loss.item())  {marker}
'''


def test_a_wgan_with_five_critic_steps_per_generator_step_is_one_step_per_iteration(tmp_path: Path) -> None:
    """The critic's optimizer steps five times in an inner loop before the generator's steps once: each iteration of
    the outer loop is one step, from the first (the generator's step is found in the loop around the critic's), and
    the two losses read each iteration are read per step, told to keep them on the chip."""
    report, script, line = _run(tmp_path, "wgan", WGAN)
    assert report.step_count == 4
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert f"Host sync 2 times per step at {script.name}:{line} (item)" in sync.title, sync.title
    assert "already reads every" not in sync.suggestion, sync.suggestion


COMPILED_EVALUATION = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train = [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(4)]
    val = [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(2)]
    for epoch in range(3):
        compiled.train()
        for x, y in train:
            x, y = x.to("tpu"), y.to("tpu")
            loss = nn.functional.cross_entropy(compiled(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        compiled.eval()
        {evaluation}:
            correct = sum((compiled(x.to("tpu")).argmax(-1) == y.to("tpu")).sum() for x, y in val)
            accuracy = correct.item() / 32  {marker}
        print(epoch, accuracy)
'''


@pytest.mark.parametrize("evaluation", ["with torch.no_grad()", "if True"])
def test_a_compiled_models_accuracy_read_once_per_epoch_is_the_evaluations_own_wait(tmp_path: Path, evaluation: str) -> None:
    """The evaluation's forward ran in a compiled graph (an inference graph under `no_grad`, else a forward graph no
    backward followed), not in the ops the read flushed: the read is still the evaluation's own wait, an info finding,
    not advice to read less often."""
    source = COMPILED_EVALUATION.replace("{evaluation}", evaluation)
    report, script, line = _run(tmp_path, "compiled_evaluation", source)
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert read.severity == "info", read.title
    assert read.suggestion.startswith(f"The read at {script.name}:{line} ends an evaluation the loop runs every 4 steps"), read.suggestion
    assert "`Sequential`" in read.suggestion and "read less often" not in read.suggestion


COMPILED_LOSS_READ_BEFORE_BACKWARD = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(8):
        x, y = torch.randn(16, 32, device="tpu"), torch.randint(0, 10, (16,), device="tpu")
        loss = nn.functional.cross_entropy(compiled(x), y)
        if step % 2 == 0:
            print(step, loss.item())  {marker}
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def test_a_compiled_models_training_loss_read_every_other_step_is_no_evaluation(tmp_path: Path) -> None:
    """The forward graph that ran before the read is the training step's (its backward follows in the step): the
    read is a logged loss, told to read less often."""
    report, script, line = _run(tmp_path, "compiled_loss_read", COMPILED_LOSS_READ_BEFORE_BACKWARD)
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "ends an evaluation" not in read.suggestion and "read less often (every 8 steps)" in read.suggestion, read.suggestion


OPTIMIZER_IN_THE_EPOCH_LOOP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    data = [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(3)]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        {construction}  {marker}
        for x, y in data:
            x, y = x.to("tpu"), y.to("tpu")
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(epoch, loss.item())
'''


def test_an_optimizer_made_in_the_epoch_loop_is_a_warning_at_its_constructor(tmp_path: Path) -> None:
    """A new Adam each epoch restarts its moments and makes its state again: a warning at the constructor's line that
    names the loop and the step, and tells to make it once before the loop and change the learning rate in place."""
    source = OPTIMIZER_IN_THE_EPOCH_LOOP.replace("{construction}", "opt = torch.optim.Adam(model.parameters(), lr=1e-3 * 0.5 ** epoch)")
    report, script, line = _run(tmp_path, "optimizer_in_loop", source)
    (remade,) = [finding for finding in report.findings if finding.analyzer == "remade_optimizers"]
    assert (remade.file, remade.line, remade.severity) == (str(script), line, "warning"), remade.title
    assert remade.title == (f"Optimizer made inside the loop at {script.name}:{line}: a new `Adam` each iteration of the "
                            f"loop at {script.name}:{line - 1}")
    assert f"around its `step()` at {script.name}:{line + 6}" in remade.explanation, remade.explanation
    assert "starts again from zero" in remade.explanation and "in steps 0, 3, 6" in remade.explanation, remade.explanation
    assert remade.suggestion.startswith(f"Make the optimizer once, before the loop at {script.name}:{line - 1}"), remade.suggestion
    assert "param_groups" in remade.suggestion


def test_an_optimizer_switched_once_under_an_if_is_no_remade_optimizer(tmp_path: Path) -> None:
    """A second phase that switches to SGD once, on purpose, makes the state twice: no finding."""
    source = OPTIMIZER_IN_THE_EPOCH_LOOP.replace(
        "{construction}", "if epoch == 2:\n            opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)")
    report, _, _ = _run(tmp_path, "optimizer_switched", source)
    assert not [finding for finding in report.findings if finding.analyzer == "remade_optimizers"]


KEY_QUEUE = '''
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)).to("tpu")
    opt = torch.optim.SGD(encoder.parameters(), lr=0.05, momentum=0.9)
    queue = torch.empty(0, 16, device="tpu")
    for step in range(6):
        x = torch.randn(16, 32, device="tpu")
        q = F.normalize(encoder(x + 0.1 * torch.randn_like(x)), dim=1)
        k = F.normalize(encoder(x), dim=1).detach()
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], 1) / 0.07
        loss = F.cross_entropy(logits, torch.zeros(16, dtype=torch.long, device="tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        queue = torch.cat([queue, k])[-64:]  {marker}
    print(loss.item())
'''


def test_a_contrastive_queue_grown_by_cat_each_step_is_told_to_be_allocated_once(tmp_path: Path) -> None:
    """A queue of keys extended with `torch.cat` once a step grows by the batch at each compile: the storm is at the
    cat and tells a fixed-size queue written at a moving position, not padding batches in a collate_fn."""
    report, script, line = _run(tmp_path, "key_queue", KEY_QUEUE)
    (storm,) = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert "grows by 16 at each compile" in storm.title, storm.title
    assert "`queue[ptr:ptr + n] = keys`" in storm.suggestion and "collate_fn" not in storm.suggestion, storm.suggestion


RANDOM_SIZED_CROPS = '''
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 4, 4), nn.GELU(), nn.Flatten(2)).to("tpu")
    head = nn.Linear(16, 10).to("tpu")
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-3)
    images, labels = torch.randn(32, 3, 40, 40), torch.randint(0, 10, (32,))
    for step, size in enumerate([16, 24, 32, 24, 16]):
        idx = torch.randint(0, 32, (8,))
        crops = F.interpolate(images[idx], size=(size, size), mode="bilinear")  {marker}
        x, y = crops.to("tpu"), labels[idx].to("tpu")
        loss = F.cross_entropy(head(model(x).mean(-1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_crops_resized_to_a_size_chosen_per_batch_are_told_to_keep_one_image_size(tmp_path: Path) -> None:
    """The batch's height and width change with the resize at the marked line (found as the copied batch's origin):
    the storm is at that line and tells one image size (`RandomResizedCrop(size)`), not padding masked in attention."""
    report, script, line = _run(tmp_path, "resized_crops", RANDOM_SIZED_CROPS)
    (storm,) = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert f"the batches made at {script.name}:{line} change shape" in storm.title, storm.title
    assert "one image size" in storm.suggestion and "`RandomResizedCrop(size)`" in storm.suggestion, storm.suggestion
    assert "attention" not in storm.suggestion


CUTMIX_BOX = '''
    import random
    import torch
    from torch import nn

    torch.manual_seed(0)
    random.seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(8, 3, 16, 16, device="tpu")
        y = torch.randint(0, 10, (8,), device="tpu")
        cut = random.randint(2, 8)
        top, left = random.randint(0, 16 - cut), random.randint(0, 16 - cut)
        perm = torch.randperm(8, device="tpu")
        x[:, :, top:top + cut, left:left + cut] = x[perm, :, top:top + cut, left:left + cut]  {marker}
        lam = 1 - cut * cut / 256
        logits = model(x)
        loss = lam * nn.functional.cross_entropy(logits, y) + (1 - lam) * nn.functional.cross_entropy(logits, y[perm])
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_cutmix_box_at_a_random_place_and_size_is_told_to_blend_with_a_mask(tmp_path: Path) -> None:
    """The box's slices change start and length each step: the storm at the slicing line tells a mask built on the
    chip from the box's bounds and `torch.where`, not bucketing a length."""
    report, script, line = _run(tmp_path, "cutmix", CUTMIX_BOX)
    (storm,) = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert "changes start and length" in storm.title, storm.title
    assert "`torch.where(inside, other, x)`" in storm.suggestion and "bucket" not in storm.suggestion, storm.suggestion


READS_THEIR_LINES_EXPLAIN = '''
    import os
    import tempfile
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    out = tempfile.mkdtemp()
    for step in range(6):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randint(0, 10, (16,), device="tpu")
        target = F.one_hot(y).float()  {marker}
        loss = F.binary_cross_entropy_with_logits(model(x)[:, :target.shape[1]], target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 2 == 1:
            torch.save({{"model": model.state_dict(), "opt": opt.state_dict()}}, os.path.join(out, "ckpt.pt"))
        if loss.item() < 1e-4:
            break
    print(step)
'''


def test_reads_whose_lines_say_what_they_are_get_their_own_fixes(tmp_path: Path) -> None:
    """`F.one_hot(y)` reads the largest label (pass `num_classes`), `torch.save` copies the checkpoint (save rarely),
    and `if loss.item() < tol: break` is a stopping check (check every N steps): none is told to accumulate a loss."""
    report, script, line = _run(tmp_path, "line_reads", READS_THEIR_LINES_EXPLAIN)
    reads = {finding.line: finding for finding in report.findings if finding.analyzer == "syncs"}
    assert {line, line + 6, line + 7} <= set(reads), [finding.title for finding in report.findings]
    assert reads[line].suggestion.startswith("Pass the number of classes, `F.one_hot(labels, num_classes=C)`"), reads[line].suggestion
    assert reads[line + 6].suggestion.startswith("Saving is the checkpoint's own cost"), reads[line + 6].suggestion
    assert reads[line + 7].suggestion.startswith("Check the condition every N steps"), reads[line + 7].suggestion
    assert all("loss.detach()" not in read.suggestion for read in reads.values())


ACTOR_CRITIC = '''
    import random
    import torch
    from torch import nn

    torch.manual_seed(0)
    random.seed(0)


    class Env:
        def reset(self):
            self.t = 0
            return [random.random() for _ in range(4)]

        def step(self, action):
            self.t += 1
            return [random.random() for _ in range(4)], float(action == 1), self.t >= 5


    policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)).to("tpu")
    value = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1)).to("tpu")
    opt = torch.optim.Adam([*policy.parameters(), *value.parameters()], lr=1e-3)
    env = Env()
    obs = env.reset()
    for step in range(6):
        state = torch.tensor(obs, device="tpu")
        dist = torch.distributions.Categorical(logits=policy(state), validate_args=False)
        action = dist.sample()
        next_obs, reward, done = env.step(action.item())  {marker}
        advantage = reward - value(state).squeeze()
        loss = -dist.log_prob(action) * advantage.detach() + advantage.pow(2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        obs = env.reset() if done else next_obs
'''


def test_an_action_read_for_an_environment_on_the_host_is_told_it_stays(tmp_path: Path) -> None:
    """`env.step(action.item())` needs the action each step: the read's fix is to make it the step's only wait or act
    in many environments per read, not to accumulate the action on the chip."""
    report, script, line = _run(tmp_path, "actor_critic", ACTOR_CRITIC)
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "The read is the action an environment on the host needs for its next step." in read.explanation, read.explanation
    assert read.suggestion.startswith("The environment steps on the host and needs each action"), read.suggestion
    assert "detach()" not in read.suggestion


OPTIMIZER_MADE_PER_CALL = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    data = [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(3)]


    def train_epoch(model, lr):
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)  {marker}
        for x, y in data:
            x, y = x.to("tpu"), y.to("tpu")
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return loss


    for epoch in range(3):
        print(epoch, train_epoch(model, 1e-3).item())
'''


def test_an_optimizer_made_in_the_function_run_each_epoch_is_a_warning_at_its_constructor(tmp_path: Path) -> None:
    """`train_epoch` makes its AdamW before its batch loop and runs once per epoch: the state made again in each call
    marks it, and the fix is to make it once before the loop that calls the function."""
    report, script, line = _run(tmp_path, "optimizer_per_call", OPTIMIZER_MADE_PER_CALL)
    (remade,) = [finding for finding in report.findings if finding.analyzer == "remade_optimizers"]
    assert (remade.file, remade.line) == (str(script), line), remade.title
    assert remade.title == f"Optimizer made inside `train_epoch` at {script.name}:{line}: a new `AdamW` each call"
    assert remade.suggestion.startswith("Make the optimizer once, before the loop that calls `train_epoch`, and pass it in")


WGAN_WITH_HELPERS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16)).to("tpu")
    C = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1)).to("tpu")
    opt_g = torch.optim.RMSprop(G.parameters(), lr=5e-5)
    opt_c = torch.optim.RMSprop(C.parameters(), lr=5e-5)


    def critic_step(critic, optimizer):
        fake = G(torch.randn(16, 8, device="tpu")).detach()
        loss = critic(fake).mean() - critic(torch.randn(16, 16, device="tpu")).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss


    def generator_step(generator, optimizer):
        loss = -C(generator(torch.randn(16, 8, device="tpu"))).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss


    for it in range(4):
        for _ in range(3):
            c_loss = critic_step(C, opt_c)
        g_loss = generator_step(G, opt_g)  {marker}
    print(c_loss.item(), g_loss.item())
'''


def test_a_wgan_stepping_in_helper_functions_is_one_step_per_iteration(tmp_path: Path) -> None:
    """The critic's and the generator's steps are made in helpers: the generator's optimizer is given to a call in
    the loop around the critic's helper call, so the critic's repeated steps are the iteration's inner loop."""
    report, _, _ = _run(tmp_path, "wgan_helpers", WGAN_WITH_HELPERS)
    assert report.step_count == 4


COMPILED_AUTOGRAD_GRAD = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")


    @torch.compile(backend="tpu")
    def sgd_step(x, y, lr):
        loss = nn.functional.mse_loss(model(x), y)
        grads = torch.autograd.grad(loss, list(model.parameters()))  {marker}
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p.sub_(lr * g)
        return loss


    for step in range(3):
        loss = sgd_step(torch.randn(16, 32, device="tpu"), torch.randn(16, 1, device="tpu"), 0.1)
    print(loss.item())
'''


def test_a_graph_break_with_dynamos_hint_and_no_read_is_told_the_hint(tmp_path: Path) -> None:
    """`torch.autograd.grad` in a compiled function breaks the graph with nothing read on the host: the fix is
    Dynamo's own hint, not advice to keep values off the host."""
    report, script, line = _run(tmp_path, "compiled_grad", COMPILED_AUTOGRAD_GRAD)
    (broke,) = [finding for finding in report.findings if finding.analyzer == "graph_breaks"]
    assert (broke.file, broke.line) == (str(script), line), broke.title
    assert broke.suggestion.startswith("Dynamo says how: Change `torch._dynamo.config.trace_autograd_ops` to `True`"), broke.suggestion
    assert "needs a value" not in broke.suggestion


WGAN_GENERATOR_FIRST = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16)).to("tpu")
    C = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1)).to("tpu")
    opt_g = torch.optim.RMSprop(G.parameters(), lr=5e-5)
    opt_c = torch.optim.RMSprop(C.parameters(), lr=5e-5)
    for it in range(4):
        g_loss = -C(G(torch.randn(16, 8, device="tpu"))).mean()
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()  {marker}
        for _ in range(3):
            fake = G(torch.randn(16, 8, device="tpu")).detach()
            c_loss = C(fake).mean() - C(torch.randn(16, 16, device="tpu")).mean()
            opt_c.zero_grad()
            c_loss.backward()
            opt_c.step()
    print(c_loss.item(), g_loss.item())
'''


def test_a_wgan_stepping_its_generator_before_the_critics_inner_loop_is_one_step_per_iteration(tmp_path: Path) -> None:
    """The generator's step comes first and the critic's optimizer is stepped in a loop nested in the generator's:
    each generator step ends a step (the last iteration's critic steps fall in the run's end)."""
    report, _, _ = _run(tmp_path, "wgan_generator_first", WGAN_GENERATOR_FIRST)
    assert report.step_count == 4
