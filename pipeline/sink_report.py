"""``SinkReport``: what one sink probe measures (``pipeline.probe`` fills it), as metrics and as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
from torch import Tensor

from pipeline import metric_names as N
from pipeline import metrics
from pipeline.flow import FlowReport
from pipeline.outliers import OutlierReport


@dataclass
class SinkReport:
    """Sink_1^ε and friends over all (sequence, layer, head) triples of a probe set."""

    sink1: float
    sink_star: dict[str, float]
    profile: list[float]
    alpha1: Tensor  # [L, H], mean over sequences
    massive_ratio: Tensor  # [L], mean over sequences of ‖h_1‖ / mean_{t≠1} ‖h_t‖
    is_proxy: bool
    eps: float = metrics.DEFAULT_EPS
    n_sequences: int = 0
    seq_len: int = 0
    alpha_profile: list[float] = field(default_factory=list)  # mean α_1..α_P over sequences, layers, heads
    key_norm_ratio: Tensor | None = None  # [L], mean over sequences and heads
    value_norm_ratio: Tensor | None = None  # [L]
    slot_massive_ratio: Tensor | None = None  # [L, n_query_slots]: ‖h_slot‖ / mean ‖h_real‖
    # [L, 4]: cos(q_i, k_1), cos(q_i, k_j≥2), ‖q_i‖‖k_1‖, ‖q_i‖‖k_j≥2‖ (Figure 2 bottom)
    qk_decomposition: Tensor | None = None
    alpha1_all: Tensor | None = field(default=None, repr=False)  # [N, L, H]
    entropy: Tensor | None = None  # [L, H] normalised row entropy, mean over sequences
    out_norm: Tensor | None = None  # [L, H] mean ‖A·V‖ per token, mean over sequences
    # activation outliers (pipeline.outliers): residual stream and linear-layer inputs
    outliers: OutlierReport | None = None
    # Guo et al. 2024's extreme-token phenomena: the attention sink (above), the residual-state peak
    # (massive_ratio), the value-state drain (value_norm_ratio: ‖v_1‖ / mean_{t≠1} ‖v_t‖) and, for a
    # probe given the trigger ids of a Bigram-Backcopy dataset, the active/dormant split: mean
    # attention on token 1 from trigger queries (active heads copy) and from the other queries i ≥ 2.
    bos_share_trigger: Tensor | None = None  # [L, H], mean over sequences
    bos_share_other: Tensor | None = None  # [L, H]
    max_logit: Tensor | None = None  # [L, H] largest admitted q·k/√d_h (metrics.max_attention_logit)
    flow: FlowReport | None = None  # information flow per layer (pipeline.flow)

    @property
    def dormant(self) -> Tensor | None:
        """Bool [L, H]: α_1 > ε and an output below half its layer's mean (metrics.dormant_heads)."""
        return None if self.out_norm is None else metrics.dormant_heads(self.alpha1, self.out_norm, self.eps)

    @property
    def dormant_pct(self) -> float | None:
        dormant = self.dormant
        return None if dormant is None else 100.0 * dormant.double().mean().item()

    def head_metrics(self) -> dict[str, float]:
        """Per head ``heads/{entropy,out_norm,max_logit}_l{l}_h{h}`` (0-based), ``heads/dormant_pct``; where measured."""
        out: dict[str, float] = {}
        heads = {N.HEAD_ENTROPY: self.entropy, N.HEAD_OUT_NORM: self.out_norm, N.HEAD_MAX_LOGIT: self.max_logit}
        for name, values in heads.items():
            if values is not None:
                out.update({N.head(name, l, h): float(v) for (l, h), v in np.ndenumerate(values.float().numpy())})
        if self.out_norm is not None:
            out[N.DORMANT_PCT] = self.dormant_pct
        return out

    def to_metrics(self) -> dict[str, float]:
        # mean alpha_1 over layers, heads and sequences: moves before Sink_1 crosses eps
        out = {N.SINK1: self.sink1, N.ALPHA1_MEAN: float(self.alpha1.mean())}
        out.update({N.sink_star(name): v for name, v in self.sink_star.items()})
        out.update({N.sink_k(k): v for k, v in enumerate(self.profile, start=1)})
        # mean alpha_k at later positions: where a fixed token sits at k > 1 (Table 10 right)
        out.update({N.alpha_k_mean(k): v for k, v in enumerate(self.alpha_profile[1:], start=2)})
        if self.outliers is not None:
            out.update(self.outliers.to_metrics())
        if self.flow is not None:
            out.update(self.flow.to_metrics())
        if self.max_logit is not None:  # attn/max_logit_l{l}: max over heads; attn/max_logit: over layers
            per_layer = self.max_logit.amax(dim=-1).tolist()
            out.update({N.layer(N.MAX_LOGIT, l): v for l, v in enumerate(per_layer)} | {N.MAX_LOGIT: max(per_layer)})
        return out | self.extreme_token_metrics()

    def extreme_token_metrics(self) -> dict[str, float]:
        """Per layer l (0-based): the residual-state peak ``act/massive_ratio_l{l}`` and, where
        measured, the value-state drain ``act/value_norm_ratio_l{l}`` and the BOS share by query
        kind ``sink/bos_share_trigger_l{l}``, ``sink/bos_share_other_l{l}`` (mean over heads)."""
        out = {}
        for name, values in (
            (N.MASSIVE_RATIO, self.massive_ratio),
            (N.VALUE_NORM_RATIO, self.value_norm_ratio),
            (N.BOS_SHARE_TRIGGER, self.bos_share_trigger),
            (N.BOS_SHARE_OTHER, self.bos_share_other),
        ):
            if values is not None:
                per_layer = values if values.dim() == 1 else values.mean(dim=-1)
                out.update({N.layer(name, l): float(v) for l, v in enumerate(per_layer)})
        return out

    def to_json(self) -> dict:
        """A JSON-ready record (lists, not tensors) of every field but ``alpha1_all``."""

        def plain(value):
            return value.tolist() if isinstance(value, Tensor) else getattr(value, "to_json", lambda: value)()

        record = {f.name: plain(getattr(self, f.name)) for f in fields(self) if f.name != "alpha1_all"}
        return record | {"dormant_pct": self.dormant_pct}
