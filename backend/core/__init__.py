"""The core of the `tpu` device: the dispatcher and its jobs, tensors and buffers, plans and executors,
dtypes, views, chips, memory and random state."""
