"""Single-chip training scripts of kinds that read wrong before: LoRA adapters on a frozen base whose token count
equals a frozen layer's output width, whose input gradients through the frozen weights have a frozen weight's shape."""

from __future__ import annotations

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

LORA = '''
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)


    class LoRALinear(nn.Module):
        def __init__(self, base, r=8):
            super().__init__()
            self.base = base
            self.base.requires_grad_({base_trains})
            self.A = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
            self.B = nn.Parameter(torch.zeros(base.out_features, r))

        def forward(self, x):
            return self.base(x) + x @ self.A.t() @ self.B.t() * 2.0  {marker}


    class Block(nn.Module):
        def __init__(self, d=64):
            super().__init__()
            self.fc1 = LoRALinear(nn.Linear(d, 4 * d))
            self.fc2 = LoRALinear(nn.Linear(4 * d, d))

        def forward(self, x):
            return x + self.fc2(F.gelu(self.fc1(x)))


    blocks = nn.ModuleList([Block() for _ in range(2)]).to("tpu")
    head = nn.Linear(64, 10).to("tpu").requires_grad_(False)
    opt = torch.optim.AdamW([p for name, p in blocks.named_parameters() if name.endswith(("A", "B"))], lr=1e-3)
    for step in range(4):
        x = torch.randn(4, 64, 64, device="tpu")  # 256 tokens: as many as fc1's outputs
        y = torch.randint(0, 10, (4, 64), device="tpu")
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False)
        loss = F.cross_entropy(head(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_lora_input_gradients_through_a_frozen_base_are_no_weight_gradients(tmp_path) -> None:
    """The base frozen with requires_grad_(False): the backward's products through its weights (and the frozen head's)
    are input gradients the adapters before them need, though 256 tokens make some of a base weight's shape: no
    finding. The base left trainable but out of the optimizer: its weight gradients are the finding, at the forward."""
    frozen, _, _ = _run(tmp_path, "lora_frozen", LORA.replace("{base_trains}", "False"))
    assert not [finding for finding in frozen.findings if finding.analyzer == "frozen_backward"], [
        finding.title for finding in frozen.findings]
    unstepped, script, line = _run(tmp_path, "lora_unstepped", LORA.replace("{base_trains}", "True"))
    (finding,) = [finding for finding in unstepped.findings if finding.analyzer == "frozen_backward"]
    assert (finding.file, finding.line) == (str(script), line), finding.title
    assert ".fc1.base" in finding.explanation and ".fc2.base" in finding.explanation, finding.explanation
