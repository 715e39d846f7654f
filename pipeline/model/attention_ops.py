"""Attention operations (section 7.4, Tables 6, 14, 15, Eq. 43-44; seed 004), eager form.

v_i = alpha * sum_j sim(phi(q_i), phi(k_j)) / Z_i * v_j. Each op below maps queries, keys
and the additive mask (-inf where a pair is not admitted; finite entries carry positional
biases, bias slots and the sink logit) to:

- ``weights`` [B, H, Tq, Tk]: what multiplies the values (before alpha);
- ``reported``: what the model returns as "attentions" (probabilities for the softmax family,
  the raw similarities otherwise, so metrics can form proxy scores);
- ``kind``: "probs", "sim_nonneg" or "sim_signed".

The softmax training path does not come here: it goes through SDPA in attention.py.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import AttentionConfig


class OpResult(NamedTuple):
    weights: Tensor
    reported: Tensor
    kind: str


def scaled_scores(q: Tensor, k: Tensor, mask: Tensor) -> Tensor:
    return (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]) + mask


def normalize(sim: Tensor, normalizer: str, p: float) -> Tensor:
    """sim / Z_i with Z_i = sum_j sim (its p-norm when p != 1), max(|sum_j sim|, 1), or 1."""
    if normalizer == "none":
        return sim
    if normalizer == "abs_clamp":
        return sim / sim.sum(-1, keepdim=True).abs().clamp(min=1.0)
    if p == 1.0:
        return sim / sim.sum(-1, keepdim=True)
    return sim / sim.pow(p).sum(-1, keepdim=True).pow(1.0 / p)


def _admitted(mask: Tensor) -> Tensor:
    return mask > float("-inf")


def softmax_op(q: Tensor, k: Tensor, mask: Tensor, a: AttentionConfig, kernel: nn.Module | None) -> OpResult:
    """Softmax; with p != 1 the p-normalised softmax of Eq. 44: softmax(p s)^(1/p)."""
    s = scaled_scores(q, k, mask)
    if a.p == 1.0:
        w = torch.softmax(s, dim=-1)
        return OpResult(w, w, "probs")
    w = torch.softmax(a.p * s, dim=-1).pow(1.0 / a.p)
    return OpResult(w, w, "sim_nonneg")


def clipped_softmax_op(q: Tensor, k: Tensor, mask: Tensor, a: AttentionConfig, kernel: nn.Module | None) -> OpResult:
    """clip((zeta - gamma) softmax(s) + gamma, 0, 1), zero where the mask forbids a pair."""
    s = scaled_scores(q, k, mask)
    w = ((a.clip_zeta - a.clip_gamma) * torch.softmax(s, dim=-1) + a.clip_gamma).clamp(0.0, 1.0)
    w = torch.where(_admitted(mask), w, torch.zeros_like(w))
    return OpResult(w, w, "probs")


def _elementwise(fn: Callable[[Tensor], Tensor]):
    def op(q: Tensor, k: Tensor, mask: Tensor, a: AttentionConfig, kernel: nn.Module | None) -> OpResult:
        admitted = _admitted(mask)
        s = scaled_scores(q, k, mask.masked_fill(~admitted, 0.0))
        sim = torch.where(admitted, fn(s), torch.zeros_like(s))
        return OpResult(normalize(sim, a.normalizer, a.p), sim, "sim_nonneg")

    return op


sigmoid_op = _elementwise(torch.sigmoid)
elu1_op = _elementwise(lambda s: F.elu(s) + 1.0)


def kernel_op(q: Tensor, k: Tensor, mask: Tensor, a: AttentionConfig, kernel: nn.Module | None) -> OpResult:
    """sim = phi(q_i) phi(k_j)^T / sqrt(d_h) (linear-attention kernels of Table 15)."""
    assert kernel is not None
    admitted = _admitted(mask)
    s = (kernel(q) @ kernel(k).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    sim = torch.where(admitted, s, torch.zeros_like(s))
    kind = "sim_nonneg" if a.kernel == "elu1" else "sim_signed"
    return OpResult(normalize(sim, a.normalizer, 1.0), sim, kind)


def reports_probabilities(a: AttentionConfig) -> bool:
    """Whether ``OPS[a.op]`` reports attention probabilities (kind "probs"); otherwise the sink
    metrics are computed on proxy scores sim / sum(sim) (section 7.4)."""
    return a.op == "clipped_softmax" or (a.op in ("softmax", "softmax_off_by_one") and a.p == 1.0)


OPS = {
    "softmax": softmax_op,
    "softmax_off_by_one": softmax_op,  # the extra zero logit is a key slot (attention.py)
    "clipped_softmax": clipped_softmax_op,
    "sigmoid": sigmoid_op,
    "elu1": elu1_op,
    "kernel": kernel_op,
}


class Elu1(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x) + 1.0


class KernelMLP(nn.Module):
    """phi = a two-layer MLP on each head's vectors, shared by the heads of a layer."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(head_dim, head_dim, bias=False)
        self.fc2 = nn.Linear(head_dim, head_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def build_kernel(a: AttentionConfig, head_dim: int) -> nn.Module | None:
    if a.op != "kernel":
        return None
    return {"identity": nn.Identity, "elu1": Elu1}.get(a.kernel, lambda: KernelMLP(head_dim))()
