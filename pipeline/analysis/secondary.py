"""`sinklab analyze`'s secondary-sink section (pipeline.secondary_sinks per layer) and its figure."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from pipeline import metric_names as N
from pipeline import plots
from pipeline import probe_metrics as P
from pipeline.analysis.inputs import ProbeSettings
from pipeline.metrics import split_extra
from pipeline.secondary_sinks import MIN_QUERIES, judged_keys, layer_stats

FIGURE = "secondary_sinks.png"
TOP_TOKENS = 10


@torch.no_grad()
def maps_and_states(subject, ids: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer the real-token attention [B, H, T, T] and block output [B, T, d]."""
    if subject.kind == "sinklab":
        out = subject.model(ids, output_attentions=True, output_hidden_states=True)
        maps = [split_extra(a.float(), out.n_extra_queries, out.n_extra_keys)[1] for a in out.attentions]
        return maps, [h[:, out.n_extra_queries :] for h in out.hidden_states]
    from pipeline.analysis.hf_capture import capture

    c = capture(subject.model, ids, qkv=False)
    return c.attentions, c.hidden_states


def secondary_section(subject, tokens: torch.Tensor, probe: ProbeSettings, out: Path | None, name: str) -> dict:
    """Per layer the secondary sinks, their attention share and norm ratio; the commonest sink tokens; the figure."""
    device = next(subject.model.parameters()).device
    n, layers = 0, None
    for start in range(0, tokens.shape[0], probe.batch_size):
        ids = tokens[start : start + probe.batch_size].to(device)
        maps, states = maps_and_states(subject, ids)
        stats = [layer_stats(a, probe.eps, 1, MIN_QUERIES, ids, h) for a, h in zip(maps, states)]
        if layers is None:
            layers = [{"count": 0.0, "share": 0.0, "norm": 0.0, "tokens": Counter()} for _ in stats]
        for acc, s in zip(layers, stats):
            found = sum(s.tokens.values())
            acc["count"] += s.count * len(ids)
            acc["share"] += s.share * len(ids)
            acc["norm"] += (s.norm_ratio or 0.0) * found
            acc["tokens"] += s.tokens
        n += len(ids)
    found = [sum(acc["tokens"].values()) for acc in layers]
    judged = judged_keys(tokens.shape[1], 1, MIN_QUERIES) > 0
    section = {
        "eps": probe.eps,
        "min_queries": MIN_QUERIES,
        "count": [acc["count"] / n if judged else None for acc in layers],
        "share": [acc["share"] / n if judged else None for acc in layers],
        "norm_ratio": [acc["norm"] / f if f else None for acc, f in zip(layers, found)],
    }
    if not judged:
        section["not_judged"] = (
            f"no key past the first is followed by the {MIN_QUERIES} queries that judge it at T = {tokens.shape[1]}; "
            f"-T {MIN_QUERIES + 1} or more judges them"
        )
    everywhere = sum((acc["tokens"] for acc in layers), Counter())
    text = (lambda t: subject.tokenizer.decode([t])) if subject.tokenizer is not None else str
    section["tokens"] = {text(t): c for t, c in everywhere.most_common(TOP_TOKENS)}
    # per layer: NaN where nothing could be judged, none where no sink was found to take a norm of
    names = {"count": N.SECONDARY_COUNT, "share": P.name("secondary_share"), "norm_ratio": N.SECONDARY_NORM}
    metrics = {
        N.layer(metric, l): float("nan") if v is None and not judged and key != "norm_ratio" else v
        for key, metric in names.items()
        for l, v in enumerate(section[key])
    }
    section["metrics"] = {k: v for k, v in metrics.items() if v is not None}
    if out is not None:
        layer_ids, nan = list(range(len(layers))), float("nan")
        norms = [(l, v) for l, v in enumerate(section["norm_ratio"]) if v is not None]
        panels = {
            "secondary sinks per head": {"natural": (layer_ids, [nan if v is None else v for v in section["count"]])},
            "their share of attention": {"natural": (layer_ids, [nan if v is None else v for v in section["share"]])},
        }
        if norms:
            panels["their ‖h_k‖ / mean ‖h_t‖"] = {"natural": tuple(zip(*norms))}
        plots.curve_panels(panels, out / FIGURE, f"{name}: secondary sinks (α_k > {probe.eps:g}, k > 1)")
    return section
