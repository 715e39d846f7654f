"""Causal linear attention in chunked prefix-sum form, O(T c d_h + T d_h^2), no T x T matrix.

With phi applied (``q``, ``k`` = phi(q), phi(k)) and sim_ij = c q_i k_j^T (c the score factor) on admitted pairs,
y_i = u_i / Z(S_i), u_i = sum_j sim_ij v_j, S_i = sum_j sim_ij. A chunk of ``chunk`` positions is masked causally;
the state sum_j k_j^T v_j and sum_j k_j of earlier chunks, seeded by the bias slots, holds the rest.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .tiled import Normalizer, accumulator, normaliser


def chunked_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    normalizer: Normalizer = "sum",
    score_factor: float = 1.0,
    prefix: int = 0,
    slot_k: Tensor | None = None,
    slot_v: Tensor | None = None,
    chunk: int = 64,
) -> Tensor:
    """[B, H, T, d_v] for queries and keys of the same T positions (training; no cache offset)."""
    B, H, T, dh = q.shape
    dtype, acc = q.dtype, accumulator(q)
    q, k, v = q.to(acc) * score_factor, k.to(acc), v.to(acc)
    n = -(-T // chunk)
    pad = n * chunk - T
    qc, kc, vc = (F.pad(x, (0, 0, 0, pad)).view(B, H, n, chunk, x.shape[-1]) for x in (q, k, v))

    # state before each chunk: exclusive prefix sums of k^T v and of k (plus the bias slots)
    kv = kc.transpose(-2, -1) @ vc  # [B, H, n, dh, dv]
    ksum = kc.sum(3)  # [B, H, n, dh]
    kv_before = kv.cumsum(2) - kv
    k_before = ksum.cumsum(2) - ksum
    if slot_k is not None:
        slot_kv, slot_ksum = slot_k.to(acc).transpose(-2, -1) @ slot_v.to(acc), slot_k.to(acc).sum(2)
        kv_before = kv_before + slot_kv[:, :, None]
        k_before = k_before + slot_ksum[:, :, None]

    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    intra = (qc @ kc.transpose(-2, -1)).masked_fill(~causal, 0.0)  # [B, H, n, c, c]
    u = qc @ kv_before + intra @ vc
    row_sum = (qc @ k_before[..., None]).squeeze(-1) + intra.sum(-1)
    u, row_sum = u.reshape(B, H, n * chunk, -1)[:, :, :T], row_sum.reshape(B, H, n * chunk)[:, :, :T]

    if prefix > 1:  # queries inside the prefix see every prefix key (and the bias slots)
        P = min(prefix, T)
        kv_prefix = kv_before[:, :, 0] + k[:, :, :P].transpose(-2, -1) @ v[:, :, :P]  # state before chunk 0: the slots
        k_prefix = k_before[:, :, 0] + k[:, :, :P].sum(2)
        u = torch.cat((q[:, :, :P] @ kv_prefix, u[:, :, P:]), dim=2)
        row_sum = torch.cat(((q[:, :, :P] @ k_prefix[..., None]).squeeze(-1), row_sum[:, :, P:]), dim=2)
    return (u / normaliser(row_sum, normalizer)[..., None]).to(dtype)
