"""Which (query, key) pairs attention admits (section 6, Figures 5 and 6), and the additive
mask shared by all layers of one forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from pipeline.kernels.tiled import MaskSpec

from .config import ModelConfig


def admitted_pairs(cfg: ModelConfig, q_idx: Tensor, k_idx: Tensor) -> Tensor:
    """Bool [Tq, Tk] over position indices (sink tokens first, inside the prefix of a prefix mask)."""
    return MaskSpec(cfg.mask, cfg.window, cfg.sink_tokens + cfg.prefix_len).admitted(q_idx, k_idx)


def admitted_with_extra(cfg: ModelConfig, T: int) -> Tensor:
    """Bool [S + T, n_bias + S + T]: the admitted pairs of a full attention map, slot columns first."""
    idx = torch.arange(cfg.sink_tokens + T)
    admitted = admitted_pairs(cfg, idx, idx)
    if cfg.n_bias_slots:
        admitted = torch.cat([torch.ones(len(idx), cfg.n_bias_slots, dtype=torch.bool), admitted], dim=1)
    return admitted


@dataclass
class AttentionContext:
    """Per-forward facts shared by every layer; the admitted pairs [Tq, Tk] are built on first use."""

    q_pos: Tensor
    k_pos: Tensor
    rotary_q: tuple[Tensor, Tensor] | None
    rotary_k: tuple[Tensor, Tensor] | None
    config: ModelConfig
    q_idx: Tensor  # position index of each query (cache offset included)
    k_idx: Tensor
    score_bias: Tensor | None  # float [1|H, Tq, Tk] positional bias
    plain_causal: bool  # SDPA may use is_causal=True and no mask
    _admitted: Tensor | None = field(default=None, repr=False)
    _mask: Tensor | None = field(default=None, repr=False)

    @property
    def admitted(self) -> Tensor:
        """Bool [Tq, Tk]."""
        if self._admitted is None:
            self._admitted = admitted_pairs(self.config, self.q_idx, self.k_idx)
        return self._admitted

    def n_admitted(self) -> Tensor:
        """Int [Tq]: the token keys each query sees (no [Tq, Tk] tensor for a causal mask)."""
        if self.config.mask == "causal":
            return self.q_idx + 1
        return self.admitted.sum(-1)

    def additive_mask(self) -> Tensor:
        """Float [1, 1|H, Tq, Tk]: positional bias where admitted, -inf elsewhere."""
        if self._mask is None:
            bias = self.score_bias
            if bias is None:
                bias = torch.zeros(1, *self.admitted.shape, device=self.admitted.device)
            self._mask = bias.masked_fill(~self.admitted, float("-inf"))[None]
        return self._mask
