"""CUDA idioms of torch.compile and torch.distributed found wrong on `tpu` by probing them against the
CPU: streams from `torch.accelerator`, and DDP options a device written in Python cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.distributed.process_group import TpuProcessGroup


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


@pytest.mark.parametrize("option", ["find_unused_parameters", "static_graph"])
def test_ddp_refuses_options_that_need_pinned_memory_in_one_line(tmp_path: Path, option: str) -> None:
    """Without the check, DDP was built and its first backward raised torch's NotImplementedError about
    `PrivateUse1HooksInterface.getPinnedMemoryAllocator`."""
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("tpu", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match=rf"^DistributedDataParallel\({option}=True\) is not supported on tpu: .* 0\.0 \* parameter\.sum\(\)"):
            DistributedDataParallel(torch.nn.Linear(2, 2).to("tpu"), **{option: True})
        model = DistributedDataParallel(torch.nn.Linear(2, 2).to("tpu"), find_unused_parameters=False)
        model(torch.ones(1, 2, device="tpu")).sum().backward()
        DistributedDataParallel(torch.nn.Linear(2, 2), find_unused_parameters=True)
    finally:
        group = dist.group.WORLD
        completion_thread = group._completion._thread
        dist.destroy_process_group()
    # The group's shutdown stopped (and joined) its completion thread; the DDP model still holds the
    # group and destroys it later with the GIL held, which gloo's threads never need (see handoff).
    assert isinstance(group, TpuProcessGroup) and group._completion._thread is None
    assert completion_thread is not None and not completion_thread.is_alive()
