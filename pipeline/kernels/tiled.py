"""Tiled attention for element-wise similarities (sigmoid, elu+1, the kernel op's dot products), no T x T
tensor forward or backward: tiles are recomputed in backward, as in FlashAttention (docs/gpu.md).

    y_i = sum_j sim_ij v_j / Z_i,   sim_ij = f(c q_i k_j^T + b_ij) on admitted pairs, else 0

with c the score factor, Z_i = sum_j sim_ij (or its p-norm), max(|sum_j sim_ij|, 1), or 1. Backward, with u_i = Z_i y_i
and D_i = dZ_i = -(dy_i . y_i) / Z_i:
    dsim_ij = dy_i . v_j / Z_i + D_i dZ_i/dsim_ij    (1 | sign(S_i) [|S_i| > 1] | (sim_ij/Z_i)^(p-1) | 0)
    ds_ij   = dsim_ij f'(s_ij) on admitted pairs;   dq = c ds k,  dk = c ds^T q,  dv = sim^T dy / Z
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Normalizer = Literal["sum", "abs_clamp", "none"]
MaskKind = Literal["causal", "prefix", "sliding"]
ScoreBias = Callable[[Tensor, Tensor], Tensor]  # (query position idx [bq], key position idx [bk]) -> [1|H, bq, bk]


@dataclass(frozen=True)
class MaskSpec:
    """The admitted (query, key) position pairs: causal j <= i; prefix: also i, j < prefix; sliding: j <= i
    and i - j < window. Queries are positions q_offset .. q_offset + Tq - 1; keys are positions 0 .. Tk - 1."""

    kind: MaskKind = "causal"
    window: int = 0
    prefix: int = 0
    q_offset: int = 0

    def admitted(self, q_idx: Tensor, k_idx: Tensor) -> Tensor:
        qi, kj = q_idx[:, None], k_idx[None, :]
        causal = kj <= qi
        if self.kind == "prefix":
            return causal | ((qi < self.prefix) & (kj < self.prefix))
        if self.kind == "sliding":
            return causal & (qi - kj < self.window)
        return causal

    def key_range(self, q_lo: int, q_hi: int, n_keys: int) -> tuple[int, int]:
        """Keys [lo, hi) that some query position in [q_lo, q_hi) may see."""
        hi = max(q_hi, self.prefix) if self.kind == "prefix" and q_lo < self.prefix else q_hi
        lo = max(0, q_lo - self.window + 1) if self.kind == "sliding" else 0
        return lo, min(hi, n_keys)

    def query_range(self, k_lo: int, k_hi: int, q_lo: int, q_hi: int) -> tuple[int, int]:
        """The part of query positions [q_lo, q_hi) that sees some key in [k_lo, k_hi)."""
        lo = q_lo if self.kind == "prefix" and k_lo < self.prefix else max(q_lo, k_lo)
        hi = min(q_hi, k_hi + self.window - 1) if self.kind == "sliding" else q_hi
        return lo, max(lo, hi)


@dataclass(frozen=True)
class AttentionSpec:
    """What the blocked kernels compute for one layer; built by ``attention_ops.blocked_spec``."""

    similarity: str  # f, a key of SIMILARITIES ("identity" after phi: linear attention)
    normalizer: Normalizer = "sum"  # Z_i: sum_j sim_ij (its p-norm when p != 1), max(|sum_j sim_ij|, 1), or 1
    p: float = 1.0
    score_factor: float = 1.0  # of the scores q_i k_j^T
    mask: MaskSpec = MaskSpec()  # blocked_attention sets q_offset per call

    def __post_init__(self) -> None:
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"attention spec: similarity={self.similarity!r}; allowed {', '.join(SIMILARITIES)}")


@dataclass(frozen=True)
class TileSpec(AttentionSpec):
    """An AttentionSpec cut into tiles: block_q queries by block_k keys."""

    block_q: int | None = None  # None: all queries in one block (fewest kernel launches)
    block_k: int = 128


def _sigmoid(s: Tensor) -> tuple[Tensor, Tensor]:
    sim = torch.sigmoid(s)
    return sim, sim * (1.0 - sim)


def _elu1(s: Tensor) -> tuple[Tensor, Tensor]:
    sim = F.elu(s) + 1.0  # = exp(s) for s <= 0
    return sim, torch.where(s > 0, torch.ones_like(s), sim)


# f(s) and f'(s) of each similarity; identity is phi(q) phi(k)^T once phi is applied
SIMILARITIES: dict[str, Callable[[Tensor], tuple[Tensor, Tensor]]] = {
    "sigmoid": _sigmoid,
    "elu1": _elu1,
    "identity": lambda s: (s, torch.ones_like(s)),
}


def accumulator(t: Tensor) -> torch.dtype:
    """fp32 sums for fp32/bf16/fp16 inputs; fp64 stays fp64 (tests compare to 1e-9)."""
    return torch.promote_types(t.dtype, torch.float32)


class _Tiles:
    """Recomputes one tile's scores; shared by forward and backward."""

    def __init__(self, q, k, v, slot_k, slot_v, bias, spec: TileSpec):
        self.q, self.k, self.v, self.slot_k, self.slot_v, self.bias, self.spec = q, k, v, slot_k, slot_v, bias, spec
        self.acc = accumulator(q)

    def blocks(self):
        """Yield (q_lo, q_hi, tile): the queries that see something of a tile, (k_lo, k_hi) over token
        keys or None for the bias-slot columns (admitted for every query, no positional bias)."""
        spec, mask, Tq, Tk = self.spec, self.spec.mask, self.q.shape[2], self.k.shape[2]
        off = mask.q_offset
        block_q = spec.block_q or Tq
        for q_lo in range(0, Tq, block_q):
            q_hi = min(Tq, q_lo + block_q)
            if self.slot_k is not None:
                yield q_lo, q_hi, None
            lo, hi = mask.key_range(q_lo + off, q_hi + off, Tk)
            for k_lo in range(lo, hi, spec.block_k):
                k_hi = min(hi, k_lo + spec.block_k)
                a, b = mask.query_range(k_lo, k_hi, q_lo + off, q_hi + off)
                if b > a:
                    yield a - off, b - off, (k_lo, k_hi)

    def scores(self, q_lo: int, q_hi: int, tile):
        """The tile's keys and values, sim = f(s) and f'(s), in the accumulation dtype, zero off the mask."""
        spec = self.spec
        keys, values = (self.slot_k, self.slot_v) if tile is None else (t[:, :, slice(*tile)] for t in (self.k, self.v))
        s = (self.q[:, :, q_lo:q_hi] @ keys.transpose(-2, -1)).to(self.acc) * spec.score_factor
        admitted = None
        if tile is not None:
            q_idx = torch.arange(q_lo, q_hi, device=s.device) + spec.mask.q_offset
            k_idx = torch.arange(*tile, device=s.device)
            admitted = spec.mask.admitted(q_idx, k_idx)
            if self.bias is not None:
                s = s + self.bias(q_idx, k_idx).to(self.acc)[None]
        sim, dsim_ds = SIMILARITIES[spec.similarity](s)
        if admitted is not None:  # always masked: testing admitted.all() would sync a GPU per tile
            sim = sim.masked_fill(~admitted, 0.0)
            dsim_ds = dsim_ds.masked_fill(~admitted, 0.0)
        return keys, values, sim, dsim_ds


def normaliser(row_sum: Tensor, normalizer: Normalizer, row_pow: Tensor | None = None, p: float = 1.0) -> Tensor:
    """Z_i from S_i = sum_j sim_ij (and sum_j sim_ij^p for a p-norm)."""
    if normalizer == "none":
        return torch.ones_like(row_sum)
    if normalizer == "abs_clamp":
        return row_sum.abs().clamp(min=1.0)
    return row_sum if row_pow is None else row_pow.pow(1.0 / p)


class TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, slot_k, slot_v, bias, spec: TileSpec):
        tiles = _Tiles(q, k, v, slot_k, slot_v, bias, spec)
        acc, rows = tiles.acc, q.shape[:3]
        u = q.new_zeros(*rows, v.shape[-1], dtype=acc)
        row_sum = q.new_zeros(rows, dtype=acc)
        row_pow = q.new_zeros(rows, dtype=acc) if spec.p != 1.0 else None
        for q_lo, q_hi, tile in tiles.blocks():
            _, values, sim, _ = tiles.scores(q_lo, q_hi, tile)
            u[:, :, q_lo:q_hi] += (sim.to(values.dtype) @ values).to(acc)
            row_sum[:, :, q_lo:q_hi] += sim.sum(-1)
            if row_pow is not None:
                row_pow[:, :, q_lo:q_hi] += sim.pow(spec.p).sum(-1)
        z = normaliser(row_sum, spec.normalizer, row_pow, spec.p)
        y = u / z[..., None]
        ctx.save_for_backward(q, k, v, slot_k, slot_v, y, z, row_sum)
        ctx.bias, ctx.spec = bias, spec
        return y.to(q.dtype)

    @staticmethod
    def backward(ctx, dy):
        q, k, v, slot_k, slot_v, y, z, row_sum = ctx.saved_tensors
        spec = ctx.spec
        tiles = _Tiles(q, k, v, slot_k, slot_v, ctx.bias, spec)
        acc = tiles.acc
        dy = dy.to(acc)
        du = dy / z[..., None]  # dL/du_i
        dz = -(dy * y).sum(-1) / z  # dL/dZ_i
        if spec.normalizer == "none":
            dz = torch.zeros_like(dz)
        elif spec.normalizer == "abs_clamp":
            dz = dz * torch.sign(row_sum) * (row_sum.abs() > 1.0)
        dq, dk, dv = (torch.zeros_like(t, dtype=acc) for t in (q, k, v))
        dsk, dsv = (None if t is None else torch.zeros_like(t, dtype=acc) for t in (slot_k, slot_v))
        mm = lambda a, b: (a.to(q.dtype) @ b.to(q.dtype)).to(acc)  # tensor-core dtype in, fp32 out
        for q_lo, q_hi, tile in tiles.blocks():
            q_blk, du_blk, dz_blk = q[:, :, q_lo:q_hi], du[:, :, q_lo:q_hi], dz[:, :, q_lo:q_hi, None]
            keys, values, sim, dsim_ds = tiles.scores(q_lo, q_hi, tile)
            dsim = mm(du_blk, values.transpose(-2, -1))
            if spec.p != 1.0:  # dZ/dsim = (sim / Z)^(p-1); zero off the mask even for p < 1
                ratio = (sim / z[:, :, q_lo:q_hi, None]).clamp(min=torch.finfo(sim.dtype).tiny)
                dsim = dsim + dz_blk * torch.where(sim > 0, ratio.pow(spec.p - 1.0), 0.0)
            else:
                dsim = dsim + dz_blk
            ds = dsim * dsim_ds * spec.score_factor
            dq[:, :, q_lo:q_hi] += mm(ds, keys)
            dk_tile, dv_tile = mm(ds.transpose(-2, -1), q_blk), mm(sim.transpose(-2, -1), du_blk)
            if tile is None:
                dsk += dk_tile
                dsv += dv_tile
            else:
                dk[:, :, tile[0] : tile[1]] += dk_tile
                dv[:, :, tile[0] : tile[1]] += dv_tile
        inputs = (q, k, v, slot_k, slot_v)
        grads = [None if g is None else g.to(t.dtype) for g, t in zip((dq, dk, dv, dsk, dsv), inputs)]
        return (*grads, None, None)


def refuse_learned_bias(caller: str, bias: Tensor | None) -> None:
    """Tiles take fixed positional biases only; a learned one (T5's) takes the eager path."""
    if bias is not None and bias.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            f"{caller}: score_bias needs gradients (a learned bias such as T5's); use the eager attention path for it"
        )


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: TileSpec,
    slot_k: Tensor | None = None,
    slot_v: Tensor | None = None,
    score_bias: ScoreBias | None = None,
) -> Tensor:
    """[B, H, Tq, d_h] over bias slots ``slot_k``/``slot_v`` [B, H, S, d_h] (admitted for every query)
    and token keys ``k``/``v`` [B, H, Tk, d_h]; ``score_bias``, evaluated per tile, must need no gradients."""
    if score_bias is not None and torch.is_grad_enabled():
        probe = torch.zeros(1, dtype=torch.long, device=q.device)
        refuse_learned_bias("tiled_attention", score_bias(probe, probe))
    return TiledAttention.apply(q, k, v, slot_k, slot_v, score_bias, spec)
