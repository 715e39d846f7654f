"""The figure of `sinklab report --plot`: a metric over steps per run (curve), or paper and ours per variant (bar)."""

from __future__ import annotations

from pathlib import Path

from pipeline import metric_names as N
from pipeline import tracking
from pipeline.experiments.agreement import ALPHA1_KEY, EMERGED, agreement, fmt_corr
from pipeline.experiments.spec import Experiment
from pipeline.experiments.stats import MISSING, Spread, spread
from sinklab_io.outputs import output_path


def curve_series(experiment: Experiment, rows, mlflow) -> dict[str, list[tuple[int, list[tuple[int, float]]]]]:
    """Variant label -> (seed, the plotted metric's (step, value) history) of each run that logged it."""
    out = {}
    for row in rows:
        for run in row.runs:
            history = tracking.metric_history(mlflow, run.run_id, experiment.plot.metric)
            if history:
                out.setdefault(row.label, []).append((run.seed, history))
    return out


def labelled_bars(ax, xs, values, label: str, digits: int = 2, spreads: list[Spread] | None = None) -> None:
    """Bars with their value above (a 0 gets a stub, a missing value "—"); `spreads` adds intervals and seeds."""
    heights = [v if v is not None else 0.0 for v in values]
    bars = ax.bar(xs, heights, 0.4, label=label)
    top = max([abs(h) for h in heights] + [1e-9])
    for x, value, bar, s in zip(xs, values, bars, spreads or [spread([])] * len(values)):
        if value == 0:
            ax.bar([x], [top * 0.01], 0.4, color=bar.get_facecolor(), edgecolor="black", linewidth=0.6)
        if s.lo is not None:
            ax.errorbar([x], [s.mean], yerr=[[s.mean - s.lo], [s.hi - s.mean]], color="black", capsize=3, lw=0.8)
        if s.n:
            offsets = [(j - (s.n - 1) / 2) * 0.06 for j in range(s.n)]
            ax.scatter([x + o for o in offsets], s.values, s=9, color="black", zorder=3)
        above = max([value or 0.0, 0.0] + ([s.hi] if s.hi is not None else []))
        text = MISSING if value is None else f"{value:.{digits}f}"
        ax.annotate(text, (x, above), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7)


def plot(experiment: Experiment, rows, mlflow, path: Path, by: str) -> Path | None:
    """The experiment's figure: a metric over steps per run (curve) or per variant (bar), written as ``by``'s."""
    if experiment.plot is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = experiment.plot
    with_alpha1 = spec.kind == "bar" and spec.metric == N.SINK1 and any(r.alpha1.n for r in rows)
    fig, axes = plt.subplots(1, 2 if with_alpha1 else 1, figsize=(13 if with_alpha1 else 8, 4.5), squeeze=False)
    ax = axes[0][0]
    column = next((i for i, c in enumerate(experiment.columns) if c.metric == spec.metric), None)
    if spec.kind == "curve":
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        emerged = {(row.label, run.seed): run.metrics.get(EMERGED["sink1_1pct"]) for row in rows for run in row.runs}
        for i, (label, runs) in enumerate(curve_series(experiment, rows, mlflow).items()):
            colour = colours[i % len(colours)]
            for j, (seed, history) in enumerate(runs):
                shown = f"{label} ({len(runs)} seeds)" if len(runs) > 1 else label
                ax.plot(*zip(*history), marker="o", markersize=2, lw=1, color=colour, label=shown if j == 0 else None)
                at = emerged.get((label, seed))
                if experiment.plot.metric == N.SINK1 and at is not None:  # where Sink_1 first passed 1%
                    ax.axvline(at, color=colour, linewidth=0.6, linestyle=":")
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    else:
        labels = [r.label for r in rows]
        xs = range(len(rows))
        ours = [r.measured[column] if column is not None else spread([]) for r in rows]
        paper = [r.paper[column] if column is not None else None for r in rows]
        labelled_bars(ax, [x - 0.2 for x in xs], paper, "paper")
        ours_label = "ours (mean, 95% interval, seeds)"
        labelled_bars(ax, [x + 0.2 for x in xs], [s.mean for s in ours], ours_label, spreads=ours)
        ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=8)
        if with_alpha1:
            alpha_ax = axes[0][1]
            alphas = [r.alpha1 for r in rows]
            labelled_bars(alpha_ax, list(xs), [s.mean for s in alphas], "ours", digits=3, spreads=alphas)
            alpha_ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=8)
            alpha_ax.set_ylabel("mean α₁ (ours)")
            rank = next((a for a in agreement(experiment, rows) if a.key == ALPHA1_KEY), None)
            title = "mean α₁, ranked against the paper's Sink₁" + (f": Spearman ρ {fmt_corr(rank.rho)}" if rank else "")
            alpha_ax.set_title(title, fontsize=10)
    ax.set_ylabel(experiment.columns[column].label if column is not None else spec.metric)
    ax.set_title(spec.title, fontsize=10)
    fig.tight_layout()
    with output_path(path, by) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path
