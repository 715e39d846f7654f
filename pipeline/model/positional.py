"""Positional embeddings (Table 3, Appendix A) over 0-based position indices (sink tokens first), each a
module with three hooks that may return None: ``input_embedding(pos)``, P added to the token
embeddings; ``rotary(pos)``, (cos, sin) for queries and keys; ``score_bias(q_pos, k_pos)``, g(i - j)
added to the logits, [H|1, Tq, Tk]."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .config import ModelConfig


class Positional(nn.Module):
    """The hooks' defaults: no positional information at all (NoPE, P = 0)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg

    def input_embedding(self, pos: Tensor) -> Tensor | None:
        return None

    def rotary(self, pos: Tensor) -> tuple[Tensor, Tensor] | None:
        return None

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return None


class Sinusoidal(Positional):
    """Eq. 5: p_t = [sin(w_1 t), cos(w_1 t), ..., sin(w_{d/2} t), cos(w_{d/2} t)],
    w_i = 1 / 10000^{2(i-1)/d}; interleaved as written in the paper."""

    def input_embedding(self, pos: Tensor) -> Tensor:
        d = self.cfg.d_model
        i = torch.arange(d // 2, device=pos.device, dtype=torch.float32)
        omega = 1.0 / (10000.0 ** (2 * i / d))
        angles = pos.float()[:, None] * omega[None, :]
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


class Learned(Positional):
    """Learnable P (GPT-2 style), one vector per position."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.table = nn.Embedding(cfg.max_seq_len + cfg.sink_tokens, cfg.d_model)

    def input_embedding(self, pos: Tensor) -> Tensor:
        return self.table(pos)


class Rotary(Positional):
    """RoPE (Eq. 8) in HF Llama's half-split layout (dims i and i + d_h/2 form a pair)."""

    def rotary(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        dh = self.cfg.head_dim
        i = torch.arange(0, dh, 2, device=pos.device, dtype=torch.float32)
        inv_freq = 1.0 / (self.cfg.rope_theta ** (i / dh))
        angles = pos.float()[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [..., T, d_h] by the angles of its positions (cos/sin: [T, d_h])."""
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated_half * sin.to(x.dtype)


def relative_bucket(distance: Tensor, n_buckets: int, max_distance: int) -> Tensor:
    """Eq. 6 bucket g(i - j) of causal distances n = i - j >= 0: n if n < B/2; B - 1 if n >= D; else
    B/2 + floor(log(n / (B/2)) / log(D / (B/2)) * B/2)."""
    half = n_buckets // 2
    n = distance.clamp(min=0)
    log_ratio = torch.log(n.float().clamp(min=1) / half) / math.log(max_distance / half)
    large = half + torch.floor(log_ratio * (n_buckets - half)).long()
    large = large.clamp(max=n_buckets - 1)
    bucket = torch.where(n < half, n, large)
    return torch.where(n >= max_distance, torch.full_like(bucket, n_buckets - 1), bucket)


class RelativeBucket(Positional):
    """The paper's relative PE taken literally: the bucket index g(i - j) itself (Eq. 6) added to the logits."""

    def bucket(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return relative_bucket(
            q_pos[:, None] - k_pos[None, :], self.cfg.relative_buckets, self.cfg.relative_max_distance
        )

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.bucket(q_pos, k_pos).float()[None]


class T5Bias(RelativeBucket):
    """T5's relative PE: a learned scalar per (bucket, head), one table shared by all layers."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.table = nn.Embedding(cfg.relative_buckets, cfg.n_heads)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.table(self.bucket(q_pos, k_pos)).permute(2, 0, 1)


def alibi_slopes(n_heads: int) -> Tensor:
    """Eq. 7: m_h = 2^{-h * 2^{-log2(H) + 3}} = 2^{-8h/H}, h = 1..H."""
    h = torch.arange(1, n_heads + 1, dtype=torch.float64)
    return torch.pow(2.0, -h * 2.0 ** (-math.log2(n_heads) + 3)).float()


class ALiBi(Positional):
    """g(i - j) = -(i - j) m_h with Eq. 7's slopes, computed per call (no state a loader could leave unset)."""

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        distance = (q_pos[:, None] - k_pos[None, :]).float()
        return -distance[None] * alibi_slopes(self.cfg.n_heads).to(q_pos.device)[:, None, None]


POSITIONAL: dict[str, type[Positional]] = {
    "nope": Positional,
    "sinusoidal": Sinusoidal,
    "learned": Learned,
    "rope": Rotary,
    "relative": RelativeBucket,
    "t5": T5Bias,
    "alibi": ALiBi,
}
