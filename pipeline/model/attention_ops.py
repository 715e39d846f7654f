"""Attention operations (section 7.4, Tables 6, 14, 15, Eq. 43-44; Gu et al. 2025, appendix A.3), each
one ``OpSpec`` in ``OPS``: v_i = alpha * sum_j sim(phi(q_i), phi(k_j)) / Z_i * v_j. An eager op maps
queries, keys and the additive mask (-inf where not admitted) to ``weights`` [B, H, Tq, Tk] (what
multiplies the values, before alpha) and ``reported`` (the model's "attentions", ``OpSpec.scores``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.kernels.tiled import SIMILARITIES, AttentionSpec, MaskSpec, Normalizer

if TYPE_CHECKING:
    from .config import AttentionConfig, ModelConfig

# what an op reports: "probs" are read as they are, the others become proxy scores (metrics.proxy_scores)
SCORE_KINDS = {
    "probs": "attention weights",
    "sim_nonneg": "proxy scores sim/Σ sim",
    "sim_signed": "proxy scores |sim|/Σ|sim|",
}
NORMALIZERS = get_args(Normalizer)


class OpResult(NamedTuple):
    weights: Tensor
    reported: Tensor


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


def softmax_op(q: Tensor, k: Tensor, mask: Tensor, a: AttentionConfig, feature_map: nn.Module | None) -> OpResult:
    """Softmax; with p != 1 the p-normalised softmax of Eq. 44: softmax(p s)^(1/p)."""
    s = scaled_scores(q, k, mask)
    w = torch.softmax(s, dim=-1) if a.p == 1.0 else torch.softmax(a.p * s, dim=-1).pow(1.0 / a.p)
    return OpResult(w, w)


def clipped_softmax_op(
    q: Tensor, k: Tensor, mask: Tensor, a: AttentionConfig, feature_map: nn.Module | None
) -> OpResult:
    """Clipped softmax (Bondarenko et al. 2023): clip((ζ − γ) softmax(s) + γ, 0, 1), 0 where the mask forbids a pair."""
    s = scaled_scores(q, k, mask)
    w = ((a.clip_zeta - a.clip_gamma) * torch.softmax(s, dim=-1) + a.clip_gamma).clamp(0.0, 1.0)
    w = torch.where(_admitted(mask), w, torch.zeros_like(w))
    return OpResult(w, w)


def softpick_op(q: Tensor, k: Tensor, mask: Tensor, a: AttentionConfig, feature_map: nn.Module | None) -> OpResult:
    """Softpick (Zuhri et al. 2025): ReLU(e^x - 1) / sum_j |e^x_j - 1| over admitted pairs."""
    admitted = _admitted(mask)
    x = torch.where(admitted, scaled_scores(q, k, mask.masked_fill(~admitted, 0.0)), 0.0)  # masked: e^0 - 1 = 0
    m = x.amax(-1, keepdim=True).clamp(min=0.0).detach()
    # e^-m (e^x - 1) without overflow or cancellation: e^(x-m) (1 - e^-x) for x > 0, e^-m expm1(x) else
    pos, neg = x.clamp(min=0.0), x.clamp(max=0.0)
    d = -torch.exp(pos - m) * torch.expm1(-pos) + torch.exp(-m) * torch.expm1(neg)
    w = d.clamp(min=0.0) / d.abs().sum(-1, keepdim=True).clamp(min=torch.finfo(d.dtype).tiny)
    return OpResult(w, w)


def relu_op(q: Tensor, k: Tensor, mask: Tensor, a: AttentionConfig, feature_map: nn.Module | None) -> OpResult:
    """ReLU attention (Guo et al. 2024, Bigram-Backcopy): ReLU(s_ij) / n_i, n_i the keys query i may see."""
    admitted = _admitted(mask)
    s = scaled_scores(q, k, mask.masked_fill(~admitted, 0.0))
    sim = torch.where(admitted, torch.relu(s), torch.zeros_like(s))
    return OpResult(sim / admitted.sum(-1, keepdim=True).clamp(min=1), sim)


def _elementwise(fn: Callable[[Tensor], Tensor], doc: str):

    def op(q: Tensor, k: Tensor, mask: Tensor, a: AttentionConfig, feature_map: nn.Module | None) -> OpResult:
        admitted = _admitted(mask)
        s = scaled_scores(q, k, mask.masked_fill(~admitted, 0.0))
        sim = torch.where(admitted, fn(s), torch.zeros_like(s))
        return OpResult(normalize(sim, a.normalizer, a.p), sim)

    op.__doc__ = doc
    return op


sigmoid_op = _elementwise(torch.sigmoid, "sim = sigmoid(q k^T / sqrt(d_h)) on admitted pairs, over Z_i (Table 6).")
elu1_op = _elementwise(
    lambda s: F.elu(s) + 1.0, "sim = elu(q k^T / sqrt(d_h)) + 1 on admitted pairs, over Z_i (Table 6)."
)


def kernel_op(q: Tensor, k: Tensor, mask: Tensor, a: AttentionConfig, feature_map: nn.Module | None) -> OpResult:
    """sim = phi(q_i) phi(k_j)^T / sqrt(d_h) (the feature maps of Table 15)."""
    assert feature_map is not None
    admitted = _admitted(mask)
    s = (feature_map(q) @ feature_map(k).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    sim = torch.where(admitted, s, torch.zeros_like(s))
    return OpResult(normalize(sim, a.normalizer, 1.0), sim)


class Elu1(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x) + 1.0


class MLPFeatureMap(nn.Module):
    """phi = a two-layer MLP on each head's vectors, shared by the heads of a layer."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(head_dim, head_dim, bias=False)
        self.fc2 = nn.Linear(head_dim, head_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def _feature_map(a: AttentionConfig, head_dim: int) -> nn.Module:
    return {"identity": nn.Identity, "elu1": Elu1}.get(a.feature_map, lambda: MLPFeatureMap(head_dim))()


@dataclass(frozen=True, kw_only=True)
class OpSpec:
    """One attention operation and every fact the rest of SinkLab needs about it (docs/model.md's table reads it)."""

    name: str
    # the eager form (q, k, mask, attention config, phi) -> OpResult; every path is checked against it
    fn: Callable[..., OpResult]
    # what ``reported`` holds (a key of SCORE_KINDS), or a function of the attention config;
    # with p != 1 "probs" becomes "sim_nonneg" (a row's p-norm, not its sum, is one)
    scores: str | Callable[[AttentionConfig], str]
    softmax: bool = False  # rows are a softmax of the logits, so a sink logit is defined
    normalizers: tuple[str, ...] = ("sum",)  # the values of attention.normalizer it accepts
    p_norm: bool = False  # accepts attention.p != 1 (Eq. 43-44)
    sdpa: bool = False  # at p = 1 the training path may run F.scaled_dot_product_attention
    # the similarity f of f(c q k^T + b) / Z, c the score factor (a key of tiled.SIMILARITIES): the blocked kernels
    # then run the training path; "identity" with phi is linear attention
    tiles: str | None = None
    zero_logit: bool = False  # one more logit fixed at 0 in the denominator (a key slot, like the sink logit)
    score_biases: bool = True  # additive positional biases (ALiBi, relative, T5) are defined for it
    # builds phi, applied to queries and keys (the layer owns its parameters; they count in FLOPs)
    phi: Callable[[AttentionConfig, int], nn.Module] | None = None
    # Scalable-Softmax (Nakanishi 2025): the layer scales row i's queries by s_h log n_i, n_i the keys it sees
    length_scale: bool = False
    about: str = ""  # what it computes and after whom, one line (docs/model.md); empty: fn's docstring

    def __post_init__(self) -> None:
        if not self.about:
            object.__setattr__(self, "about", " ".join((self.fn.__doc__ or "").split()))

    def kind(self, a: AttentionConfig) -> str:
        """The kind of ``reported`` for this config: "probs", "sim_nonneg" or "sim_signed"."""
        kind = self.scores(a) if callable(self.scores) else self.scores
        return "sim_nonneg" if kind == "probs" and a.p != 1.0 else kind

    def matmul_weights(self, a: AttentionConfig, n_heads: int, head_dim: int) -> int:
        """Weights beyond W_QKV and W_O multiplied per token and layer: phi's matrices, on each head's q and k."""
        if self.phi is None:
            return 0
        with torch.device("meta"):
            phi = self.phi(a, head_dim)
        return 2 * n_heads * sum(w.numel() for w in phi.parameters() if w.ndim == 2)


OPS: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> None:
    """Add an operation; refuses a taken name or an entry that names what does not exist."""
    broken = {
        f"name {spec.name!r} is taken": spec.name in OPS,
        "fn is not callable": not callable(spec.fn),
        f"scores must be one of {', '.join(SCORE_KINDS)}": not callable(spec.scores) and spec.scores not in SCORE_KINDS,
        f"normalizers must be among {', '.join(NORMALIZERS)}": not set(spec.normalizers) <= set(NORMALIZERS),
        "normalizers is empty": not spec.normalizers,
        "about is empty (give fn a docstring)": not spec.about,
        f"tiles must be one of {', '.join(SIMILARITIES)}": spec.tiles is not None and spec.tiles not in SIMILARITIES,
        "sdpa and zero_logit need a softmax op": (spec.sdpa or spec.zero_logit) and not spec.softmax,
        "length_scale needs score_biases=False (a bias would escape the factor)": spec.length_scale
        and spec.score_biases,
    }
    if any(broken.values()):
        raise ValueError(f"attention op {spec.name!r}: " + "; ".join(msg for msg, bad in broken.items() if bad))
    OPS[spec.name] = spec


def op_spec(name: str) -> OpSpec:
    if name not in OPS:
        raise ValueError(f"unknown attention op {name!r}; registered: {', '.join(OPS)}")
    return OPS[name]


def build_feature_map(a: AttentionConfig, head_dim: int) -> nn.Module | None:
    phi = op_spec(a.op).phi
    return None if phi is None else phi(a, head_dim)


def blocked_spec(cfg: ModelConfig) -> AttentionSpec | None:
    """What pipeline.kernels computes for a layer of ``cfg``; None for an op without tiles."""
    a = cfg.attention
    tiles = op_spec(a.op).tiles
    if tiles is None:
        return None
    mask = MaskSpec(kind=cfg.mask, window=cfg.window, prefix=cfg.sink_tokens + cfg.prefix_len)
    return AttentionSpec(similarity=tiles, normalizer=a.normalizer, p=a.p, score_factor=cfg.head_dim**-0.5, mask=mask)


def proxy_label(a: AttentionConfig) -> str | None:
    """Which proxy scores the sink metrics read (section 7.4); None where the op reports its weights."""
    kind = op_spec(a.op).kind(a)
    return None if kind == "probs" else SCORE_KINDS[kind]


register(OpSpec(name="softmax", fn=softmax_op, scores="probs", softmax=True, p_norm=True, sdpa=True))
register(
    OpSpec(name="sigmoid", fn=sigmoid_op, scores="sim_nonneg", normalizers=NORMALIZERS, p_norm=True, tiles="sigmoid")
)
register(OpSpec(name="elu1", fn=elu1_op, scores="sim_nonneg", normalizers=NORMALIZERS, tiles="elu1"))
register(
    OpSpec(
        name="kernel",
        fn=kernel_op,
        scores=lambda a: "sim_nonneg" if a.feature_map == "elu1" else "sim_signed",
        normalizers=NORMALIZERS,
        tiles="identity",
        score_biases=False,
        phi=_feature_map,
    )
)
# beyond the paper: Gu et al. 2025, appendix A.3
register(
    OpSpec(
        name="softmax_off_by_one",
        fn=softmax_op,
        scores="probs",
        softmax=True,
        sdpa=True,
        zero_logit=True,
        about="Softmax with one more logit fixed at 0 in the denominator (Miller 2023).",
    )
)
register(OpSpec(name="clipped_softmax", fn=clipped_softmax_op, scores="probs", softmax=True))
# no tiles: softpick's denominator sums |e^x - 1|
register(OpSpec(name="softpick", fn=softpick_op, scores="probs"))
# the sink metrics read ReLU(s) / sum ReLU(s): the factor 1/n_i cancels
register(OpSpec(name="relu", fn=relu_op, scores="sim_nonneg"))
# a sink logit is added after the score factor
register(
    OpSpec(
        name="ssmax",
        fn=softmax_op,
        scores="probs",
        softmax=True,
        sdpa=True,
        score_biases=False,
        length_scale=True,
        about="Scalable-Softmax (Nakanishi 2025): softmax((s_h log n_i) q_i k_j / sqrt(d_h)).",
    )
)
