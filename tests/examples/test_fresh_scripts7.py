"""Scripts that failed or read wrong before: a recommender whose `nn.Embedding(sparse=True)` trains with
`SparseAdam` (it raised: the tpu device holds the sparse gradient dense, which SparseAdam refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

SPARSE_EMBEDDING = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    V, D = 1000, 32


    class Recommender(nn.Module):
        def __init__(self):
            super().__init__()
            self.items = nn.Embedding(V, D, sparse=True)
            self.head = nn.Linear(D, 1)

        def forward(self, ids):
            return self.head(self.items(ids).mean(1)).squeeze(-1)  {marker}


    model = Recommender().to("tpu")
    sparse_opt = torch.optim.SparseAdam(list(model.items.parameters()), lr=1e-2)
    dense_opt = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    for step in range(4):
        ids = torch.randint(0, V, (16, 8), device="tpu")
        y = torch.randn(16, device="tpu")
        loss = nn.functional.mse_loss(model(ids), y)
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
    print(loss.item())
'''


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_a_sparse_embedding_trained_with_sparse_adam_runs_and_is_told_to_be_dense(tmp_path: Path, mode: str) -> None:
    """The run trains (SparseAdam updates the looked-up rows of the dense gradient), and one info finding at the
    embedding's lookup names the table and tells a TPU port to use `sparse=False` with a dense optimizer."""
    report, script, line = _run(tmp_path, f"sparse_embedding_{mode}", SPARSE_EMBEDDING, ("--mode", mode))
    (sparse,) = [finding for finding in report.findings if "sparse=True" in finding.title]
    assert (sparse.file, sparse.line, sparse.module) == (str(script), line, "Recommender.items"), sparse.title
    assert "f32[1000,32]" in sparse.title and sparse.severity == "info"
    assert "`sparse=False`" in sparse.suggestion and "`SparseAdam`" in sparse.suggestion
