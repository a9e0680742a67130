"""Memory that grows step by step because a training loop keeps a value every step, on real runs: an evaluation
without `torch.no_grad()` whose loss is appended to a list (its graph keeps the evaluation's activations), and a
dict of detached features keyed by step. The growth finding is at the statement that keeps the value, with the
line that made it as evidence."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_problems import record

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

EVALUATION_WITH_GRAPH = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 1024), nn.GELU(), nn.Linear(1024, 128)).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x_val = torch.randn(256, 128, device="tpu")
val_losses = []
for step in range(10):
    x = torch.randn(256, 128, device="tpu")
    loss = (model(x) - x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    val_loss = (model(x_val) - x_val).pow(2).mean()
    val_losses.append(val_loss)
print(torch.stack(val_losses).mean().item())
"""

FEATURE_CACHE = """import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(64, 512), nn.Tanh(), nn.Linear(512, 512)).to("tpu")
head = nn.Linear(512, 10).to("tpu")
optimizer = torch.optim.Adam(list(encoder.parameters()) + list(head.parameters()), lr=1e-3)
feature_cache = {}
for step in range(10):
    x = torch.randn(128, 64, device="tpu")
    target = torch.randint(0, 10, (128,), device="tpu")
    features = encoder(x)
    feature_cache[step] = features.detach()
    loss = nn.functional.cross_entropy(head(features), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(len(feature_cache), loss.item())
"""


def _growth(tmp_path: Path, name: str, body: str):
    script = tmp_path / f"{name}.py"
    script.write_text(body)
    report = record(script, tmp_path / f"{name}.tptrace", [])
    (growth,) = [finding for finding in report.findings if finding.analyzer == "memory" and "grows" in finding.title]
    return growth


def test_an_evaluation_loss_kept_with_its_graph_is_growth_at_the_append(tmp_path: Path) -> None:
    growth = _growth(tmp_path, "evaluates", EVALUATION_WITH_GRAPH)
    assert growth.title.endswith(": the value made at evaluates.py:15 is kept at evaluates.py:16 every step"), growth.title
    assert growth.line == 16 and growth.file is not None and growth.file.endswith("evaluates.py")
    assert "keeps its graph's activations alive" in growth.explanation
    assert "torch.no_grad()" in growth.suggestion
    assert growth.evidence[0].text == "`val_losses.append(val_loss)` keeps the value made at evaluates.py:15"


def test_detached_features_cached_by_step_are_growth_at_the_cache(tmp_path: Path) -> None:
    growth = _growth(tmp_path, "caches", FEATURE_CACHE)
    assert "256 KiB every step" in growth.title
    assert growth.title.endswith(": the value made at caches.py:12 is kept at caches.py:13 every step"), growth.title
    assert growth.line == 13
    assert "graph" not in growth.explanation  # detached: the buffer, not a graph
