"""CUDA compatibility: the `torch.tpu` device module, `torch.accelerator`, autocast, pinned memory, process
sharing, device registration and the other places where `tpu` behaves as CUDA does."""
