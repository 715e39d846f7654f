"""The probe's per-layer and per-head metrics, one registration each (docs/training.md, "The live probe").

A metric maps a :class:`ProbeBatch` to ``[B, L]`` or ``[B, L, H]`` (None: not measured); every reader reads
:data:`REGISTRY`, docs/training.md's table too. Adding a metric: a function below with its ``@register(...)``, then
``python -m tests.regen_probe_values`` and ``python -m tests.regen_docs_tables``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from pipeline import metric_names as N
from pipeline import metrics
from pipeline.outliers import token_kurtosis
from pipeline.secondary_sinks import MIN_QUERIES, attention_share

Reduce = Literal["mean", "nanmean", "max"]


@dataclass
class ProbeBatch:
    """One probe batch, its layers (one or more) on dim 1; real tokens only unless said otherwise."""

    maps: Tensor  # [B, L, H, T, S + T] the real queries' rows: extra keys first (proxy scores for a similarity op)
    admitted: Tensor  # [T, S + T] bool: what each real query may see
    n_extra_keys: int
    hidden: Tensor | None = None  # [B, L, T, d] block outputs
    queries: Tensor | None = None  # [B, L, H, T, dh] (rotated)
    keys: Tensor | None = None
    values: Tensor | None = None
    head_outputs: Tensor | None = None  # [B, L, H, T, dh]
    triggers: Tensor | None = None  # [B, T] bool: a Bigram-Backcopy probe's trigger queries
    qkv: bool = True  # whether the key and value norm ratios are measured
    logits: bool = False  # whether queries and keys give the largest pre-softmax logit

    @property
    def real(self) -> Tensor:
        """[B, L, H, T, T] the maps among real tokens."""
        return self.maps[..., self.n_extra_keys :]


@dataclass(frozen=True, kw_only=True)
class ProbeMetric:
    """One registered metric; its MLflow names are its namespace and key, so no other file spells them."""

    key: str
    """The report's attribute and JSON field: the function's name."""
    compute: Callable[[ProbeBatch], Tensor | None]
    """The function; the first line of its docstring is its row in docs/training.md."""
    per: Literal["layer", "head"]
    """What ``compute`` gives per sequence: ``[B, L]`` (layer) or ``[B, L, H]`` (head)."""
    over_sequences: Reduce = "mean"
    """The reduction over sequences, to ``[L]`` or ``[L, H]``."""
    namespace: str | None = None
    """Logged per layer as ``<namespace><key>_l{l}`` (a head metric reduced over heads); None: not per layer."""
    over_heads: Reduce = "mean"
    over_layers: Reduce | None = None
    """Also logged over layers as ``<namespace><key>`` by this reduction; None: not."""
    per_head: bool = False
    """Logged per head as ``heads/<key>_l{l}_h{h}`` (metrics.jsonl and images only: pipeline.tracking.views)."""
    extreme_token: bool = False
    """One of Guo et al. 2024's extreme-token phenomena (``SinkMeasures.extreme_token_metrics``)."""
    nan_when_unmeasured: bool = False
    """Reported as NaN per layer where a probe cannot measure it, so that every report has the column."""

    @property
    def name(self) -> str | None:
        """The MLflow name per layer without its ``_l{l}``, and over layers."""
        return None if self.namespace is None else self.namespace + self.key

    @property
    def head_name(self) -> str | None:
        return N.HEADS + self.key if self.per_head else None


REGISTRY: dict[str, ProbeMetric] = {}


def register(*, per: Literal["layer", "head"], **fields) -> Callable[[Callable], Callable]:
    """The decorator that registers the function below it under its own name, with ``ProbeMetric``'s fields."""

    def add(compute: Callable) -> Callable:
        metric = ProbeMetric(key=compute.__name__, compute=compute, per=per, **fields)
        if metric.key in REGISTRY:
            raise ValueError(f"probe metric {metric.key!r} is registered twice")
        if metric.namespace is not None and metric.namespace not in N.NAMESPACES:
            raise ValueError(f"probe metric {metric.key!r}: namespace {metric.namespace!r} is none of metric_names'")
        REGISTRY[metric.key] = metric
        return compute

    return add


def name(key: str) -> str:
    """The per-layer MLflow name (without ``_l{l}``) of registered metric ``key``."""
    if (found := REGISTRY[key].name) is None:
        raise ValueError(f"probe metric {key!r} is not logged per layer")
    return found


def reduce(values: Tensor, how: Reduce, dim: int) -> Tensor:
    return {"mean": Tensor.mean, "nanmean": Tensor.nanmean, "max": Tensor.amax}[how](values, dim=dim)


def _flat_heads(fn: Callable[..., Tensor], x: Tensor, *args) -> Tensor:
    """``fn`` of per-head ``[B, H', ...]`` inputs applied to ``x [B, L, H, ...]``: layers folded into heads."""
    return fn(x.flatten(1, 2), *args).unflatten(1, x.shape[1:3])


@register(per="head", over_sequences="nanmean", per_head=True)
def entropy(b: ProbeBatch) -> Tensor:
    """Normalised row entropy per head (metrics.attention_entropy)."""
    return metrics.attention_entropy(b.maps, b.admitted)


@register(per="head", per_head=True)
def out_norm(b: ProbeBatch) -> Tensor | None:
    """Mean ‖A·V‖ per token, per head (with dormant α₁: Guo et al.'s dormant heads)."""
    return None if b.head_outputs is None else metrics.head_output_norm(b.head_outputs)


@register(per="head", over_sequences="max", namespace=N.ATTN, over_heads="max", over_layers="max", per_head=True)
def max_logit(b: ProbeBatch) -> Tensor | None:
    """The largest admitted q·k/√d_h per head (metrics.max_attention_logit)."""
    if not b.logits or b.queries is None or b.keys is None:
        return None
    return metrics.max_attention_logit(b.queries, b.keys, b.admitted[:, b.n_extra_keys :])


@register(per="head", over_sequences="nanmean", namespace=N.SINK, extreme_token=True)
def bos_share_trigger(b: ProbeBatch) -> Tensor | None:
    """Guo et al. 2024's active/dormant split: attention on token 1 from a Bigram-Backcopy probe's trigger queries."""
    return None if b.triggers is None else _flat_heads(metrics.first_key_share, b.real, b.triggers)


@register(per="head", over_sequences="nanmean", namespace=N.SINK, extreme_token=True)
def bos_share_other(b: ProbeBatch) -> Tensor | None:
    """Guo et al.'s split again: attention on token 1 from the other queries i ≥ 2."""
    return None if b.triggers is None else _flat_heads(metrics.first_key_share, b.real, ~b.triggers)


@register(per="layer", namespace=N.ACT, extreme_token=True, nan_when_unmeasured=True)
def massive_ratio(b: ProbeBatch) -> Tensor | None:
    """Guo et al.'s residual-state peak: ‖h_1‖ / mean_{t≠1} ‖h_t‖ per layer."""
    return None if b.hidden is None else metrics.first_token_norm_ratio(b.hidden)


@register(per="layer")
def key_norm_ratio(b: ProbeBatch) -> Tensor | None:
    """‖k_1‖ / mean_{t≠1} ‖k_t‖, mean over heads."""
    return None if b.keys is None or not b.qkv else metrics.first_token_norm_ratio(b.keys).mean(dim=2)


@register(per="layer", namespace=N.ACT, extreme_token=True)
def value_norm_ratio(b: ProbeBatch) -> Tensor | None:
    """Guo et al.'s value-state drain: ‖v_1‖ / mean_{t≠1} ‖v_t‖, mean over heads."""
    return None if b.values is None or not b.qkv else metrics.first_token_norm_ratio(b.values).mean(dim=2)


@register(per="layer", namespace=N.ACT, over_layers="mean")
def kurtosis_first(b: ProbeBatch) -> Tensor | None:
    """Kaul et al. 2025's κ_{m,1}: the first token's kurtosis over its d channels (Table 2)."""
    return None if b.hidden is None else token_kurtosis(b.hidden[:, :, 0])


@register(per="layer", namespace=N.ACT, over_layers="mean")
def kurtosis_rest(b: ProbeBatch) -> Tensor | None:
    """Kaul et al. 2025's κ_{m,>1}: the other tokens' kurtosis over their d channels, their mean."""
    return None if b.hidden is None else token_kurtosis(b.hidden[:, :, 1:]).mean(dim=-1)


@register(per="head", namespace=N.SINK, over_layers="mean")
def secondary_share(b: ProbeBatch) -> Tensor:
    """Attention share of each head's secondary sinks (α_k > ε at k > 1; pipeline.secondary_sinks)."""
    return attention_share(b.real, metrics.DEFAULT_EPS, 1, MIN_QUERIES)


def head_names() -> tuple[str, ...]:
    return tuple(m.head_name for m in REGISTRY.values() if m.head_name)


def to_metrics(values: dict[str, Tensor]) -> dict[str, float]:
    """Reduced ``values`` (key -> ``[L]`` or ``[L, H]``) as MLflow names, per layer and over layers."""
    out: dict[str, float] = {}
    for key, v in values.items():
        if (m := REGISTRY[key]).name is None:
            continue
        per_layer = reduce(v.float(), m.over_heads, -1) if m.per == "head" else v.float()
        out.update({N.layer(m.name, l): float(x) for l, x in enumerate(per_layer)})
        if m.over_layers is not None:
            out[m.name] = float(reduce(per_layer, m.over_layers, 0))
    return out


def head_metrics(values: dict[str, Tensor]) -> dict[str, float]:
    """Per head ``<head_name>_l{l}_h{h}`` (0-based) of the head metrics that have one."""
    out: dict[str, float] = {}
    for key, v in values.items():
        if (name := REGISTRY[key].head_name) is not None:
            out.update({N.head(name, l, h): x for l, row in enumerate(v.tolist()) for h, x in enumerate(row)})
    return out


def measure(batch: ProbeBatch) -> dict[str, Tensor]:
    """Every registered metric measured on ``batch``: key -> per-sequence values, on the CPU."""
    values = {key: m.compute(batch) for key, m in REGISTRY.items()}
    return {key: v.detach().float().cpu() for key, v in values.items() if v is not None}


def reduced(rows: dict[str, list[Tensor]]) -> dict[str, Tensor]:
    return {k: reduce(torch.cat(v), REGISTRY[k].over_sequences, 0) for k, v in rows.items() if v}
