"""Reads of a data-dependent output without a program per length.

`nonzero`, `x[mask]`, `unique` and the like run a program compiled for a padded length (see
`length_buckets`) and return the first `length` entries of its output: a narrow view (`layout.cut`).
Read on the chip, that view is a slice program compiled for each distinct length, which is what
bucketing avoids. Read on the host (`.cpu()`, `.tolist()`, `.item()`, `print`), it needs no program:
the padded buffer is copied (at most a quarter more bytes, see `length_buckets`) and cut on the host.

An op on the chip whose inputs include cuts runs on their padded buffers where it can
(`routes.on_padded`). A view that reshapes or transposes a cut (`x[mask].reshape(-1, C)`, a linear
layer on a 3-D cut, an `unsqueeze`, `x[mask].T`, the operands an einsum permutes and reshapes, an
`expand` along other dims) is read as a cut of the buffer viewed alike (`layout.cut_layout`: merging
the cut dim with the T entries after it gives a padded length of T times the cut's). Each module here
is one family:
- `pointwise`: `x[mask] * 2`, `torch.where(x[mask] > 0, ...)`, a cut's `unsqueeze` read as the
  padded buffer's (`weights.unsqueeze(-1) * rows`): each entry depends only on the entries at its
  position, so the first `length` are the op's on the cut; the result is cut in turn.
- `reductions`: a sum, `amax`, `amin`, vector norm (`x[mask].norm()`, `F.normalize(x[mask], dim=-1)`)
  or `logsumexp` reduces the padded buffer, its padding first set to the reduction's identity (0;
  +inf for a norm of negative order; -inf for `logsumexp`); a mean divides the zero-padded sum by
  the count.
- `rows`: a softmax along another dim, a cumulative sum, `flip`, `zeros_like` and `new_zeros`
  compute row by row (or prefix by prefix) or read only the dtype; a softmax along the cut dim
  leaves the padding out of the normalisation; `_unsafe_view` (a bias-free linear layer's output
  on a 3-D cut) reshapes the padded counterpart.
- `losses`: `nll_loss` (with `label_smoothing`, `nll_loss2d`), `mse_loss` and the losses computed
  entry by entry (`binary_cross_entropy_with_logits`, `smooth_l1_loss`, `huber_loss`) and their
  backward leave the padded rows out.
- `matmul`: `mm`, `addmm`, `bmm` and `mv` with the cut along the rows (a linear layer on `x[mask]`,
  `torch.mv(x[mask], v)`), the columns (`W @ x[mask].T`, an einsum `"oh,nh->on"`) or a `bmm`'s batch;
  along the summed dim (a weight's gradient), a sum over the real entries only.
- `norms`: `native_layer_norm` over dims after the cut's, row by row, and its backward, whose
  weight and bias gradients sum over the real rows only.
- `index_put`: the gradient of `x[mask]` scatters its padded rows through the mask (the k-th set
  element takes the k-th row, so rows past the count are never read); that of `x[:, mask]` (a cut
  along dim 1) scatters along the mask's dim, the slots past the count dropped.
- `backward_views`: the `expand` of a gradient to the cut's length is broadcast to the padded
  length, and its `squeeze` copies the padded buffer.
- `in_place`: `masked_fill_` (through a mask cut alike or broadcast along the cut dim) and in-place
  pointwise ops (`sel.mul_(2)`, `sel.clamp_(-1, 1)`) of a cut write its buffer before the length only.
Each program that must leave the padding out takes the length as a traced number (`steps`), so it
is compiled per padded length. Other ops that read the view (a reshape that merges the cut dim with
a dim before it) need the exact shape, and compile for it as the op itself does.
"""
