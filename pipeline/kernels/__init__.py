"""Memory-lean attention for the non-softmax operations of section 7.4 (Tables 6, 14, 15).

``blocked_attention`` is what the model calls on its training path (no attention weights
requested) for ``sigmoid``, ``elu1`` and ``kernel`` ops: it returns the same
sum_j sim_ij v_j / Z_i as ``pipeline.model.attention_ops`` (before the alpha scale) without a
T x T tensor. Linear kernels with a causal or prefix mask take the chunked O(T d_h^2) form;
everything else (sliding windows, sigmoid, elu+1) the tiled form with recomputing backward:
on a CUDA device with Triton installed, the fused kernels of ``triton_tiles``; elsewhere (and
for p-norms) the torch tiles of ``tiled``, which give the same numbers.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .linear import chunked_linear_attention
from . import triton_tiles
from .tiled import MaskSpec, ScoreBias, TileSpec, tiled_attention

BLOCKED_OPS = ("sigmoid", "elu1", "kernel")
IMPLS = ("auto", "torch", "triton")


def supports(config: Any) -> bool:
    """Whether ``blocked_attention`` computes this model config's attention operation."""
    return config.attention.op in BLOCKED_OPS


def mask_spec(config: Any, n_queries: int, n_keys: int) -> MaskSpec:
    """The model's mask (masks.admitted_pairs) for Tq queries that are the last Tq of Tk slots."""
    return MaskSpec(kind=config.mask, window=config.window, prefix=config.sink_tokens + config.prefix_len,
                    q_offset=n_keys - n_queries)


def blocked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    config: Any,
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
    included, Tq = the last Tq of the Tk key slots). slot_k/slot_v [B, H, S, d_h]: the k*/v*
    bias slots, admitted for every query. kernel: phi of ``op=kernel`` (the layer's module).
    score_bias: a fixed additive positional bias (ALiBi, relative buckets), either a function
    (q_idx, k_idx) -> [1|H, bq, bk] evaluated per tile, or the model's [1|H, Tq, Tk] tensor
    (``AttentionContext.score_bias``), sliced per tile; learned biases are refused.
    block_size: keys per tile (None: 128 for the torch tiles, 64 for the fused ones; the linear
    form's chunk is at most 64); query_block: queries per tile (None: all for the torch tiles,
    so memory is O(T block_size) per (batch, head); 64 for the fused ones).
    impl: the tiled form's implementation: ``triton`` (fused kernels), ``torch``, or ``auto``
    (triton for CUDA tensors when installed and the spec allows it); the linear form ignores it.
    """
    a = config.attention
    if impl not in IMPLS:
        raise ValueError(f"blocked_attention: impl={impl!r}; allowed {', '.join(IMPLS)}")
    if a.op not in BLOCKED_OPS:
        raise ValueError(f"blocked_attention: op={a.op!r} is not blocked; allowed {', '.join(BLOCKED_OPS)}")
    scale = 1.0 / math.sqrt(q.shape[-1])
    if a.op == "kernel":
        if kernel is None:
            raise ValueError("blocked_attention: op=kernel needs the layer's phi module (kernel=...)")
        q, k = kernel(q), kernel(k)
        slot_k = None if slot_k is None else kernel(slot_k)
        if config.mask in ("causal", "prefix") and q.shape[2] == k.shape[2] and score_bias is None:
            prefix = config.sink_tokens + config.prefix_len if config.mask == "prefix" else 0
            return chunked_linear_attention(q, k, v, normalizer=a.normalizer, scale=scale, prefix=prefix,
                                            slot_k=slot_k, slot_v=slot_v, chunk=min(block_size or 64, 64))
        similarity, p = "identity", 1.0
    else:
        similarity, p = a.op, a.p
    spec = TileSpec(similarity=similarity, normalizer=a.normalizer, p=p, scale=scale,
                    mask=mask_spec(config, q.shape[2], k.shape[2]), block_q=query_block, block_k=block_size or 128)
    fused = triton_tiles.supports(spec, score_bias)
    if impl == "triton" and not fused:
        raise ValueError("blocked_attention: impl='triton' needs Triton installed, p = 1 and no per-tile bias "
                         "function; use impl='torch'")
    if impl == "triton" or (impl == "auto" and fused and q.is_cuda):
        return triton_tiles.fused_tiled_attention(q, k, v, spec, slot_k=slot_k, slot_v=slot_v, score_bias=score_bias,
                                                  blocks=(query_block, block_size))
    if isinstance(score_bias, Tensor):
        score_bias = _tile_slicer(score_bias, q_offset=k.shape[2] - q.shape[2])
    return tiled_attention(q, k, v, spec, slot_k=slot_k, slot_v=slot_v, score_bias=score_bias)


def _tile_slicer(bias: Tensor, q_offset: int) -> ScoreBias:
    if bias.requires_grad and torch.is_grad_enabled():
        raise ValueError("blocked_attention: score_bias needs gradients (a learned bias such as T5's); "
                         "use the eager attention path for it")
    return lambda q_idx, k_idx: bias[:, q_idx[0] - q_offset:q_idx[-1] + 1 - q_offset, k_idx[0]:k_idx[-1] + 1]


__all__ = ["BLOCKED_OPS", "MaskSpec", "TileSpec", "blocked_attention", "chunked_linear_attention",
           "mask_spec", "supports", "tiled_attention"]
