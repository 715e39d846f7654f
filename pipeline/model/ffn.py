"""Feed-forward networks of Table 11. Gated variants fuse W1 and W2 into one projection."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu, "reglu": F.relu, "geglu": F.gelu, "swiglu": F.silu}
GATED = {"reglu", "geglu", "swiglu"}


class FFN(nn.Module):
    """F(h) = act(h W1) W2; gated (*glu): F(h) = (act(h W1) * h W2) W3."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act, self.gated = ACTIVATIONS[cfg.ffn], cfg.ffn in GATED
        if self.gated:
            self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ffn, bias=False)
            self.gate_up.fused_rows = (cfg.d_ffn, cfg.d_ffn)  # W1 and W2 stacked: optimisers may treat each apart
        else:
            self.up = nn.Linear(cfg.d_model, cfg.d_ffn, bias=False)
        self.down = nn.Linear(cfg.d_ffn, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(self.act(gate) * up)
        return self.down(self.act(self.up(x)))
