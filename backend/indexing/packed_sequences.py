"""`_pack_padded_sequence` (`nn.utils.rnn.pack_padded_sequence`, `pack_sequence`) on the chip.

torch keeps a PackedSequence's `batch_sizes` on the host (its RNN kernels read them there), while the
packed data stays on the device. The lengths are host values, so torch's own CPU kernel, run on a
one-byte (time, batch) input, checks them and gives `batch_sizes`; the data is one gather on the chip of
the (time, batch) rows they select. The unpacking ops (`pad_packed_sequence`, packed RNNs) are
torch's composite ones and work from there.
"""

from __future__ import annotations

from typing import Any

import torch

from tputrace.backend.core import routing

aten = torch.ops.aten


def _pack_padded_sequence(args: tuple, kwargs: dict) -> tuple[Any, torch.Tensor]:
    input, lengths, batch_first = (*args, *kwargs.values())  # noqa: A001 - torch's name
    if lengths.device.type != "cpu":
        lengths = lengths.cpu()
    time_major = input.transpose(0, 1) if batch_first else input
    steps, batch = time_major.shape[0], time_major.shape[1]
    _, batch_sizes = aten._pack_padded_sequence.default(torch.zeros((steps, batch), dtype=torch.uint8), lengths, False)
    rows = torch.cat([torch.arange(size) + step * batch for step, size in enumerate(batch_sizes.tolist())])
    flat = time_major.reshape(steps * batch, *time_major.shape[2:])
    return flat.index_select(0, rows.to(input.device)), batch_sizes


def register() -> None:
    routing.register_special(aten._pack_padded_sequence.default, _pack_padded_sequence)
