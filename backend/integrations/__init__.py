"""tpu tensors inside torch's subsystems and other libraries: torch.export, TorchScript, make_fx and fake
tensors, torch.cond/while_loop, FlexAttention, DataParallel, lazy modules, checkpoints, safetensors, accelerate."""
