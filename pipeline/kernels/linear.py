"""Causal linear attention in chunked prefix-sum form, O(T c d_h + T d_h^2), no T x T matrix.

For a feature map phi already applied (``q``, ``k`` = phi(q), phi(k)) and sim_ij = q_i k_j^T *
scale on admitted pairs:

    u_i = sum_{j admitted} sim_ij v_j,   S_i = sum_{j admitted} sim_ij,   y_i = u_i / Z(S_i)

The sequence is cut into chunks of c slots. Inside a chunk the (c x c) product is masked
causally; across chunks the running state sum_j k_j^T v_j (d_h x d_h) and sum_j k_j carry the
earlier keys. Bias slots (always admitted) seed the state. A prefix mask (queries i < P also
see keys j < P) replaces the first P rows by q_i against the whole prefix's state. Plain autograd:
memory is O(T d_h + (T / c) d_h^2) per (batch, head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .tiled import Normalizer


def _normalise(u: Tensor, row_sum: Tensor, normalizer: Normalizer) -> Tensor:
    if normalizer == "none":
        return u
    if normalizer == "abs_clamp":
        return u / row_sum.abs().clamp(min=1.0)[..., None]
    return u / row_sum[..., None]


def chunked_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    normalizer: Normalizer = "sum",
    scale: float = 1.0,
    prefix: int = 0,
    slot_k: Tensor | None = None,
    slot_v: Tensor | None = None,
    chunk: int = 64,
) -> Tensor:
    """[B, H, T, d_v] for queries and keys of the same T slots (training; no cache offset)."""
    B, H, T, dh = q.shape
    if k.shape[2] != T:
        raise ValueError(f"chunked_linear_attention: needs as many keys as queries, got {k.shape[2]} and {T}")
    dtype, acc = q.dtype, torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(acc) * scale, k.to(acc), v.to(acc)
    n = -(-T // chunk)
    pad = n * chunk - T
    qc, kc, vc = (F.pad(x, (0, 0, 0, pad)).view(B, H, n, chunk, x.shape[-1]) for x in (q, k, v))

    # state before each chunk: exclusive prefix sums of k^T v and of k (plus the bias slots)
    kv = kc.transpose(-2, -1) @ vc  # [B, H, n, dh, dv]
    ksum = kc.sum(3)  # [B, H, n, dh]
    kv_before = kv.cumsum(2) - kv
    k_before = ksum.cumsum(2) - ksum
    if slot_k is not None:
        kv_before = kv_before + (slot_k.to(acc).transpose(-2, -1) @ slot_v.to(acc))[:, :, None]
        k_before = k_before + slot_k.to(acc).sum(2)[:, :, None]

    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    intra = (qc @ kc.transpose(-2, -1)).masked_fill(~causal, 0.0)  # [B, H, n, c, c]
    u = qc @ kv_before + intra @ vc
    row_sum = (qc @ k_before[..., None]).squeeze(-1) + intra.sum(-1)
    u, row_sum = u.reshape(B, H, n * chunk, -1)[:, :, :T], row_sum.reshape(B, H, n * chunk)[:, :, :T]

    if prefix > 1:  # queries inside the prefix see every prefix key (and the bias slots)
        P = min(prefix, T)
        kv_prefix = k[:, :, :P].transpose(-2, -1) @ v[:, :, :P]
        k_prefix = k[:, :, :P].sum(2)
        if slot_k is not None:
            kv_prefix = kv_prefix + slot_k.to(acc).transpose(-2, -1) @ slot_v.to(acc)
            k_prefix = k_prefix + slot_k.to(acc).sum(2)
        u = torch.cat((q[:, :, :P] @ kv_prefix, u[:, :, P:]), dim=2)
        row_sum = torch.cat(((q[:, :, :P] @ k_prefix[..., None]).squeeze(-1), row_sum[:, :, P:]), dim=2)
    return _normalise(u, row_sum, normalizer).to(dtype)
