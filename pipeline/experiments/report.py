"""`sinklab report EXPERIMENT`: the paper's table beside the values measured over seeds (docs/experiments.md)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline import metric_names as N
from pipeline import tracking
from pipeline.experiments import run_table, stats
from pipeline.experiments.agreement import EMERGED, Agreement, agreement, agreement_markdown, bounds, table_row
from pipeline.experiments.report_plot import plot
from pipeline.experiments.spec import SCALES, Experiment, ExperimentError, load_experiment
from pipeline.experiments.stats import MISSING, Spread, spread
from sinklab_io.outputs import NotOurs, claim, write_output

ALPHA1_COLUMN = "alpha1_mean"  # the mean alpha_1's key among a row's columns
# the emergence steps a report shows: Sink_1 above 10%, and the alpha_1 version
EMERGENCE_SHOWN = (("sink1_10pct", "emerged: Sink_1 > 10%"), ("alpha1_125pct", "emerged: alpha_1 > 1.25 x uniform"))


@dataclass
class Row:
    variant: str
    label: str
    paper: list[float | None]
    measured: list[Spread]  # per column, over the seeds measured
    status: str  # "3 finished", "2 finished, 1 failed", or "missing"
    paper_status: str | None = None
    runs: list[tracking.RunSummary] = field(default_factory=list)  # one per seed: the ones measured
    alpha1: Spread = field(default_factory=lambda: spread([]))  # the runs' last mean alpha_1
    # EMERGED name -> the step of each run that tracks emergence (None: not crossed)
    emerged: dict[str, list[float | None]] = field(default_factory=dict)


def build_rows(
    experiment: Experiment, runs_by_variant: dict[str, list[tracking.RunSummary]], scale: str = "cpu"
) -> list[Row]:
    """One row per variant, in file order, over its seeds' finished runs (its newest where none finished)."""
    rows = []
    for variant in experiment.variants:
        best = list(tracking.best_runs(runs_by_variant.get(variant.name, [])).values())
        used = [r for r in best if r.finished] or best
        tracked = [r for r in used if N.ALPHA1_UNIFORM in r.metrics]  # runs that log emergence
        names = [experiment.metric(c, scale) for c in experiment.columns]
        seeds = [r.seed for r in used]
        counts = sorted(Counter(r.status for r in best).items(), key=lambda kv: kv[0] != "finished")
        rows.append(
            Row(
                variant.name,
                variant.label,
                [variant.paper[c.key] for c in experiment.columns],
                [spread([r.metrics.get(name) for r in used], seeds, bounds(name)) for name in names],
                ", ".join(f"{n} {status}" for status, n in counts) or "missing",
                variant.paper_status,
                used,
                alpha1=spread([r.metrics.get(N.ALPHA1_MEAN) for r in used], seeds, bounds(N.ALPHA1_MEAN)),
                emerged={k: [r.metrics.get(m) for r in tracked] for k, m in EMERGED.items()},
            )
        )
    return rows


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return MISSING
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.{digits}f}"


def fmt_spread(s: Spread, digits: int = 2) -> str:
    """ "4.23 [4.20, 4.26]": the mean and its 95% interval; the value alone for one seed."""
    if s.lo is None:
        return fmt(s.mean, digits)
    return f"{fmt(s.mean, digits)} [{fmt(s.lo, digits)}, {fmt(s.hi, digits)}]"


def metric_columns(experiment: Experiment, rows: list[Row]) -> list[tuple[str, int, list[Spread]]]:
    """(label, digits, each row's spread) of every column, then of the mean alpha_1 where it is none."""
    found = [(c.label, c.digits, [r.measured[i] for r in rows]) for i, c in enumerate(experiment.columns)]
    if not any(c.metric == N.ALPHA1_MEAN for c in experiment.columns):
        found.append(("mean alpha_1", 3, [r.alpha1 for r in rows]))
    return found


def spread_markdown(experiment: Experiment, rows: list[Row]) -> list[str]:
    """Every metric per variant over its seeds: n, mean, std, the 95% t-interval and the values."""
    lines = [
        "",
        "Per variant and metric over seeds (std: sample standard deviation; interval: 95% t-interval of the mean):",
        "",
        "| variant | metric | n | mean | std | 95% interval | seeds |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    columns = metric_columns(experiment, rows)
    for j, row in enumerate(rows):
        for label, digits, spreads in columns:
            s = spreads[j]
            if s.n == 0:
                continue
            interval = f"[{fmt(s.lo, digits)}, {fmt(s.hi, digits)}]" if s.lo is not None else MISSING
            seeds = ", ".join(
                f"{fmt(v, digits)}" + (f" (s{seed})" if seed is not None else "")
                for v, seed in zip(s.values, s.seeds or [None] * s.n)
            )
            lines.append(table_row([row.label, label, s.n, fmt(s.mean, digits), fmt(s.std, digits), interval, seeds]))
    return lines


def orderings_markdown(experiment: Experiment, rows: list[Row]) -> list[str]:
    names = [r.variant for r in rows]
    columns = metric_columns(experiment, rows)
    found = [(label, text) for label, digits, spreads in columns if (text := stats.ordering(names, spreads, digits))]
    if not found:
        return []
    return [
        "",
        "Orderings over seeds: the variants by mean, then each pair that Welch's t-test tells apart at two-sided "
        f"{stats.ALPHA} after Holm over the pairs of its column (`a > b (Welch, Holm p = ...)`); a pair constant "
        "over its seeds, where Welch's t is infinite, by the permutation test of the means (`a > b (permutation, "
        "Holm p = ...)`), whose least p at 3 seeds against 3 is 0.1; the other pairs are not resolved at the "
        "seeds run, which says nothing of whether they differ:",
        "",
    ] + [f"- {label}: {text}" for label, text in found]


def to_markdown(experiment: Experiment, scale: str, rows: list[Row]) -> str:
    # a column the paper has no number for (e.g. mean alpha_1) gets no "paper" sub-column
    in_paper = [any(r.paper[i] is not None for r in rows) for i in range(len(experiment.columns))]
    header = ["variant", "seeds"]
    for c, paper in zip(experiment.columns, in_paper):
        header += [f"{c.label} paper", f"{c.label} ours"] if paper else [c.label]
    header += [label for _, label in EMERGENCE_SHOWN] + ["runs"]
    lines = [
        f"## {experiment.name}: {experiment.title}",
        "",
        f"Paper: {experiment.paper_ref}. Scale: {scale}. MLflow experiment: `{experiment.mlflow_experiment}`.",
        "",
        table_row(header),
        "|---|" + "---:|" * (len(header) - 2) + "---|",
    ]
    for row in rows:
        cells = [row.label, len(row.runs)]
        for c, paper, measured, published in zip(experiment.columns, row.paper, row.measured, in_paper):
            if published:
                cells.append(row.paper_status if row.paper_status else fmt(paper, c.digits))
            cells.append(fmt_spread(measured, c.digits))
        emerged = [stats.emergence(row.emerged.get(key, [])) for key, _ in EMERGENCE_SHOWN]
        lines.append(table_row([*cells, *emerged, row.status]))
    done = sum("finished" in r.status for r in rows)
    lines += [
        "",
        f"Finished runs for {done} of {len(rows)} variants. Ours: the mean over seeds and its 95% t-interval "
        f"[low, high] (one seed: the value alone); {MISSING} = no value (paper: not published; ours: not run or "
        "not logged). Emergence: the first probe step above the threshold, median (range) over the seeds, and how "
        "many emerged; a run that never did counts as later than every step.",
    ]
    # the last step each run logged (the final sink probe runs at the last step), per variant
    steps = {row.label: n for row in rows if (n := [r.steps for r in row.runs if r.steps is not None])}
    every = {n for runs in steps.values() for n in runs}
    if len(every) == 1:
        lines += ["", f"Steps actually run: {next(iter(every))} (every run)."]
    elif every:
        shown = ", ".join(f"{label} {'/'.join(map(str, sorted(set(n))))}" for label, n in steps.items())
        lines += ["", f"Steps actually run: {shown}."]
    notes = [f"{row.label} (seed {run.seed}): {run.memorising}" for row in rows for run in row.runs if run.memorising]
    if notes:
        lines += ["", "Warnings:", ""] + [f"- {note}" for note in notes]
    lines += orderings_markdown(experiment, rows)
    lines += agreement_markdown(agreement(experiment, rows))
    lines += spread_markdown(experiment, rows)
    if experiment.paper_notes:
        lines += ["", f"Paper notes: {experiment.paper_notes}"]
    if scale == "cpu" and experiment.cpu_notes:
        lines += ["", f"CPU scale (as the experiment file plans it): {experiment.cpu_notes}"]
    if renamed := experiment.setup(scale).metrics:
        shown = ", ".join(f"`{k}` from `{v}`" for k, v in renamed.items())
        lines += ["", f"Columns read at the {scale} scale: {shown}."]
    return "\n".join(lines) + "\n"


def to_json(experiment: Experiment, scale: str, rows: list[Row]) -> str:
    """The report's numbers for machines: per variant, column and seed, and the agreement."""
    variants = [
        {
            "variant": row.variant,
            "seeds": [r.seed for r in row.runs],
            "runs": [r.run_id for r in row.runs],
            "status": row.status,
            "columns": {c.key: asdict(s) for c, s in zip(experiment.columns, row.measured)}
            | {ALPHA1_COLUMN: asdict(row.alpha1)},
            "emerged": row.emerged,
        }
        for row in rows
    ]
    found = [asdict(a) | {"verdict": a.verdict} for a in agreement(experiment, rows)]
    return json.dumps({"experiment": experiment.name, "scale": scale, "variants": variants, "agreement": found})


def _number(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def agreement_metrics(found: list[Agreement]) -> dict[str, float]:
    """The agreement rows as MLflow metrics."""
    out = {}
    for a in found:  # getattr(None, field, None): None where there is no permutation p or no interval
        values = {"n": a.n, "min_seeds": a.min_seeds, "distinct": a.distinct, "family": a.family}
        values["spearman_p_holm"] = a.p_holm
        permutation = (("spearman_p", "p"), ("spearman_p_reversed", "p_reversed"), ("permutations", "permutations"))
        values |= {name: getattr(a.p, field, None) for name, field in permutation}
        for name, value, interval in (("spearman", a.rho, a.rho_interval), ("kendall", a.tau, a.tau_interval)):
            values[name] = value
            values |= {f"{name}_{part}": getattr(interval, part, None) for part in ("lo", "hi", "defined")}
        values["resamples"] = getattr(a.rho_interval, "resamples", None)
        out |= {N.agreement(a.key, name): _number(value) for name, value in values.items()}
    return out


def spread_metrics(experiment: Experiment, rows: list[Row]) -> dict[str, float]:
    """Each variant's metrics over its seeds as MLflow metrics."""
    out = {}
    for row in rows:
        columns = [(c.key, s) for c, s in zip(experiment.columns, row.measured)] + [(ALPHA1_COLUMN, row.alpha1)]
        for key, s in columns:
            for statistic, value in (("n", s.n), ("mean", s.mean), ("std", s.std), ("lo", s.lo), ("hi", s.hi)):
                name = re.sub(r"[^\w./ -]", "_", N.over_seeds(row.variant, key, statistic))  # MLflow's characters
                out[name] = _number(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sinklab report",
        description="The paper's table beside the measured values over seeds, from MLflow or a data file (--from).",
    )
    parser.add_argument("experiment", help="experiment name (file stem) or path to its YAML")
    parser.add_argument("--scale", choices=SCALES, help="default: cpu, or the data file's with --from")
    parser.add_argument("--plot", action="store_true", help="also write the experiment's figure (PNG)")
    parser.add_argument(
        "--out", type=Path, help="directory for report.md and the figure (default: runs/<experiment>/<scale>/report)"
    )
    parser.add_argument(
        "--docs", type=Path, help="also write the results page DIR/<experiment>.md and the index DIR/README.md"
    )
    parser.add_argument(
        "--from",
        dest="data",
        type=Path,
        metavar="CSV",
        help="render from this data file (DIR/data/<experiment>.csv of an earlier --docs) instead of MLflow; "
        "nothing is read from or logged to MLflow",
    )
    parser.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        experiment = load_experiment(args.experiment)
        table = run_table.from_csv(args.data, experiment, args.scale) if args.data else None
        scale = table.scale if table else args.scale or "cpu"
        experiment.setup(scale)
        if args.data and args.plot and experiment.plot is not None and experiment.plot.kind == "curve":
            raise run_table.DataFileError(
                f"--plot: {experiment.name}'s figure is a metric over steps, which --from does not hold"
            )
        out = args.out or Path("runs") / experiment.name / scale / "report"
        by = f"sinklab report of {experiment.name} at scale {scale}"  # the output marker's writer
        claim(out, ["report.md", "report.json", *([f"{experiment.name}-{scale}.png"] if args.plot else [])], by=by)
        if args.docs:
            run_table.claim_pages(args.docs, experiment.name)
    except (ExperimentError, NotOurs, run_table.DataFileError) as error:
        print(f"sinklab report: {error}", file=sys.stderr)
        return 2
    mlflow = None if table else tracking.client()
    table = table or run_table.from_mlflow(experiment, scale, mlflow)
    rows = build_rows(experiment, table.runs, scale)
    markdown = to_markdown(experiment, scale, rows)
    files = [
        write_output(out / "report.md", markdown, by),
        write_output(out / "report.json", to_json(experiment, scale, rows), by),
    ]
    if args.docs:
        data = run_table.to_csv(table, experiment)
        for f in run_table.write_page(
            args.docs, experiment.name, run_table.page_top(table) + markdown, agreement(experiment, rows), data=data
        ):
            print(f"wrote {f}")
    if args.plot:
        figure = plot(experiment, rows, mlflow, out / f"{experiment.name}-{scale}.png", by)
        if figure is None:
            print(f"sinklab report: {experiment.name} defines no plot", file=sys.stderr)
        else:
            files.append(figure)
    print(markdown, end="")
    for f in files:
        print(f"wrote {f}")
    if not args.no_log and mlflow is not None:
        logged = agreement_metrics(agreement(experiment, rows)) | spread_metrics(experiment, rows)
        run_id = tracking.log_report(mlflow, experiment, scale, files, logged)
        print(f"logged to MLflow run {run_id} ({experiment.mlflow_experiment})")
    return 0
