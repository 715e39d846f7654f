"""PNG figures in the style of Gu et al. 2025: α_1 heat maps (Figures 19-24), per-layer norm ratios
(Figures 2 top, 7, 8), Sink_k by position (Figure 5 middle), the QK decomposition (Figure 2 bottom),
per-head α_1, Guo et al.'s extreme-token dynamics and panels of curves (information flow, loss by
position). Each function writes one file atomically as ``by``'s (sinklab_io.outputs) and returns its path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import Normalize, TwoSlopeNorm  # noqa: E402

from sinklab_io.outputs import output_path  # noqa: E402

Curves = Mapping[str, Sequence[float]]


def _save(fig, path: str | Path, by: str = "sinklab") -> Path:
    path = Path(path)
    try:
        with output_path(path, by) as tmp:
            fig.savefig(tmp, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def _matrix(values) -> list[list[float]]:
    return [list(map(float, row)) for row in values]


def _map_size(n_layers: int, n_heads: int) -> tuple[float, float]:
    return max(4.0, 0.35 * n_heads + 2), max(3.0, 0.25 * n_layers + 1.5)


def _layer_head_axes(ax, data: list[list[float]], fmt: str, **text) -> None:
    """Head and layer ticks of a layer × head panel, its values written in where the map is small."""
    n_layers, n_heads = len(data), len(data[0])
    if n_layers * n_heads <= 64:
        for layer, row in enumerate(data):
            for head, value in enumerate(row):
                ax.text(head, layer, f"{value:{fmt}}", ha="center", va="center", fontsize=7, **text)
    ax.set_xlabel("head")
    ax.set_xticks(range(0, n_heads, max(1, n_heads // 16)))
    ax.set_yticks(range(0, n_layers, max(1, n_layers // 16)))


def alpha1_heatmap(
    alpha1,
    path: str | Path,
    title: str = "",
    entropy=None,
    out_norm=None,
    dormant=None,
    uniform: float | None = None,
    max_logit=None,
    by: str = "sinklab",
) -> Path:
    """Layer × head map of the first token's importance α_1 (mean over sequences), with a panel each of
    ``entropy`` / ``out_norm`` / ``max_logit`` ([L, H]) beside it and ``dormant`` (bool [L, H]) crossed on
    every panel; with ``uniform`` (α_1 under uniform attention) the α_1 colour map is diverging, white there."""
    diverging = uniform is not None and 0.0 < uniform < 1.0
    colours = TwoSlopeNorm(vmin=0.0, vcenter=uniform, vmax=1.0) if diverging else Normalize(0.0, 1.0)
    label = f"α₁ (white: uniform {uniform:.3f})" if uniform else "α₁"
    panels = [(label, _matrix(alpha1), "RdBu_r" if uniform else "viridis", colours)]
    if entropy is not None:
        panels.append(("row entropy / log n", _matrix(entropy), "magma", Normalize(0.0, 1.0)))
    if out_norm is not None:
        panels.append(("mean ‖A·V‖ per token", _matrix(out_norm), "cividis", Normalize()))
    if max_logit is not None:
        panels.append(("max q·k/√d_h", _matrix(max_logit), "inferno", Normalize()))
    width, height = _map_size(len(panels[0][1]), len(panels[0][1][0]))
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), height), squeeze=False, layout="constrained")
    crossed = _matrix(dormant) if dormant is not None else []
    marks = [(h, layer) for layer, row in enumerate(crossed) for h, v in enumerate(row) if v]
    for ax, (label, data, cmap, colours) in zip(axes[0], panels):
        im = ax.imshow(data, aspect="auto", cmap=cmap, origin="lower", norm=colours)
        _layer_head_axes(ax, data, ".2f")
        if marks:
            ax.scatter(*zip(*marks), marker="x", color="red", s=18, linewidths=1.0, label="dormant")
        fig.colorbar(im, ax=ax, label=label)
    axes[0][0].set(ylabel="layer", title=title or "importance of the first token α₁")
    for ax, (label, *_rest) in zip(axes[0][1:], panels[1:]):
        ax.set_title(label + (" (x: dormant)" if marks else ""))
    return _save(fig, path, by)


def head_map(values, path: str | Path, title: str, label: str) -> Path:
    """One layer × head panel of ``values [L, H]``."""
    data = _matrix(values)
    fig, ax = plt.subplots(figsize=_map_size(len(data), len(data[0])), layout="constrained")
    im = ax.imshow(data, aspect="auto", cmap="inferno", origin="lower")
    _layer_head_axes(ax, data, ".1f", color="cyan")
    ax.set(ylabel="layer", title=title)
    fig.colorbar(im, ax=ax, label=label)
    return _save(fig, path)


def norm_ratio_curves(curves: Curves, path: str | Path, title: str = "", by: str = "sinklab") -> Path:
    """One line per quantity: ‖x_1‖ / mean_{t≠1} ‖x_t‖ against the layer index."""
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for label, values in curves.items():
        ax.plot(range(1, len(values) + 1), [float(v) for v in values], marker="o", markersize=3, label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set(yscale="log", xlabel="layer l", ylabel="‖x₁‖ / mean ‖x_t≠1‖", title=title or "first-token norm ratio")
    ax.legend()
    return _save(fig, path, by)


def sink_profile(profiles: Curves, path: str | Path, title: str = "", eps: float = 0.3, by: str = "sinklab") -> Path:
    """Sink_k^ε for k = 1..P, one bar group per input kind."""
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    n = max(1, len(profiles))
    width = 0.8 / n
    for i, (label, values) in enumerate(profiles.items()):
        xs = [k + (i - (n - 1) / 2) * width for k in range(1, len(values) + 1)]
        ax.bar(xs, [float(v) for v in values], width=width, label=label)
    ax.set(xlabel="token position k", ylabel=f"Sink_k (%) , ε={eps}", ylim=(0, 100))
    ax.set_title(title or "attention sink by position")
    ax.legend()
    return _save(fig, path, by)


def qk_decomposition(rows, path: str | Path, title: str = "", by: str = "sinklab") -> Path:
    """Per layer: cos(q, k_1) vs cos(q, k_other) and ‖q‖‖k_1‖ vs ‖q‖‖k_other‖."""
    rows = _matrix(rows)
    layers = range(1, len(rows) + 1)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, first, ylabel in zip(axes, (0, 2), ("mean cos(q_t, k_j)", "mean ‖q_t‖·‖k_j‖")):
        ax.plot(layers, [r[first] for r in rows], marker="o", markersize=3, label="first token")
        ax.plot(layers, [r[first + 1] for r in rows], marker="o", markersize=3, label="other tokens")
        ax.set(ylabel=ylabel, xlabel="layer l")
        ax.legend()
    fig.suptitle(title or "QK decomposition")
    return _save(fig, path, by)


def alpha1_trajectories(
    steps: Sequence[int],
    series: Mapping[tuple[int, int], Sequence[float]],
    path: str | Path,
    title: str = "",
    uniform: float | None = None,
) -> Path:
    """α_1 of each (layer, head) against the step, coloured by layer, with uniform (and 1.25 x it) dashed."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    layers = sorted({layer for layer, _ in series})
    cmap = plt.get_cmap("viridis", max(2, len(layers)))
    lowest_head = {layer: head for layer, head in sorted(series, reverse=True)}  # the one that names its layer
    for (layer, head), values in sorted(series.items()):
        colour = cmap(layers.index(layer) / max(1, len(layers) - 1))
        label = f"layer {layer}" if head == lowest_head[layer] else None
        ys = [float(v) for v in values]
        ax.plot(list(steps), ys, color=colour, linewidth=1.0, alpha=0.8, marker="o", markersize=2, label=label)
        if len(series) <= 64 and ys:  # each line named at its end
            ax.annotate(
                f"l{layer}h{head}",
                (steps[-1], ys[-1]),
                fontsize=6,
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                color=colour,
            )
    if uniform is not None:
        ax.axhline(uniform, color="grey", linewidth=0.8, linestyle="--", label=f"uniform {uniform:.3f}")
        ax.axhline(1.25 * uniform, color="grey", linewidth=0.8, linestyle=":", label="1.25 x uniform")
    ax.set(xlabel="step", ylabel="α₁ (mean over probe sequences)", title=title or "α₁ per layer and head over training")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def extreme_token_dynamics(
    steps: Sequence[int], panels: Sequence[tuple[str, Curves]], path: str | Path, title: str = ""
) -> Path:
    """Guo et al.'s (2024) extreme-token dynamics over training, one panel each (``panels``: (title, {label: values
    at ``steps``})); a panel of ratios carries the no-peak reference 1 dashed."""
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(7.0, 2.3 * len(panels) + 0.6), sharex=True, squeeze=False, layout="constrained"
    )
    for ax, (label, lines) in zip(axes[:, 0], panels):
        for name, values in lines.items():
            ax.plot(list(steps), [float(v) for v in values], marker="o", markersize=2, linewidth=1.2, label=name)
        if "ratio" in label:
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_title(label, fontsize=9, loc="left")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, ncol=2)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title or "extreme-token phenomena over training")
    return _save(fig, path)


def survey_figure(
    bars: Mapping[str, Mapping[str, float]],
    curves: Mapping[tuple[str, bool], Sequence[float]],
    eps_values: Sequence[float],
    path: str | Path,
    eps: float = 0.3,
    curve_input: str = "natural",
    by: str = "sinklab",
) -> Path:
    """Left: Sink_1^ε per model, one bar per input column (``<input>_bos`` hatched); right: Sink_1 against ε for
    ``curve_input``, one colour per model, dashed with BOS (``curves[(model, bos)]`` over ``eps_values``)."""
    models = list(bars)
    columns = list(dict.fromkeys(c for cells in bars.values() for c in cells))
    fig, (ax_bar, ax_eps) = plt.subplots(
        1, 2, figsize=(max(10.0, 3.0 + 1.6 * len(models) * max(1, len(columns)) / 3), 4.0)
    )
    width = 0.8 / max(1, len(columns))
    palette = plt.get_cmap("tab10")
    kinds = list(dict.fromkeys(c.removesuffix("_bos") for c in columns))
    for i, col in enumerate(columns):
        xs = [m + (i - (len(columns) - 1) / 2) * width for m in range(len(models))]
        heights = [float(bars[m].get(col, float("nan"))) for m in models]
        colour = palette(kinds.index(col.removesuffix("_bos")))
        hatch = "//" if col.endswith("_bos") else None  # the BOS columns
        ax_bar.bar(
            xs, heights, width=width, color=colour, hatch=hatch, edgecolor="white", label=col.replace("_bos", " +BOS")
        )
    ax_bar.set_xticks(range(len(models)), models, rotation=20 if len(models) > 3 else 0)
    ax_bar.set(ylabel=f"Sink₁ (%), ε={eps}", ylim=(0, 100), title="attention sink by model and input")
    ax_bar.legend(fontsize=7, ncol=min(3, len(columns)), loc="upper center", bbox_to_anchor=(0.5, -0.12))
    for (model, bos), values in curves.items():
        ax_eps.plot(
            list(eps_values),
            [float(v) for v in values],
            color=palette(models.index(model) % 10),
            linestyle="--" if bos else "-",
            marker="o",
            markersize=3,
            label=model + (" +BOS" if bos else ""),
        )
    ax_eps.axvline(eps, color="grey", linewidth=0.8, linestyle=":")
    ax_eps.set(xlabel="threshold ε", ylabel="Sink₁ (%)", ylim=(0, 100), title=f"Sink₁ against ε ({curve_input} input)")
    ax_eps.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    return _save(fig, path, by)


def passkey_heatmap(
    table: Mapping[str, Mapping[float, Mapping[str, float]]], path: str | Path, title: str = "", by: str = "sinklab"
) -> Path:
    """Passkey accuracy (``table[cache][depth]``: ``accuracy`` and ``cached``, both %) by cache and depth; † marks a
    cell whose key had left the cache in some trial."""
    caches = list(table)
    depths = list(next(iter(table.values())))
    data = [[table[c][d]["accuracy"] for d in depths] for c in caches]
    fig, ax = plt.subplots(
        figsize=(max(4.0, 0.9 * len(depths) + 2.5), max(2.5, 0.5 * len(caches) + 1.5)), layout="constrained"
    )
    im = ax.imshow(data, aspect="auto", cmap="RdYlGn", vmin=0.0, vmax=100.0)
    for i, cache in enumerate(caches):
        for j, depth in enumerate(depths):
            mark = "" if table[cache][depth]["cached"] >= 100 else "†"
            ax.text(j, i, f"{data[i][j]:.0f}{mark}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_yticks(range(len(caches)), caches)
    ax.set(xlabel="depth of the key (0: start, 1: end)", ylabel="cache x+y")
    fig.colorbar(im, ax=ax, label="accuracy (%)")
    ax.set_title(title or "passkey retrieval", fontsize=9)
    if any(c["cached"] < 100 for row in table.values() for c in row.values()):
        ax.text(0.0, -0.3, "†: the key had left the cache when the answer began", transform=ax.transAxes, fontsize=7)
    return _save(fig, path, by)


def curve_panels(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    path: str | Path,
    title: str = "",
    xlabel: str = "layer l",
    log_panels: Sequence[str] = (),
    by: str = "sinklab",
) -> Path:
    """Side-by-side panels, one per quantity (``panels[name][label] = (xs, ys)``), ``log_panels`` on a log y axis."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False, layout="constrained")
    for ax, (name, curves) in zip(axes[0], panels.items()):
        for label, (xs, ys) in curves.items():
            ax.plot(list(xs), [float(y) for y in ys], marker="o", markersize=3, label=label)
        if name in log_panels:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path, by)
