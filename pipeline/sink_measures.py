"""``SinkMeasures``: what one sink probe measures (``pipeline.probe`` fills it), as metrics and as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from torch import Tensor

from pipeline import metric_names as N
from pipeline import metrics, probe_metrics
from pipeline.flow import FlowMeasures
from pipeline.outliers import OutlierMeasures


@dataclass
class SinkMeasures:
    """Sink_1^ε and friends over all (sequence, layer, head) triples of a probe set."""

    sink1: float
    sink_star: dict[str, float]
    profile: list[float]
    alpha1: Tensor  # [L, H], mean over sequences
    # the registered metrics reduced over sequences, key -> [L] or [L, H], read as attributes (None: not measured)
    values: dict[str, Tensor]
    is_proxy: bool
    eps: float = metrics.DEFAULT_EPS
    n_sequences: int = 0
    seq_len: int = 0
    alpha_profile: list[float] = field(default_factory=list)  # mean α_1..α_P over sequences, layers, heads
    sink_token_massive_ratio: Tensor | None = None  # [L, n_extra_queries]: ‖h_sink_token‖ / mean ‖h_real‖
    # [L, 4]: cos(q_i, k_1), cos(q_i, k_j≥2), ‖q_i‖‖k_1‖, ‖q_i‖‖k_j≥2‖ (Figure 2 bottom)
    qk_decomposition: Tensor | None = None
    alpha1_all: Tensor | None = field(default=None, repr=False)  # [N, L, H]
    outliers: OutlierMeasures | None = None  # residual stream and linear-layer inputs (pipeline.outliers)
    flow: FlowMeasures | None = None  # information flow per layer (pipeline.flow)

    def __getattr__(self, name: str):
        if name in probe_metrics.REGISTRY:
            return self.__dict__.get("values", {}).get(name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def dormant(self) -> Tensor | None:
        """Bool [L, H]: α_1 > ε and an output below half its layer's mean (metrics.dormant_heads)."""
        return None if self.out_norm is None else metrics.dormant_heads(self.alpha1, self.out_norm, self.eps)

    @property
    def dormant_pct(self) -> float | None:
        return None if self.out_norm is None else 100.0 * self.dormant.double().mean().item()

    def head_metrics(self) -> dict[str, float]:
        """Per head ``heads/{entropy,out_norm,max_logit}_l{l}_h{h}`` and ``heads/dormant_pct``, where measured."""
        out = probe_metrics.head_metrics(self.values)
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
        return out | probe_metrics.to_metrics(self.values)

    def extreme_token_metrics(self) -> dict[str, float]:
        """Guo et al. 2024's extreme-token phenomena per layer, where measured (the ``extreme_token`` metrics)."""
        extreme = {k: v for k, v in self.values.items() if probe_metrics.REGISTRY[k].extreme_token}
        return probe_metrics.to_metrics(extreme)

    def to_json(self) -> dict:
        """A JSON-ready dict (lists, not tensors) of every field but ``alpha1_all``."""
        plain = lambda v: v.tolist() if isinstance(v, Tensor) else getattr(v, "to_json", lambda: v)()
        plain_fields = {
            f.name: plain(getattr(self, f.name)) for f in fields(self) if f.name not in ("alpha1_all", "values")
        }
        registered = {key: plain(getattr(self, key)) for key in probe_metrics.REGISTRY}
        return plain_fields | registered | {"dormant_pct": self.dormant_pct}
