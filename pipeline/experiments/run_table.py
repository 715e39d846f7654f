"""The runs a report renders, one table read from MLflow or from a data file (docs/experiments.md, Results as data),
and the results pages of `sinklab report ... --docs DIR`: the report as DIR/<experiment>.md, its runs as
DIR/data/<experiment>.csv and the index DIR/README.md, each page with a prose region between PROSE's lines that a
rewrite keeps as it stands (docs/experiments.md, Results pages)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pipeline import metric_names as N
from pipeline import metrics as M
from pipeline import tracking
from pipeline.experiments.agreement import EMERGED, Agreement, data_line, from_data, index_markdown
from pipeline.experiments.spec import Experiment
from sinklab_io.outputs import claim, outside, write_output, written

# the columns before the metrics; then one per metric the report reads, by name
FIXED = ("study", "scale", "read_on", "variant", "seed", "run_id", "status", "steps", "commit", "config_hash")
WARNING = "memorising"  # the last column: the run's valid-loss warning, "" where none
STEP_KEYS = (N.SINK1, N.TRAIN_LOSS, N.VAL_LOSS)  # the last step any of these was logged at is the run's last step
PROSE = ["<!-- prose: kept as it stands when this page is regenerated -->", "<!-- /prose -->"]
INDEX = "README.md"
INDEX_BY = "sinklab report --docs (the index)"
DATA = "data"  # DIR/data/<experiment>.csv: the runs a page renders
page_by = "sinklab report --docs of {}".format  # the writer of an experiment's page, then of its data file
data_by = "sinklab report --docs of {} (its runs)".format


class DataFileError(ValueError):
    """A data file the report cannot render from; the message starts with the file."""


@dataclass
class RunTable:
    """An experiment's runs at one scale: per variant in file order, one run per seed, as read on ``read_on``."""

    study: str
    scale: str
    read_on: str  # the date (UTC, ISO) the runs were read from MLflow
    runs: dict[str, list[tracking.RunSummary]]


def metrics_read(experiment: Experiment, scale: str) -> list[str]:
    """Every final metric the report (table, agreement, emergence, figure) reads of a run, sorted."""
    return sorted(
        {experiment.metric(c, scale) for c in experiment.columns} | {N.ALPHA1_MEAN, N.ALPHA1_UNIFORM, *EMERGED.values()}
    )


def from_mlflow(experiment: Experiment, scale: str, mlflow) -> RunTable:
    """Per variant and seed the run a report shows, with its last step, valid-loss warning and the metrics read."""
    known = tracking.variant_runs(mlflow, experiment.mlflow_experiment, scale)
    read = set(metrics_read(experiment, scale))
    runs = {}
    for variant in experiment.variants:
        shown = list(tracking.best_runs(known.get(variant.name, [])).values())
        for run in shown:
            histories = {key: tracking.metric_history(mlflow, run.run_id, key) for key in STEP_KEYS}
            run.steps = max((step for history in histories.values() for step, _ in history), default=None)
            run.memorising = M.memorising(histories[N.VAL_LOSS])
            run.metrics = {k: v for k, v in run.metrics.items() if k in read}
        runs[variant.name] = shown
    return RunTable(experiment.name, scale, datetime.now(timezone.utc).date().isoformat(), runs)


def to_csv(table: RunTable, experiment: Experiment) -> str:
    """The table as CSV text, one line per run in the report's order; a value the run did not log is empty."""
    metrics = metrics_read(experiment, table.scale)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*FIXED, *metrics, WARNING])
    for runs in table.runs.values():
        for r in runs:
            fixed = [table.study, table.scale, table.read_on, r.variant, r.seed, r.run_id, r.status, r.steps]
            values = [*fixed, r.commit, r.config_hash, *(r.metrics.get(m) for m in metrics)]
            cells = ["" if v is None else repr(float(v)) if isinstance(v, float) else str(v) for v in values]
            writer.writerow(cells + [r.memorising or ""])
    return out.getvalue()


def _number(path: Path, line: int, column: str, text: str, kind: type):
    """``text`` as ``kind`` (int or float), None where empty; a one-line error naming the cell otherwise."""
    if text == "":
        return None
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise DataFileError(f"{path}:{line}: {column}: {text!r} is not {what} (or empty: not logged)") from None


def _rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataFileError(f"{path}: no such file; give a data file that `sinklab report --docs` wrote") from None
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(f"{path}: cannot be read as a UTF-8 CSV file ({error})") from None
    reader = csv.reader(io.StringIO(text), strict=True)
    rows = []
    try:
        columns = next(reader, None)
        if not columns:
            raise DataFileError(f"{path}: empty; a data file starts with its header line ({', '.join(FIXED)}, ...)")
        for cells in reader:
            if len(cells) != len(columns):
                raise DataFileError(f"{path}:{reader.line_num}: {len(cells)} cells where the header has {len(columns)}")
            rows.append((reader.line_num, dict(zip(columns, cells))))
    except csv.Error as error:
        raise DataFileError(f"{path}:{reader.line_num}: not CSV ({error})") from None
    return columns, rows


def _one(path: Path, rows: list[tuple[int, dict[str, str]]], column: str) -> str:
    values = sorted({row[column] for _, row in rows})
    if len(values) != 1:
        raise DataFileError(f"{path}: {column}: every row must give the same one, these give {', '.join(values)}")
    return values[0]


def from_csv(path: Path, experiment: Experiment, scale: str | None = None) -> RunTable:
    """The table a data file holds, checked against ``experiment`` before anything is rendered (DataFileError)."""
    path = Path(path)
    columns, rows = _rows(path)
    missing = [c for c in FIXED if c not in columns]
    if missing:
        raise DataFileError(f"{path}: no column {', '.join(missing)}; not a data file of `sinklab report --docs`")
    if not rows:
        raise DataFileError(f"{path}: holds no runs; nothing to render")
    study = _one(path, rows, "study")
    if study != experiment.name:
        raise DataFileError(
            f"{path}: holds the runs of {study!r}, not of {experiment.name!r}; give {study}'s data file"
        )
    found = _one(path, rows, "scale")
    if scale is not None and scale != found:
        raise DataFileError(
            f"{path}: holds the {found} scale's runs, not the {scale} scale's; drop --scale or match it"
        )
    experiment.setup(found)
    read = metrics_read(experiment, found)
    expected = [*FIXED, *read, WARNING]
    if columns != expected:
        lacking = [c for c in expected if c not in columns]
        extra = [c for c in columns if c not in expected]
        what = f"no column {', '.join(lacking)}" if lacking else f"column {', '.join(extra)} not read by this report"
        if not lacking and not extra:
            what = "its columns in another order"
        raise DataFileError(f"{path}: {what}; `sinklab report {study} --scale {found} --docs DIR` writes the columns")
    variants = [v.name for v in experiment.variants]
    runs: dict[str, list[tracking.RunSummary]] = {}
    for line, row in rows:
        variant = row["variant"]
        if variant not in variants:
            raise DataFileError(f"{path}:{line}: variant {variant!r} is not one of {study}'s ({', '.join(variants)})")
        seed = _number(path, line, "seed", row["seed"], int)
        if any(r.seed == seed for r in runs.get(variant, [])):
            raise DataFileError(f"{path}:{line}: a second run of {variant} seed {seed}; a report shows one per seed")
        if not row["run_id"] or not row["status"]:
            raise DataFileError(f"{path}:{line}: run_id and status must not be empty")
        metrics = {m: _number(path, line, m, row[m], float) for m in read}
        runs.setdefault(variant, []).append(
            tracking.RunSummary(
                run_id=row["run_id"],
                variant=variant,
                status=row["status"],
                start_time=0,
                metrics={m: v for m, v in metrics.items() if v is not None},
                seed=seed,
                commit=row["commit"] or None,
                config_hash=row["config_hash"] or None,
                steps=_number(path, line, "steps", row["steps"], int),
                memorising=row[WARNING] or None,
            )
        )
    ordered = {v: runs[v] for v in variants if v in runs}
    return RunTable(study, found, _one(path, rows, "read_on"), ordered)


def page_top(table: RunTable) -> str:
    """The results page's first lines: what wrote it and from what; the same from MLflow and from the data file."""
    data, name = f"{DATA}/{table.study}.csv", table.study
    return (
        f"# {name}\n\nWritten by `sinklab report {name} --scale {table.scale} --docs DIR` from the study's MLflow runs "
        f"as read on {table.read_on}, which [{data}]({data}) holds: `sinklab report {name} --from DIR/{data} "
        "--docs DIR` writes this page again from that file alone.\n\n"
    )


def claim_pages(out: Path, experiment: str) -> None:
    """Refuse (``NotOurs``) before any work where the page, its data file or the index is not this command's."""
    claim(out, [f"{experiment}.md"], "--docs", page_by(experiment))
    claim(out / DATA, [f"{experiment}.csv"], "--docs", data_by(experiment))
    claim(out, [INDEX], "--docs", INDEX_BY)


def prose_of(path: Path) -> str:
    """The prose region of the page at ``path`` (its lines between PROSE's), "" where there is none."""
    if not path.is_file() or outside(path.read_bytes(), PROSE) is None:
        return ""
    text = path.read_text(encoding="utf-8")
    return text[text.index(PROSE[0]) + len(PROSE[0]) : text.index(PROSE[1])].strip("\n")


def with_prose(generated: str, prose: str, tail: str = "") -> str:
    body = f"{prose}\n" if prose else ""
    return f"{generated.rstrip()}\n\n{PROSE[0]}\n{body}{PROSE[1]}\n" + (f"\n{tail.rstrip()}\n" if tail else "")


def title_of(path: Path) -> str:
    heading = next((line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("## ")), "")
    return heading.removeprefix("## ").removeprefix(f"{path.stem}: ") or path.stem


def write_index(out: Path) -> Path:
    pages = [p for p in written(out) if p.suffix == ".md" and p.name != INDEX]
    head = (
        "# Results\n\nOne page per study, each written by `sinklab report EXPERIMENT --scale S --docs DIR` from "
        "the study's MLflow runs, which it keeps in data/EXPERIMENT.csv: `sinklab report EXPERIMENT --from "
        "DIR/data/EXPERIMENT.csv --docs DIR` writes the page again from that file alone (the command and date at its "
        "top); this index is rewritten with every page."
    )
    table = ["| page | study |", "|---|---|"] + [f"| [{p.stem}]({p.name}) | {title_of(p)} |" for p in pages]
    table += index_markdown([(p.stem, from_data(p.read_text(encoding="utf-8"))) for p in pages])
    index = out / INDEX
    return write_output(index, with_prose(head, prose_of(index), "\n".join(table)), INDEX_BY, PROSE)


def write_page(
    out: Path, experiment: str, generated: str, found: list[Agreement] = (), *, data: str | None = None
) -> list[Path]:
    """The data file (where ``data`` is given), the page (agreement rows ``found``, its prose kept) and the index."""
    table = [write_output(out / DATA / f"{experiment}.csv", data, data_by(experiment))] if data is not None else []
    page = out / f"{experiment}.md"
    generated = f"{generated.rstrip()}\n\n{data_line(found)}\n" if found else generated
    write_output(page, with_prose(generated, prose_of(page)), page_by(experiment), PROSE)
    return [*table, page, write_index(out)]
