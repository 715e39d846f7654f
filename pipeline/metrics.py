"""Attention-sink and activation metrics: pure functions over tensors (torch only).

Conventions (Gu et al. 2025, section 3.2): an attention map ``A`` has shape ``[..., T, T]`` with
rows = queries and columns = keys, causal. Positions ``k`` are 1-based as in the paper.
Leading extra rows and columns (learnable sink tokens; the slots: K/KV bias, sink logit) are split off with
:func:`split_extra` before the real-token metrics are formed, so ``Sink_1`` always refers to
the first *real* token.
"""

from __future__ import annotations

import math
import statistics

import torch
from torch import Tensor

DEFAULT_EPS = 0.3


def importance(attn: Tensor, k: int) -> Tensor:
    """α_k = 1/(T−k+1) · Σ_{i=k..T} A_{i,k} for ``attn [..., T, T]``; ``k`` is 1-based."""
    if not 1 <= k <= attn.shape[-1]:
        raise ValueError(f"position k={k} outside 1..{attn.shape[-1]}")
    return importance_profile(attn, k)[..., k - 1]


def importance_profile(attn: Tensor, positions: int | None = None) -> Tensor:
    """α_1..α_P on a new last dim, every key's without ``positions``: ``[..., T, T] -> [..., P]``."""
    T = attn.shape[-1]
    if attn.shape[-2] != T:
        raise ValueError(f"importance needs square [..., T, T] maps, got {tuple(attn.shape)}")
    P = T if positions is None else min(positions, T)
    seen = torch.ones(T, P, dtype=torch.bool, device=attn.device).tril()  # query i sees key k <= i
    received = attn[..., :P].masked_fill(~seen, 0).sum(dim=-2)
    return received / torch.arange(T, T - P, -1, device=attn.device, dtype=received.dtype)


def sink_rate(alpha: Tensor, eps: float = DEFAULT_EPS) -> float:
    """Percent of entries of ``alpha`` strictly above ``eps``: Sink_k^ε over the (sequence, layer, head) entries."""
    if alpha.numel() == 0:
        raise ValueError("sink_rate of an empty tensor")
    return 100.0 * (alpha > eps).double().mean().item()


def split_extra(attn: Tensor, n_extra_queries: int, n_extra_keys: int) -> tuple[Tensor, Tensor]:
    """Separate sink tokens and slots from real tokens: ``attn [..., n_extra_queries + T, n_extra_keys + T]`` ->
    ``(extra_mass [..., T, S], real [..., T, T])``, S = n_extra_keys, the real queries' rows only;
    ``extra_mass[..., i, s]`` is the attention query ``i`` gives extra key ``s``, ``real`` the real block."""
    rows = attn[..., n_extra_queries:, :]
    extra_mass, real = rows[..., :n_extra_keys], rows[..., n_extra_keys:]
    if real.shape[-1] != real.shape[-2]:
        raise ValueError(
            f"after removing {n_extra_queries} query / {n_extra_keys} extra keys the map is "
            f"{tuple(real.shape[-2:])}, not square: extra counts do not match the attention shape"
        )
    return extra_mass, real


def extra_importance(extra_mass: Tensor) -> Tensor:
    """Sink_* importance of each extra key (slot or sink token): mean over all real queries of the mass given to it.
    ``[..., T, S] -> [..., S]`` (every query sees every extra key, so the mean runs over all T)."""
    return extra_mass.mean(dim=-2)


def proxy_scores(sim: Tensor, signed: bool) -> Tensor:
    """Proxy attention scores for attention without softmax (Gu et al. 2025, section 7.4): ``sim / Σ_j sim`` for
    non-negative similarities (sigmoid, elu+1), ``|sim| / Σ_j |sim|`` where they can be negative (identity, MLP
    kernels). Masked entries must be 0 (non-finite counts as 0); a row of zeros stays all 0."""
    s = torch.nan_to_num(sim.float(), nan=0.0, posinf=0.0, neginf=0.0)
    if signed:
        s = s.abs()
    elif (s < 0).any():
        raise ValueError("proxy_scores(signed=False) got negative similarities; use signed=True")
    z = s.sum(dim=-1, keepdim=True)
    return torch.where(z > 0, s / z.clamp_min(torch.finfo(s.dtype).tiny), torch.zeros_like(s))


def first_token_norm_ratio(x: Tensor) -> Tensor:
    """‖x_1‖₂ / mean_{t≠1} ‖x_t‖₂ for ``x [..., T, d]`` -> ``[...]``."""
    if x.shape[-2] < 2:
        raise ValueError("the norm ratio needs at least 2 tokens")
    norms = x.float().norm(dim=-1)
    return norms[..., 0] / norms[..., 1:].mean(dim=-1)


def qk_decomposition(queries: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
    """Split q_i·k_j = ‖q_i‖‖k_j‖ cos(q_i, k_j) (Gu et al. 2025, Figure 2 bottom): ``queries, keys [..., T, dh]``
    (rotated) -> ``(cosine, norm_product)``, each ``[..., T, T]`` with the non-causal entries (j > i) NaN."""
    qn, kn = queries.float().norm(dim=-1), keys.float().norm(dim=-1)
    dots = queries.float() @ keys.float().transpose(-1, -2)
    norm_product = qn.unsqueeze(-1) * kn.unsqueeze(-2)
    cosine = dots / norm_product.clamp_min(1e-12)
    future = ~causal_admitted(queries.shape[-2], queries.shape[-2], queries.device)
    return cosine.masked_fill(future, math.nan), norm_product.masked_fill(future, math.nan)


def first_key_vs_rest(matrix: Tensor) -> tuple[float, float]:
    """Mean of a causal ``[..., T, T]`` matrix (NaN above the diagonal) on key 1 for queries
    i ≥ 2, and over all other causal pairs j ≥ 2: the two bars of Figure 2 bottom."""
    return torch.nanmean(matrix[..., 1:, 0]).item(), torch.nanmean(matrix[..., 1:, 1:]).item()


# ---- active and dormant heads (Guo et al. 2024) ---------------------------------------------

DORMANT_OUTPUT_RATIO = 0.5


def causal_admitted(n_queries: int, n_keys: int, device=None) -> Tensor:
    """Bool [Tq, Tk]: the last Tq key columns causal, every leading column (a slot or sink token) seen by
    every query. The default pattern of :func:`attention_entropy`."""
    offset = n_keys - n_queries
    return torch.arange(n_keys, device=device)[None, :] <= torch.arange(n_queries, device=device)[:, None] + offset


def attention_entropy(attn: Tensor, admitted: Tensor | None = None) -> Tensor:
    """Normalised row entropy of ``attn [..., Tq, Tk]`` -> ``[...]``: row i, scaled to sum 1, has entropy
    H_i = −Σ_j p_ij log p_ij over the n_i keys ``admitted [Tq, Tk]`` lets it see (default :func:`causal_admitted`);
    the mean of H_i / log n_i over the rows with n_i ≥ 2 and some mass (0: one key takes all, 1: even; NaN: no row)."""
    a = torch.nan_to_num(attn.float(), nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0)
    n_queries, n_keys = a.shape[-2:]
    if admitted is None:
        admitted = causal_admitted(n_queries, n_keys, a.device)
    if admitted.shape != (n_queries, n_keys):
        raise ValueError(f"admitted has shape {tuple(admitted.shape)}; the maps are [..., {n_queries}, {n_keys}]")
    a = a * admitted.to(a.device)
    mass = a.sum(dim=-1)
    p = a / mass.clamp_min(torch.finfo(a.dtype).tiny).unsqueeze(-1)
    h = torch.special.entr(p).sum(dim=-1)  # −p log p, 0 at p = 0
    n = admitted.sum(dim=-1).to(a.device)
    valid = (n >= 2) & (mass > 0)
    normalised = torch.where(valid, h / n.clamp_min(2).double().log().float(), torch.zeros_like(h))
    return normalised.sum(dim=-1) / valid.sum(dim=-1)


def max_attention_logit(queries: Tensor, keys: Tensor, admitted: Tensor | None = None) -> Tensor:
    """The largest pre-softmax logit q_i·k_j/√d_h over the pairs ``admitted [T, T]`` lets a query
    see (default causal), per sequence and head: ``[B, H, T, dh] x2 -> [B, H]`` (QK-clip's
    quantity; positional biases and the op's own factor are not part of it)."""
    q, k = queries.float(), keys.float()
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if admitted is None:
        admitted = causal_admitted(*logits.shape[-2:], logits.device)
    return logits.masked_fill(~admitted.to(logits.device), float("-inf")).amax(dim=(-2, -1))


def head_output_norm(head_out: Tensor) -> Tensor:
    """Mean over tokens of ‖o_t‖₂, the head's output (A·V) at token t: ``[..., T, dh] -> [...]``."""
    return head_out.float().norm(dim=-1).mean(dim=-1)


def dormant_heads(alpha1: Tensor, out_norm: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """Bool [L, H]: heads that park on the first token (α_1 > ε) and whose output norm is below
    ``DORMANT_OUTPUT_RATIO`` × the mean output norm of the heads of their layer."""
    if alpha1.shape != out_norm.shape or alpha1.dim() != 2:
        raise ValueError(f"alpha1 {tuple(alpha1.shape)} and out_norm {tuple(out_norm.shape)} must both be [L, H]")
    relative = out_norm / out_norm.mean(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    return (alpha1 > eps) & (relative < DORMANT_OUTPUT_RATIO)


def first_key_share(attn: Tensor, queries: Tensor) -> Tensor:
    """Mean attention A_{i,1} on the first key over the queries i ≥ 2 that ``queries [B, T]``
    (bool) selects: ``attn [B, H, T, T] -> [B, H]``, NaN for a sequence that selects none.
    Guo et al.'s active/dormant split: trigger queries (active) against the others (dormant)."""
    chosen = queries.to(attn.device).clone()
    chosen[:, 0] = False  # query 1 sees only key 1
    weight = chosen[:, None, :].to(attn.dtype)
    total, n = (attn[..., :, 0] * weight).sum(dim=-1), weight.sum(dim=-1)
    return torch.where(n > 0, total / n.clamp_min(1.0), torch.full_like(total, float("nan")))


# ---- uniform reference and emergence --------------------------------------------------------


def uniform_alpha1_masked(admitted: Tensor, n_extra_queries: int = 0, n_extra_keys: int = 0) -> float:
    """α_1 of the first real token when every query spreads its attention evenly over the keys ``admitted [Q, K]``
    lets it see (slots and sink tokens included, as :func:`split_extra` lays them out)."""
    allowed = admitted.double()
    counts = allowed.sum(dim=-1, keepdim=True)
    if (counts == 0).any():
        raise ValueError("uniform_alpha1_masked: a query row admits no key")
    _, real = split_extra(allowed / counts, n_extra_queries, n_extra_keys)
    return importance(real, 1).item()


def first_step_above(history, threshold: float) -> int | None:
    """The first step of ``history`` ((step, value) pairs, any order) whose value is strictly above ``threshold``
    (NaN never is), or None."""
    return min((step for step, value in history if value > threshold), default=None)  # NaN is above nothing


# Emergence thresholds: Sink_1 above 1 % and 10 %, mean α_1 above 1.25 x uniform.
EMERGENCE_SINK1 = {"sink1_1pct": 1.0, "sink1_10pct": 10.0}
EMERGENCE_ALPHA1 = {"alpha1_125pct": 1.25}


def emergence_steps(history, alpha1_uniform: float) -> dict[str, int | None]:
    """When the sink emerged, from ``history`` rows (step, Sink_1 in %, mean α_1): threshold name -> the first step
    strictly above it (None where it never was)."""
    rows = list(history)
    sink1, alpha1 = [(r[0], r[1]) for r in rows], [(r[0], r[2]) for r in rows]
    out = {name: first_step_above(sink1, limit) for name, limit in EMERGENCE_SINK1.items()}
    return out | {name: first_step_above(alpha1, f * alpha1_uniform) for name, f in EMERGENCE_ALPHA1.items()}


def memorising(history, rise: float = 0.03, after: int = 2) -> str | None:
    """The warning to print where a validation loss turned upward for good: ``after`` or more evaluations came after
    its minimum and the last is ``rise`` (relative) above it; else None. ``history``: (step, value), NaN skipped."""
    rows = sorted((int(step), float(value)) for step, value in history if value == value)
    if len(rows) <= after:
        return None
    best = min(range(len(rows)), key=lambda i: rows[i][1])
    (step, low), (last_step, last) = rows[best], rows[-1]
    if len(rows) - 1 - best < after or last < low * (1 + rise):
        return None
    return (
        f"valid loss rising since step {step} (min {low:.3f} at {step}, {last:.3f} at {last_step}): "
        "the model memorises its data; more data or fewer steps"
    )


# ---- rank agreement with the paper ----------------------------------------------------------


def average_ranks(values) -> list[float]:
    """1-based ranks of ``values``, ties sharing the mean of their ranks ([10, 20, 20, 30] -> [1, 2.5, 2.5, 4])."""
    values = [float(v) for v in values]
    return [sum(w < v for w in values) + (sum(w == v for w in values) + 1) / 2 for v in values]


def _paired(x, y) -> tuple[list[float], list[float]]:
    pairs = [(float(a), float(b)) for a, b in zip(x, y, strict=True) if None not in (a, b) and a == a and b == b]
    return [a for a, _ in pairs], [b for _, b in pairs]


def spearman_rho(x, y) -> float | None:
    """Spearman's ρ: the Pearson correlation of the average ranks of the pairs where both values
    are known. None (undefined) with fewer than 2 pairs or when either side is constant."""
    try:
        return statistics.correlation(*map(average_ranks, _paired(x, y)))
    except statistics.StatisticsError:
        return None


def kendall_tau_b(x, y) -> float | None:
    """Kendall's τ-b over the pairs where both values are known:
    (concordant − discordant) / √((n0 − ties in x)(n0 − ties in y)), n0 = n(n−1)/2 and the tie
    counts being the pairs tied in that variable. None with fewer than 2 pairs or a constant side."""
    xs, ys = (torch.tensor(v, dtype=torch.float64) for v in _paired(x, y))
    dx, dy = (xs[:, None] - xs).sign(), (ys[:, None] - ys).sign()  # over ordered pairs: each pair twice
    untied = dx.count_nonzero().item() * dy.count_nonzero().item()
    return (dx * dy).sum().item() / math.sqrt(untied) if untied else None
