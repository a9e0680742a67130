"""Sequence lengths held on the host, as CUDA scripts pass them: `pack_padded_sequence` keeps
`batch_sizes` on the host as torch requires and the data on the chip (packed LSTM/GRU forward and
backward and `pad_packed_sequence` match the CPU), and `ctc_loss` takes host lengths."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pack_sequence, pad_packed_sequence

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

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


def _ctc(device: str, lengths_on_chip: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    logits = torch.randn(12, 3, 6).to(device).requires_grad_()
    targets = torch.randint(1, 6, (3, 5)).to(device)
    input_lengths, target_lengths = torch.tensor([12, 10, 8]), torch.tensor([5, 3, 4])
    if lengths_on_chip:
        input_lengths, target_lengths = input_lengths.to(device), target_lengths.to(device)
    results = []
    for reduction in ("mean", "sum", "none"):
        loss = torch.nn.functional.ctc_loss(logits.log_softmax(2), targets, input_lengths, target_lengths, reduction=reduction, zero_infinity=True)
        (gradient,) = torch.autograd.grad(loss.sum(), logits)
        results += [loss.detach(), gradient]
    return results


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("lengths_on_chip", [False, True], ids=["host_lengths", "chip_lengths"])
def test_ctc_loss_matches_cpu(mode: EagerMode, lengths_on_chip: bool) -> None:
    expected = _ctc("cpu", False)
    with eager(mode):
        result = _ctc("tpu", lengths_on_chip)
    for got, want in zip(result, expected):
        assert torch.allclose(host(got), want, atol=1e-5), (host(got) - want).abs().max()
