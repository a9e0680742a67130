"""Packed sequences on tpu: `pack_padded_sequence` keeps `batch_sizes` on the host as torch requires and
the data on the chip; packed LSTM/GRU forward and backward and `pad_packed_sequence` match the CPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence

from backend_helpers import eager, host
from tputrace.backend.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _run(device: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(5, 7, num_layers=2, batch_first=True, bidirectional=True).to(device)
    gru = torch.nn.GRU(5, 3).to(device)
    inputs = torch.randn(3, 6, 5).to(device).requires_grad_()
    packed = pack_padded_sequence(inputs, torch.tensor([4, 6, 2]), batch_first=True, enforce_sorted=False)
    assert packed.batch_sizes.device.type == "cpu" and packed.data.device.type == device
    output, (hidden, _) = lstm(packed)
    padded, lengths = pad_packed_sequence(output, batch_first=True, total_length=6)
    sequences = pack_sequence([torch.randn(4, 5).to(device), torch.randn(2, 5).to(device)])
    gru_output, gru_hidden = gru(sequences)
    (padded.pow(2).sum() + hidden.sum() + gru_output.data.sum() + gru_hidden.sum()).backward()
    return [padded, lengths, hidden, inputs.grad, gru_output.data, next(lstm.parameters()).grad]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_packed_rnns_match_cpu(mode: EagerMode) -> None:
    expected = _run("cpu")
    with eager(mode):
        result = _run("tpu")
    assert result[1].device.type == "cpu" and result[1].tolist() == [4, 6, 2]
    for got, want in zip(result, expected):
        got = host(got) if got.device.type == "tpu" else got
        assert got.shape == want.shape and torch.allclose(got.float(), want.float(), atol=1e-5), (got - want).abs().max()


def test_unsorted_lengths_keep_torchs_error() -> None:
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        pack_padded_sequence(torch.randn(3, 4, 2, device="tpu"), torch.tensor([2, 4, 1]), batch_first=True)
