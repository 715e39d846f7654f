"""Feed-forward networks of Table 11. Gated variants fuse W1 and W2 into one projection."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu, "reglu": F.relu, "geglu": F.gelu, "swiglu": F.silu}
GATED = {"reglu", "geglu", "swiglu"}


class MLP(nn.Module):
    """F(h) = act(h W1) W2."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.ffn]
        self.up = nn.Linear(cfg.d_model, cfg.d_ffn, bias=False)
        self.down = nn.Linear(cfg.d_ffn, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.up(x)))


class GatedMLP(nn.Module):
    """F(h) = (act(h W1) * h W2) W3, with [W1 W2] as one fused matmul."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.ffn]
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ffn, bias=False)
        self.gate_up.fused_rows = (cfg.d_ffn, cfg.d_ffn)  # W1 and W2 stacked: optimisers may treat each apart
        self.down = nn.Linear(cfg.d_ffn, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)


def build_ffn(cfg: ModelConfig) -> nn.Module:
    return GatedMLP(cfg) if cfg.ffn in GATED else MLP(cfg)
