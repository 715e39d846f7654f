"""Next-token cross-entropy fused with the LM head, in chunks of rows. For L = (1/N) sum_i (lse_i - z_i[t_i]),
z = h W^T,

    dL/dz = (softmax(z) - onehot(t)) / N,   dL/dh = dL/dz W,   dL/dW = dL/dz^T h,

so each chunk forms its logits, loss and both gradients in forward (memory O(chunk V), not O(N V)), and
backward only scales them. Same numbers as ``F.cross_entropy(h @ W.T .float(), t)`` up to summation order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.model import is_sharded

CHUNK_ELEMENTS = {"cpu": 2**21, "cuda": 2**25}  # logits per chunk: ~8 MB on a CPU (cache), ~128 MB on a GPU


def chunk_rows(n_rows: int, vocab: int, device: torch.device) -> int:
    return max(1, min(n_rows, CHUNK_ELEMENTS.get(device.type, 2**21) // vocab))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, rows: int):
        ctx.dtypes, device = (hidden.dtype, weight.dtype), hidden.device.type
        # under autocast (bf16-mixed) every product runs in the autocast dtype, as the plain head
        # would; explicit casts, since in-place and out= matmuls are not autocast
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        with torch.autocast(device, enabled=False):
            grad_h, grad_w, total = _chunks(
                hidden.to(dtype), weight.to(dtype), targets, rows, ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            )
        ctx.save_for_backward(grad_h, grad_w)
        ctx.n = hidden.shape[0]
        return total / ctx.n

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        factor = grad_out / ctx.n
        grads = [None if g is None else (g * factor).to(dtype) for g, dtype in zip(ctx.saved_tensors, ctx.dtypes)]
        return *grads, None, None


def _chunks(hidden: Tensor, weight: Tensor, targets: Tensor, rows: int, want_h: bool, want_w: bool):
    """Summed loss and the gradients of N x the mean loss, chunk by chunk of rows."""
    acc = torch.promote_types(hidden.dtype, torch.float32)
    grad_h = torch.empty_like(hidden) if want_h else None
    grad_w = torch.zeros_like(weight, dtype=acc) if want_w else None
    total = hidden.new_zeros((), dtype=acc)
    for lo in range(0, hidden.shape[0], rows):
        h, t = hidden[lo : lo + rows], targets[lo : lo + rows, None]
        logp = torch.log_softmax((h @ weight.T).to(acc), dim=-1)
        total -= logp.gather(1, t).sum()
        if not (want_h or want_w):
            continue
        grad_z = logp.exp_().scatter_add_(1, t, logp.new_full(t.shape, -1.0)).to(weight.dtype)  # N dL/dz
        if want_h:
            torch.mm(grad_z, weight, out=grad_h[lo : lo + rows])
        if want_w and grad_w.dtype == h.dtype:
            grad_w.addmm_(grad_z.T, h)
        elif want_w:  # bf16 products, summed over chunks in fp32
            grad_w += grad_z.T @ h
    return grad_h, grad_w, total


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, rows: int | None = None) -> Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` [N, V] against ``targets`` [N]; hidden
    [N, d], weight [V, d] (the LM head's, no bias). rows: rows per chunk (default from the
    vocabulary size and the device)."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1] or weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"linear_cross_entropy: hidden [N, d], weight [V, d], targets [N]; got "
            f"{tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}"
        )
    rows = rows or chunk_rows(hidden.shape[0], weight.shape[0], hidden.device)
    return _LinearCrossEntropy.apply(hidden, weight, targets, rows)


def next_token_loss(model, tokens: Tensor, start: int = 0) -> Tensor:
    """Mean next-token loss of ``model`` (a SinkLab Transformer) on ``tokens`` [B, T]: logit i
    predicts token i+1, counting from logit ``start`` (the prefix-LM loss). Fused with the head
    unless its weight is sharded (ZeRO-3, FSDP2): the fused loss reads the whole matrix."""
    targets = tokens[:, start + 1 :].reshape(-1)
    head = model.lm_head.weight
    if is_sharded(head):
        logits = model(tokens).logits[:, start:-1]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets)
    hidden = model(tokens, skip_head=True).final_hidden[:, start:-1]
    return linear_cross_entropy(hidden.reshape(-1, hidden.size(-1)), head, targets)
