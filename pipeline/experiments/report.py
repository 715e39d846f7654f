"""`sinklab report EXPERIMENT`: the paper's table with the measured values beside it.

    sinklab report weight-decay --scale cpu [--plot] [--out DIR]

Reads the runs of MLflow experiment `sinklab/<experiment>` at the scale (tags
sinklab.variant / sinklab.scale), prints one markdown row per variant with the paper's
value and the measured one side by side, writes report.md (and with --plot the figure) to
--out, and logs both as artifacts of a report run in the same MLflow experiment.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.experiments import runs as mlruns
from pipeline.experiments.configs import write_text_atomic
from pipeline.experiments.spec import SCALES, Experiment, ExperimentError, load_experiment

MISSING = "—"


@dataclass
class Row:
    variant: str
    label: str
    paper: list[float | None]
    measured: list[float | None]
    status: str            # the run's sinklab.status (finished, failed, ...) or missing
    paper_status: str | None = None
    run_id: str | None = None


def build_rows(experiment: Experiment, records: dict[str, list[mlruns.RunRecord]]) -> list[Row]:
    """One row per variant, in the experiment file's order."""
    rows = []
    for variant in experiment.variants:
        run = mlruns.best_run(records.get(variant.name, []))
        measured = [run.metrics.get(c.metric) if run else None for c in experiment.columns]
        status = run.status if run else "missing"
        rows.append(Row(variant.name, variant.label, [variant.paper[c.key] for c in experiment.columns],
                        measured, status, variant.paper_status, run.run_id if run else None))
    return rows


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return MISSING
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.{digits}f}"


def to_markdown(experiment: Experiment, scale: str, rows: list[Row]) -> str:
    # a column the paper has no number for (e.g. mean alpha_1) gets no "paper" sub-column
    in_paper = [any(r.paper[i] is not None for r in rows) for i in range(len(experiment.columns))]
    header = ["variant"]
    for c, paper in zip(experiment.columns, in_paper):
        header += [f"{c.label} paper", f"{c.label} ours"] if paper else [c.label]
    header.append("run")
    lines = [f"## {experiment.name}: {experiment.title}", "",
             f"Paper: {experiment.paper_ref}. Scale: {scale}. MLflow experiment: "
             f"`{experiment.mlflow_experiment}`.", "",
             "| " + " | ".join(header) + " |",
             "|" + "---|" + "---:|" * (len(header) - 2) + "---|"]
    for row in rows:
        cells = [row.label]
        for c, paper, measured, published in zip(experiment.columns, row.paper, row.measured, in_paper):
            if published:
                cells.append(row.paper_status if row.paper_status else fmt(paper, c.digits))
            cells.append(fmt(measured, c.digits))
        cells.append(row.status)
        lines.append("| " + " | ".join(cells) + " |")
    done = sum(r.status == "finished" for r in rows)
    lines += ["", f"{done} of {len(rows)} variants finished; {MISSING} = no value (paper: not "
              "published; ours: not run or not logged)."]
    if experiment.paper_notes:
        lines += ["", f"Paper notes: {experiment.paper_notes}"]
    if scale == "cpu" and experiment.cpu_notes:
        lines += ["", f"CPU scale: {experiment.cpu_notes}"]
    return "\n".join(lines) + "\n"


def plot(experiment: Experiment, rows: list[Row], mlflow, path: Path) -> Path | None:
    """The experiment's figure: a metric over steps per variant (curve) or per variant (bar)."""
    if experiment.plot is None:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = experiment.plot
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if spec.kind == "curve":
        for row in rows:
            if row.run_id:
                history = mlruns.metric_history(mlflow, row.run_id, spec.metric)
                if history:
                    ax.plot(*zip(*history), marker="o", markersize=3, label=row.label)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    else:
        column = next((i for i, c in enumerate(experiment.columns) if c.metric == spec.metric), None)
        labels = [r.label for r in rows]
        xs = range(len(rows))
        ours = [(r.measured[column] if column is not None else None) for r in rows]
        paper = [(r.paper[column] if column is not None else None) for r in rows]
        ax.bar([x - 0.2 for x in xs], [v if v is not None else 0 for v in paper], 0.4, label="paper")
        ax.bar([x + 0.2 for x in xs], [v if v is not None else 0 for v in ours], 0.4, label="ours")
        ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=8)
    ax.set_ylabel(spec.metric)
    ax.set_title(spec.title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def log_report(mlflow, experiment: Experiment, scale: str, files: list[Path]) -> str:
    """Log the files as artifacts of the experiment's report run for this scale (reused)."""
    exp = mlflow.get_experiment_by_name(experiment.mlflow_experiment)
    exp_id = exp.experiment_id if exp else mlflow.create_experiment(experiment.mlflow_experiment)
    query = (f"tags.`{mlruns.TAG_KIND}` = 'report' and tags.`{mlruns.TAG_SCALE}` = '{scale}'")
    existing = mlflow.search_runs([exp_id], filter_string=query, max_results=1)
    if existing:
        run_id = existing[0].info.run_id
    else:
        run_id = mlflow.create_run(exp_id, run_name=f"report ({scale})", tags={
            mlruns.TAG_KIND: "report", mlruns.TAG_SCALE: scale,
            mlruns.TAG_EXPERIMENT: experiment.name}).info.run_id
    for f in files:
        mlflow.log_artifact(run_id, str(f), artifact_path=f"report-{scale}")
    mlflow.set_terminated(run_id)
    return run_id


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sinklab report",
                                     description="The paper's table beside the measured values, from MLflow.")
    parser.add_argument("experiment", help="experiment name (file stem) or path to its YAML")
    parser.add_argument("--scale", choices=SCALES, default="cpu")
    parser.add_argument("--plot", action="store_true", help="also write the experiment's figure (PNG)")
    parser.add_argument("--out", type=Path, help="directory for report.md and the figure "
                        "(default: runs/<experiment>/<scale>/report)")
    parser.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        experiment = load_experiment(args.experiment)
    except ExperimentError as error:
        print(f"sinklab report: {error}", file=sys.stderr)
        return 2
    mlflow = mlruns.client()
    records = mlruns.variant_runs(mlflow, experiment.mlflow_experiment, args.scale)
    rows = build_rows(experiment, records)
    markdown = to_markdown(experiment, args.scale, rows)
    out = args.out or Path("runs") / experiment.name / args.scale / "report"
    files = [write_text_atomic(out / "report.md", markdown)]
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
        run_id = log_report(mlflow, experiment, args.scale, files)
        print(f"logged to MLflow run {run_id} ({experiment.mlflow_experiment})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
