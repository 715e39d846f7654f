"""Memory-lean attention for the non-softmax operations of section 7.4 (Tables 6, 14, 15): the
eager op's sum_j sim_ij v_j / Z_i without a T x T tensor, on the model's training path (docs/gpu.md)."""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from .linear import chunked_linear_attention
from .tiled import AttentionSpec, ScoreBias, TileSpec, refuse_learned_bias, tiled_attention
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
    feature_map: nn.Module | None = None,
    slot_k: Tensor | None = None,
    slot_v: Tensor | None = None,
    score_bias: ScoreBias | Tensor | None = None,
    block_size: int | None = None,
    query_block: int | None = None,
    impl: str = "auto",
) -> Tensor:
    """Attention output [B, H, Tq, d_h] before the factor α: chunked linear attention for a linear
    similarity under a causal or prefix mask, else tiles (fused Triton or torch, the same numbers).

    q [B, H, Tq, d_h], k/v [B, H, Tk, d_h]: rotated, queries the last Tq key positions. feature_map: φ.
    slot_k/slot_v [B, H, S, d_h]: the bias slots. score_bias: a fixed positional bias, a function
    (q_idx, k_idx) -> [1|H, bq, bk] or the model's [1|H, Tq, Tk] tensor. block_size / query_block:
    keys / queries per tile (None: 128 / all torch, autotuned fused; the linear chunk is at most 64).
    impl: ``triton``, ``torch`` or ``auto`` (triton for CUDA tensors when it computes the spec).
    """
    if impl not in IMPLS:
        raise ValueError(f"blocked_attention: impl={impl!r}; allowed {', '.join(IMPLS)}")
    if feature_map is not None:
        q, k = feature_map(q), feature_map(k)
        slot_k = None if slot_k is None else feature_map(slot_k)
    mask, q_offset = spec.mask, k.shape[2] - q.shape[2]
    linear = spec.similarity == "identity" and spec.p == 1.0 and score_bias is None
    if linear and mask.kind in ("causal", "prefix") and q_offset == 0:
        return chunked_linear_attention(
            q,
            k,
            v,
            normalizer=spec.normalizer,
            score_factor=spec.score_factor,
            prefix=mask.prefix if mask.kind == "prefix" else 0,
            slot_k=slot_k,
            slot_v=slot_v,
            chunk=min(block_size or 64, 64),
        )
    fields = vars(spec) | {"mask": dataclasses.replace(mask, q_offset=q_offset)}
    tiles = TileSpec(**fields, block_q=query_block, block_k=block_size or 128)
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
    if isinstance(bias := score_bias, Tensor):
        refuse_learned_bias("blocked_attention", bias)
        score_bias = lambda q_idx, k_idx: bias[
            :, q_idx[0] - q_offset : q_idx[-1] + 1 - q_offset, k_idx[0] : k_idx[-1] + 1
        ]
    return tiled_attention(q, k, v, tiles, slot_k=slot_k, slot_v=slot_v, score_bias=score_bias)
