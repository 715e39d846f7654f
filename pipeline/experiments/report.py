"""`sinklab report EXPERIMENT`: the paper's table with the measured values beside it.

    sinklab report weight-decay --scale cpu [--plot] [--out DIR]

Reads the runs of MLflow experiment `sinklab/<experiment>` at the scale (tags
sinklab.variant / sinklab.scale), prints one markdown row per variant with the paper's
value and the measured one side by side and the steps at which the sink emerged, then the
rank agreement with the paper per column (Spearman rho, Kendall tau-b; also the mean alpha_1
against the paper's Sink_1), writes report.md (and with --plot the figure) to --out, and logs
both as artifacts, the agreement as metrics, of a report run in the same MLflow experiment.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline import metric_names as N
from pipeline import metrics as M
from pipeline import tracking
from pipeline.experiments.spec import SCALES, Experiment, ExperimentError, load_experiment
from sinklab_io.atomic import atomic_path, atomic_write

MISSING = "—"
ALPHA1, SINK1 = N.ALPHA1_MEAN, N.SINK1
UNIFORM = N.ALPHA1_UNIFORM  # logged by every probe since emergence steps are (issue 19)
EMERGED = {name: N.emerged_step(name) for name in (*M.EMERGENCE_SINK1, *M.EMERGENCE_ALPHA1)}
EMERGENCE_LABEL = "emergence step (Sink_1 > 1% / > 10% / alpha_1 > 1.25 x uniform)"


@dataclass
class Row:
    variant: str
    label: str
    paper: list[float | None]
    measured: list[float | None]
    status: str  # the run's sinklab.status (finished, failed, ...) or missing
    paper_status: str | None = None
    run_id: str | None = None
    alpha1: float | None = None  # the run's last mean alpha_1 (sink/alpha1_mean)
    emerged: dict[str, float] | None = None  # EMERGED name -> step, as the run logged them
    tracks_emergence: bool = False  # the run logs emergence (absent then means: not yet)


def build_rows(experiment: Experiment, records: dict[str, list[tracking.RunRecord]], scale: str = "cpu") -> list[Row]:
    """One row per variant, in the experiment file's order."""
    rows = []
    for variant in experiment.variants:
        run = tracking.best_run(records.get(variant.name, []))
        measured = [run.metrics.get(experiment.metric(c, scale)) if run else None for c in experiment.columns]
        status = run.status if run else "missing"
        logged = run.metrics if run else {}
        rows.append(
            Row(
                variant.name,
                variant.label,
                [variant.paper[c.key] for c in experiment.columns],
                measured,
                status,
                variant.paper_status,
                run.run_id if run else None,
                alpha1=logged.get(ALPHA1),
                emerged={k: logged[m] for k, m in EMERGED.items() if m in logged},
                tracks_emergence=UNIFORM in logged,
            )
        )
    return rows


def emergence_cell(row: Row) -> str:
    """ "1000 / 1500 / 250": the first step above each threshold; "none" where a run that tracks
    emergence has not crossed it (yet), — where the run is missing or predates the tracking."""
    if row.emerged is None or not (row.emerged or row.tracks_emergence):
        return MISSING
    return " / ".join(f"{row.emerged[k]:.0f}" if k in row.emerged else "none" for k in EMERGED)


@dataclass
class Agreement:
    """Rank agreement of one measured quantity with one paper column over the variants that
    have both values (None: undefined, fewer than 2 such variants or one side constant)."""

    key: str  # metric-name part: the column key, or alpha1_vs_sink1
    label: str
    n: int
    rho: float | None
    tau: float | None


def agreement(experiment: Experiment, rows: list[Row]) -> list[Agreement]:
    """Per column with paper values: ours against the paper's; then the mean alpha_1 against
    the paper's Sink_1 (it moves where Sink_1 stays zero at a small scale)."""

    def pair(key, label, ours, paper):
        known = [(a, b) for a, b in zip(ours, paper) if a is not None and b is not None]
        return Agreement(key, label, len(known), M.spearman_rho(ours, paper), M.kendall_tau_b(ours, paper))

    out = []
    for i, column in enumerate(experiment.columns):
        paper = [r.paper[i] for r in rows]
        if any(v is not None for v in paper):
            out.append(pair(column.key, column.label, [r.measured[i] for r in rows], paper))
    sink1 = next((i for i, c in enumerate(experiment.columns) if c.metric == SINK1), None)
    if sink1 is not None and any(r.paper[sink1] is not None for r in rows):
        out.append(
            pair(
                "alpha1_vs_sink1",
                "mean alpha_1 (ours) vs Sink_1 (paper)",
                [r.alpha1 for r in rows],
                [r.paper[sink1] for r in rows],
            )
        )
    return out


def fmt_corr(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def agreement_markdown(found: list[Agreement]) -> list[str]:
    if not found:
        return []
    lines = [
        "",
        "Rank agreement with the paper, over the variants with both values (Spearman rho "
        "on average ranks, Kendall tau-b; n/a: fewer than 2 variants or no spread):",
        "",
        "| measured vs paper | variants | Spearman rho | Kendall tau |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {a.label} | {a.n} | {fmt_corr(a.rho)} | {fmt_corr(a.tau)} |" for a in found]
    return lines


def agreement_metrics(found: list[Agreement]) -> dict[str, float]:
    """MLflow names: agreement/<key>/{n,spearman,kendall}; NaN where undefined, so the newest
    report never leaves an older value standing."""
    nan = float("nan")
    out = {}
    for a in found:
        out[N.agreement(a.key, "n")] = float(a.n)
        out[N.agreement(a.key, "spearman")] = nan if a.rho is None else a.rho
        out[N.agreement(a.key, "kendall")] = nan if a.tau is None else a.tau
    return out


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return MISSING
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.{digits}f}"


def memorising_notes(rows: list[Row], mlflow) -> list[str]:
    """One line per variant whose validation loss turned upward for good (metrics.memorising)."""
    notes = []
    for row in rows:
        if row.run_id and (note := M.memorising(tracking.metric_history(mlflow, row.run_id, N.VAL_LOSS))):
            notes.append(f"{row.label}: {note}")
    return notes


STEP_KEYS = (SINK1, N.TRAIN_LOSS, N.VAL_LOSS)


def steps_run(rows: list[Row], mlflow) -> dict[str, int]:
    """Variant label -> the last step its run logged (the final sink probe runs at the last step)."""
    out = {}
    for row in rows:
        if row.run_id:
            steps = [step for key in STEP_KEYS for step, _ in tracking.metric_history(mlflow, row.run_id, key)]
            if steps:
                out[row.label] = max(steps)
    return out


def steps_line(steps: dict[str, int]) -> list[str]:
    if not steps:
        return []
    if len(set(steps.values())) == 1:
        return ["", f"Steps actually run: {next(iter(steps.values()))} (every variant with a run)."]
    return ["", "Steps actually run: " + ", ".join(f"{label} {n}" for label, n in steps.items()) + "."]


def to_markdown(
    experiment: Experiment, scale: str, rows: list[Row], notes: list[str] = (), steps: dict[str, int] | None = None
) -> str:
    # a column the paper has no number for (e.g. mean alpha_1) gets no "paper" sub-column
    in_paper = [any(r.paper[i] is not None for r in rows) for i in range(len(experiment.columns))]
    header = ["variant"]
    for c, paper in zip(experiment.columns, in_paper):
        header += [f"{c.label} paper", f"{c.label} ours"] if paper else [c.label]
    header += [EMERGENCE_LABEL, "run"]
    lines = [
        f"## {experiment.name}: {experiment.title}",
        "",
        f"Paper: {experiment.paper_ref}. Scale: {scale}. MLflow experiment: `{experiment.mlflow_experiment}`.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" + "---:|" * (len(header) - 3) + "---:|---|",
    ]
    for row in rows:
        cells = [row.label]
        for c, paper, measured, published in zip(experiment.columns, row.paper, row.measured, in_paper):
            if published:
                cells.append(row.paper_status if row.paper_status else fmt(paper, c.digits))
            cells.append(fmt(measured, c.digits))
        cells += [emergence_cell(row), row.status]
        lines.append("| " + " | ".join(cells) + " |")
    done = sum(r.status == "finished" for r in rows)
    lines += [
        "",
        f"{done} of {len(rows)} variants finished; {MISSING} = no value (paper: not "
        "published; ours: not run or not logged).",
    ]
    lines += steps_line(steps or {})
    if notes:
        lines += ["", "Warnings:", ""] + [f"- {note}" for note in notes]
    lines += agreement_markdown(agreement(experiment, rows))
    if experiment.paper_notes:
        lines += ["", f"Paper notes: {experiment.paper_notes}"]
    if scale == "cpu" and experiment.cpu_notes:
        lines += ["", f"CPU scale (as the experiment file plans it): {experiment.cpu_notes}"]
    renamed = experiment.setup(scale).metrics
    if renamed:
        lines += [
            "",
            f"Columns read at the {scale} scale: " + ", ".join(f"`{k}` from `{v}`" for k, v in renamed.items()) + ".",
        ]
    return "\n".join(lines) + "\n"


def curve_series(experiment: Experiment, rows: list[Row], mlflow) -> dict[str, list[tuple[int, float]]]:
    """The plotted metric's (step, value) history per variant label, variants with a run only
    (for lr-steps: Sink_1 against steps per learning rate, the paper's Figure 4 right)."""
    out = {}
    for row in rows:
        if row.run_id:
            history = tracking.metric_history(mlflow, row.run_id, experiment.plot.metric)
            if history:
                out[row.label] = history
    return out


def labelled_bars(ax, xs, values, label: str, digits: int = 2) -> None:
    """Bars with their value written above; a measured 0 gets a visible stub and "0", a missing
    value "—", so the two are never confused."""
    heights = [v if v is not None else 0.0 for v in values]
    bars = ax.bar(xs, heights, 0.4, label=label)
    top = max([abs(h) for h in heights] + [1e-9])
    for x, value, bar in zip(xs, values, bars):
        if value == 0:
            ax.bar([x], [top * 0.01], 0.4, color=bar.get_facecolor(), edgecolor="black", linewidth=0.6)
        ax.annotate(
            MISSING if value is None else f"{value:.{digits}f}",
            (x, max(value or 0.0, 0.0)),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )


def plot(experiment: Experiment, rows: list[Row], mlflow, path: Path) -> Path | None:
    """The experiment's figure: a metric over steps per variant (curve) or per variant (bar)."""
    if experiment.plot is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = experiment.plot
    with_alpha1 = spec.kind == "bar" and spec.metric == SINK1 and any(r.alpha1 is not None for r in rows)
    fig, axes = plt.subplots(1, 2 if with_alpha1 else 1, figsize=(13 if with_alpha1 else 8, 4.5), squeeze=False)
    ax = axes[0][0]
    if spec.kind == "curve":
        emerged = {r.label: (r.emerged or {}).get("sink1_1pct") for r in rows}
        for label, history in curve_series(experiment, rows, mlflow).items():
            (line,) = ax.plot(*zip(*history), marker="o", markersize=3, label=label)
            at = emerged.get(label)
            if spec.metric == SINK1 and at is not None:  # where Sink_1 first passed 1%
                ax.axvline(at, color=line.get_color(), linewidth=0.8, linestyle=":")
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    else:
        column = next((i for i, c in enumerate(experiment.columns) if c.metric == spec.metric), None)
        labels = [r.label for r in rows]
        xs = range(len(rows))
        ours = [(r.measured[column] if column is not None else None) for r in rows]
        paper = [(r.paper[column] if column is not None else None) for r in rows]
        labelled_bars(ax, [x - 0.2 for x in xs], paper, "paper")
        labelled_bars(ax, [x + 0.2 for x in xs], ours, "ours")
        ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=8)
        if with_alpha1:
            alpha_ax = axes[0][1]
            labelled_bars(alpha_ax, list(xs), [r.alpha1 for r in rows], "ours", digits=3)
            alpha_ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=8)
            alpha_ax.set_ylabel("mean α₁ (ours)")
            rank = next((a for a in agreement(experiment, rows) if a.key == "alpha1_vs_sink1"), None)
            alpha_ax.set_title(
                "mean α₁, ranked against the paper's Sink₁" + (f": Spearman ρ {fmt_corr(rank.rho)}" if rank else ""),
                fontsize=10,
            )
    ax.set_ylabel(next((c.label for c in experiment.columns if c.metric == spec.metric), spec.metric))
    ax.set_title(spec.title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sinklab report", description="The paper's table beside the measured values, from MLflow."
    )
    parser.add_argument("experiment", help="experiment name (file stem) or path to its YAML")
    parser.add_argument("--scale", choices=SCALES, default="cpu")
    parser.add_argument("--plot", action="store_true", help="also write the experiment's figure (PNG)")
    parser.add_argument(
        "--out", type=Path, help="directory for report.md and the figure (default: runs/<experiment>/<scale>/report)"
    )
    parser.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        experiment = load_experiment(args.experiment)
        experiment.setup(args.scale)
    except ExperimentError as error:
        print(f"sinklab report: {error}", file=sys.stderr)
        return 2
    mlflow = tracking.client()
    records = tracking.variant_runs(mlflow, experiment.mlflow_experiment, args.scale)
    rows = build_rows(experiment, records, args.scale)
    markdown = to_markdown(experiment, args.scale, rows, memorising_notes(rows, mlflow), steps_run(rows, mlflow))
    out = args.out or Path("runs") / experiment.name / args.scale / "report"
    files = [atomic_write(out / "report.md", markdown)]
    if args.plot:
        figure = plot(experiment, rows, mlflow, out / f"{experiment.name}-{args.scale}.png")
        if figure is None:
            print(f"sinklab report: {experiment.name} defines no plot", file=sys.stderr)
        else:
            files.append(figure)
    print(markdown, end="")
    for f in files:
        print(f"wrote {f}")
    if not args.no_log:
        run_id = tracking.log_report(
            mlflow, experiment, args.scale, files, agreement_metrics(agreement(experiment, rows))
        )
        print(f"logged to MLflow run {run_id} ({experiment.mlflow_experiment})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
