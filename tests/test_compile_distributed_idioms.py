"""CUDA idioms of torch.compile and torch.distributed found wrong on `tpu` by probing them against the
CPU: streams from `torch.accelerator`, and DDP options a device written in Python cannot run."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

import tputrace.backend  # noqa: F401 - registers the tpu device


def test_accelerator_stream_waits_on_tpu_events_and_streams() -> None:
    """FSDP2 waits on its all-gather event through `torch.accelerator.current_stream()`; torch's own
    stream for tpu refused a `torch.tpu.Event` ("Event device type CPU does not match")."""
    stream = torch.accelerator.current_stream()
    stream.wait_event(torch.tpu.Event())
    stream.wait_event(torch.tpu.current_stream().record_event())
    stream.wait_stream(torch.tpu.current_stream())
    torch.ones(2, device="tpu").record_stream(stream)  # DataParallel's gather: torch's C++ takes a torch.Stream
    with stream:
        assert torch.accelerator.current_stream() == stream
    torch.accelerator.set_stream(stream)
