"""When the sink emerges during training, and each head's α_1 over the run, read from the run's
metrics.jsonl (docs/analysis.md, "During training"); the decisions are ``pipeline.metrics``'."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from pipeline import metric_names as N
from pipeline import metrics as M
from pipeline import probe_metrics as P
from pipeline.model.config import ModelConfig

from .summary import metric_rows


def probe_uniform_alpha1(cfg: ModelConfig, T: int) -> float:
    """α_1 of the first real token under uniform attention over what this model admits:
    its mask (causal, prefix, sliding window), its sink tokens and bias columns."""
    from pipeline.model.masks import admitted_with_extra

    return M.uniform_alpha1_masked(admitted_with_extra(cfg, T), cfg.sink_tokens, cfg.n_bias_slots + cfg.sink_tokens)


def emerged_so_far(
    metrics_path: Path, step: int, sink1: float, alpha1_mean: float, alpha1_uniform: float
) -> dict[str, int]:
    """Metric name -> step for every threshold crossed up to and including ``step``."""
    earlier = [row for row in metric_rows(metrics_path, N.SINK1, N.ALPHA1_MEAN) if row[0] < step]
    rows = earlier + [(step, sink1, alpha1_mean)]
    return {N.emerged_step(name): at for name, at in M.emergence_steps(rows, alpha1_uniform).items() if at is not None}


def step_metrics(
    alpha1: torch.Tensor, sink1: float, alpha1_mean: float, step: int, metrics_path: Path, alpha1_uniform: float
) -> dict[str, float]:
    """What a probe at ``step`` logs beyond ``SinkMeasures.to_metrics()``: per-head α_1, the
    uniform reference, and the emergence steps first reached at this very step."""
    out = {N.head(N.HEAD_ALPHA1, *at): float(alpha1[at]) for at in itertools.product(*map(range, alpha1.shape))}
    out[N.ALPHA1_UNIFORM] = alpha1_uniform
    for name, at in emerged_so_far(metrics_path, step, sink1, alpha1_mean, alpha1_uniform).items():
        # a resumed start probes its checkpoint's step again: what is logged there stays once
        if at == step and not any(row[0] == step for row in metric_rows(metrics_path, name)):
            out[name] = float(at)
    return out


def tags_of(logged: dict[str, float]) -> dict[str, str]:
    """The emergence entries of a metrics dict as MLflow tags (same names, integer steps)."""
    return {k: str(int(v)) for k, v in logged.items() if k.startswith(N.EMERGED_STEP)}


def head_trajectories(metrics_path: Path, n_layers: int, n_heads: int):
    """(steps, {(layer, head): [α_1 at each step]}) from metrics.jsonl, all starts of the run."""
    heads = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    rows = metric_rows(metrics_path, *(N.head(N.HEAD_ALPHA1, *h) for h in heads))
    return [row[0] for row in rows], {h: [row[1 + i] for row in rows] for i, h in enumerate(heads)}


def draw_trajectory(
    metrics_path: Path, n_layers: int, n_heads: int, path: Path, alpha1_uniform: float | None = None
) -> Path | None:
    """The per-head α_1 trajectory figure, or None before any probe was logged."""
    from pipeline.plots import alpha1_trajectories

    steps, series = head_trajectories(metrics_path, n_layers, n_heads)
    if not steps:
        return None
    return alpha1_trajectories(steps, series, path, "α₁ per layer and head over training", uniform=alpha1_uniform)


def draw_extreme_tokens(metrics_path: Path, n_layers: int, path: Path) -> Path | None:
    """Guo et al.'s joint dynamics of the extreme tokens from metrics.jsonl, or None before any probe."""
    from pipeline.plots import extreme_token_dynamics

    panels = (
        (
            "attention on token 1",
            {
                P.name("bos_share_other"): "BOS share, other queries",
                P.name("bos_share_trigger"): "BOS share, trigger queries",
            },
        ),
        ("‖v₁‖ / mean ‖vₜ‖ ratio (value-state drain)", {P.name("value_norm_ratio"): "‖v₁‖ ratio"}),
        ("‖h₁‖ / mean ‖hₜ‖ ratio (residual-state peak)", {P.name("massive_ratio"): "‖h₁‖ ratio"}),
    )
    keys = [N.SINK1] + [N.layer(name, layer) for _, names in panels for name in names for layer in range(n_layers)]
    rows = metric_rows(metrics_path, *keys)
    if not rows:
        return None
    column = {key: [row[1 + i] for row in rows] for i, key in enumerate(keys)}
    drawn = []
    for panel, names in panels:
        lines = {"Sink₁ / 100": [v / 100 for v in column[N.SINK1]]} if not drawn else {}
        for name, label in names.items():
            for layer in range(n_layers):
                values = column[N.layer(name, layer)]
                if any(v == v for v in values):  # NaN where the probe did not measure it
                    lines[f"{label}, layer {layer}"] = values
        if lines:
            drawn.append((panel, lines))
    title = "attention sink, value-state drain, residual-state peak"
    return extreme_token_dynamics([row[0] for row in rows], drawn, path, title)
