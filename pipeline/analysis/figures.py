"""`sinklab analyze`'s figures (docs/analysis.md lists them)."""

from __future__ import annotations

from pathlib import Path

from pipeline import plots
from pipeline.sink_measures import SinkMeasures


def write_plots(name: str, measures_of: dict[str, SinkMeasures], out: Path, eps: float, by: str) -> list[Path]:
    """The figures, each recorded as ``by``'s (the output marker's writer)."""
    profiles = {k: r.profile for k, r in measures_of.items()}
    paths = [plots.sink_profile(profiles, out / "sink_profile.png", f"{name}: Sink_k by position", eps, by)]
    for kind, measures in measures_of.items():
        panels = {key: getattr(measures, key) for key in ("entropy", "out_norm", "dormant", "max_logit")}
        title = f"{name} ({kind}): α₁ per layer and head"
        paths.append(plots.alpha1_heatmap(measures.alpha1, out / f"alpha1_{kind}.png", title, **panels, by=by))
    first = measures_of.get("natural") or next(iter(measures_of.values()))
    curves = {"hidden states": first.massive_ratio.tolist()}
    for label, t in (("keys", first.key_norm_ratio), ("values", first.value_norm_ratio)):
        if t is not None:
            curves[label] = t.tolist()
    paths.append(plots.norm_ratio_curves(curves, out / "norm_ratio.png", f"{name}: first-token ℓ2-norm ratio", by))
    if first.qk_decomposition is not None:
        title = f"{name}: QK decomposition"
        paths.append(plots.qk_decomposition(first.qk_decomposition, out / "qk_decomposition.png", title, by))
    if any(measures.flow is not None for measures in measures_of.values()):
        paths.append(flow_figure(name, measures_of, out / "flow.png", by))
    return paths


def flow_figure(name: str, measures_of: dict[str, SinkMeasures], path: Path, by: str) -> Path:
    """Per layer and input kind: the norm ratio, matrix entropy and over-mixing sensitivity (−1: the embeddings)."""
    panels = {"‖h₁‖ / mean ‖h_t≠1‖": {}, "matrix entropy (normalised)": {}, "over-mixing sensitivity": {}}
    for kind, measures in measures_of.items():
        if measures.flow is None:
            continue
        layers = list(range(len(measures.flow.entropy)))
        lead = [-1] if measures.flow.entropy_input is not None else []
        first = [measures.flow.norm_ratio_input] if lead else []
        panels["‖h₁‖ / mean ‖h_t≠1‖"][kind] = (lead + layers, first + measures.massive_ratio.tolist())
        entropy = ([measures.flow.entropy_input] if lead else []) + measures.flow.entropy.tolist()
        panels["matrix entropy (normalised)"][kind] = (lead + layers, entropy)
        if measures.flow.mixing is not None:
            panels["over-mixing sensitivity"][kind] = (layers, measures.flow.mixing.tolist())
    panels = {k: v for k, v in panels.items() if v}
    return plots.curve_panels(
        panels, path, f"{name}: information flow (layer −1: embeddings)", log_panels=panels, by=by
    )
