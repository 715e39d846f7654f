"""Memory-lean attention for the non-softmax operations of section 7.4 (Tables 6, 14, 15).

``blocked_attention`` is what the model calls on its training path (no attention weights
requested) for the ops whose registry entry names a similarity f (``OpSpec.tiles`` in
``pipeline.model.attention_ops``: sigmoid, elu+1, kernels): it returns the same
sum_j sim_ij v_j / Z_i as the eager op (before the alpha scale) without a T x T tensor.
Linear kernels (f = identity after phi) with a causal or prefix mask take the chunked
O(T d_h^2) form; everything else (sliding windows, sigmoid, elu+1) the tiled form with
recomputing backward:
on a CUDA device with Triton installed, the fused kernels of ``triton_tiles``; elsewhere (and
for p-norms) the torch tiles of ``tiled``, which give the same numbers.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from .linear import chunked_linear_attention
from .tiled import SIMILARITIES, AttentionSpec, MaskSpec, ScoreBias, TileSpec, tiled_attention
from .triton_tiles import SIMILARITIES as FUSED_SIMILARITIES
from .triton_tiles import fused_tiled_attention
from .triton_tiles import supports as fused_supports

IMPLS = ("auto", "torch", "triton")


def blocked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: AttentionSpec,
    *,
    kernel: nn.Module | None = None,
    slot_k: Tensor | None = None,
    slot_v: Tensor | None = None,
    score_bias: ScoreBias | Tensor | None = None,
    block_size: int | None = None,
    query_block: int | None = None,
    impl: str = "auto",
) -> Tensor:
    """Attention output [B, H, Tq, d_h] before the alpha scale.

    q [B, H, Tq, d_h], k/v [B, H, Tk, d_h]: rotated token queries/keys/values (sink tokens
    included, Tq = the last Tq of the Tk key slots). spec: what to compute (similarity f,
    normaliser, p, scale, mask), from the op registry (``attention_ops.blocked_spec``).
    kernel: phi applied to queries and keys first (the layer's module). slot_k/slot_v
    [B, H, S, d_h]: the k*/v* bias slots, admitted for every query.
    score_bias: a fixed additive positional bias (ALiBi, relative buckets), either a function
    (q_idx, k_idx) -> [1|H, bq, bk] evaluated per tile, or the model's [1|H, Tq, Tk] tensor
    (``AttentionContext.score_bias``), sliced per tile; learned biases are refused.
    block_size: keys per tile (None: 128 for the torch tiles, 64 for the fused ones; the linear
    form's chunk is at most 64); query_block: queries per tile (None: all for the torch tiles,
    so memory is O(T block_size) per (batch, head); 64 for the fused ones).
    impl: the tiled form's implementation: ``triton`` (fused kernels), ``torch``, or ``auto``
    (triton for CUDA tensors when installed and the spec allows it); the linear form ignores it.
    """
    if impl not in IMPLS:
        raise ValueError(f"blocked_attention: impl={impl!r}; allowed {', '.join(IMPLS)}")
    if kernel is not None:
        q, k = kernel(q), kernel(k)
        slot_k = None if slot_k is None else kernel(slot_k)
    mask = spec.mask
    linear = spec.similarity == "identity" and spec.p == 1.0 and score_bias is None
    if linear and mask.kind in ("causal", "prefix") and q.shape[2] == k.shape[2]:
        return chunked_linear_attention(
            q,
            k,
            v,
            normalizer=spec.normalizer,
            scale=spec.scale,
            prefix=mask.prefix if mask.kind == "prefix" else 0,
            slot_k=slot_k,
            slot_v=slot_v,
            chunk=min(block_size or 64, 64),
        )
    tiles = TileSpec(
        similarity=spec.similarity,
        normalizer=spec.normalizer,
        p=spec.p,
        scale=spec.scale,
        mask=dataclasses.replace(mask, q_offset=k.shape[2] - q.shape[2]),
        block_q=query_block,
        block_k=block_size or 128,
    )
    fused = fused_supports(tiles, score_bias)
    if impl == "triton" and not fused:
        raise ValueError(
            f"blocked_attention: impl='triton' needs Triton installed, p = 1, a similarity among "
            f"{', '.join(FUSED_SIMILARITIES)} and no per-tile bias function; use impl='torch'"
        )
    if impl == "triton" or (impl == "auto" and fused and q.is_cuda):
        return fused_tiled_attention(
            q, k, v, tiles, slot_k=slot_k, slot_v=slot_v, score_bias=score_bias, blocks=(query_block, block_size)
        )
    if isinstance(score_bias, Tensor):
        score_bias = _tile_slicer(score_bias, q_offset=k.shape[2] - q.shape[2])
    return tiled_attention(q, k, v, tiles, slot_k=slot_k, slot_v=slot_v, score_bias=score_bias)


def _tile_slicer(bias: Tensor, q_offset: int) -> ScoreBias:
    if bias.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "blocked_attention: score_bias needs gradients (a learned bias such as T5's); "
            "use the eager attention path for it"
        )
    return lambda q_idx, k_idx: bias[:, q_idx[0] - q_offset : q_idx[-1] + 1 - q_offset, k_idx[0] : k_idx[-1] + 1]


__all__ = [
    "SIMILARITIES",
    "AttentionSpec",
    "MaskSpec",
    "TileSpec",
    "blocked_attention",
    "chunked_linear_attention",
    "tiled_attention",
]
