"""Secondary attention sinks: key positions past the first ones that draw attention like a sink.

Over one layer's causal map ``A [B, H, T, T]`` of real tokens, a head's secondary sinks are the positions
k > ``first`` (1-based) with α_k = 1/(T−k+1) · Σ_{i=k..T} A_{i,k} > ε that at least ``min_queries`` queries see.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import Tensor

from pipeline.metrics import importance_profile

MIN_QUERIES = 8  # default: keys followed by fewer queries are not judged


def secondary_sink_mask(attn: Tensor, eps: float, first: int = 1, min_queries: int = 1) -> Tensor:
    """Bool ``[..., T]``: key k (1-based) is a secondary sink: k > first, α_k > ε and T−k+1 >= min_queries."""
    T = attn.shape[-1]
    k = torch.arange(1, T + 1, device=attn.device)
    return (importance_profile(attn) > eps) & (k > first) & (T - k + 1 >= min_queries)


def judged_keys(T: int, first: int = 1, min_queries: int = 1) -> int:
    """How many keys of a length-``T`` map :func:`secondary_sink_mask` can call a sink: k > first, T−k+1 >= min_queries."""
    return max(0, T - first - min_queries + 1)


def attention_share(attn: Tensor, eps: float, first: int = 1, min_queries: int = 1) -> Tensor:
    """``[..., T, T] -> [...]``: the share of each map's attention mass that its secondary sinks take."""
    return _share(attn, secondary_sink_mask(attn, eps, first, min_queries))


def _share(attn: Tensor, sinks: Tensor) -> Tensor:
    return (attn.sum(dim=-2) * sinks).sum(-1) / attn.shape[-1]


@dataclass
class SecondarySinkStats:
    """One layer's secondary sinks over a batch of sequences."""

    count: float  # sink positions per (sequence, head)
    share: float  # share of a head's attention mass on them, mean over (sequence, head)
    norm_ratio: float | None  # ‖h_k‖ / mean_t ‖h_t‖ over the sinks found (None: none found)
    tokens: Counter = field(default_factory=Counter)  # token id -> (sequence, head) detections


def layer_stats(
    attn: Tensor,
    eps: float,
    first: int = 1,
    min_queries: int = 1,
    tokens: Tensor | None = None,
    hidden: Tensor | None = None,
) -> SecondarySinkStats:
    """``attn [B, H, T, T]``, ``tokens [B, T]``, ``hidden [B, T, d]`` (this layer's residual stream)."""
    sinks = secondary_sink_mask(attn, eps, first, min_queries)  # [B, H, T]
    share = _share(attn, sinks)  # [B, H]
    ids = Counter() if tokens is None else Counter(tokens[:, None, :].expand_as(sinks)[sinks].tolist())
    ratio = None
    if hidden is not None and sinks.any():
        norms = hidden.float().norm(dim=-1)  # [B, T]
        relative = (norms / norms.mean(dim=-1, keepdim=True))[:, None, :].expand_as(sinks)
        ratio = float(relative[sinks].mean())
    return SecondarySinkStats(float(sinks.sum(-1).double().mean()), float(share.double().mean()), ratio, ids)
