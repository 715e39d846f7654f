"""`sinklab survey`: attention sinks across models, in one table and one figure.

Per model: Sink_1^ε per input without and with BOS (Gu et al. 2025 Table 1 left, Figures 4 left and 10), Sink_1
over a sweep of ε, the first token's norm ratio and the share of dormant heads; one MLflow run."""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline import metrics, plots
from pipeline.analysis.inputs import (
    INPUT_KINDS,
    ProbeSettings,
    add_probe_arguments,
    at_least,
    comma_list,
    probe_sets,
    tokenizer_file,
)
from pipeline.analysis.subject import Subject, add_model_arguments, claimed, csv_text, write_json
from sinklab_io.mappings import settings_of
from sinklab_io.outputs import write_output

DEFAULT_SWEEP = "0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9"
BY = "sinklab survey"
OUTPUTS = ("survey.md", "survey.csv", "sweep.csv", "survey.png", "survey.json")  # what it writes into --out
BOS_MODES = {"no": False, "yes": True}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sinklab survey", description=__doc__.split("\n\n")[0])
    add_model_arguments(p, many=True)
    add_probe_arguments(p)
    p.add_argument(
        "--bos", default="no,yes", help="comma list of no,yes: sequences without / with the tokenizer's BOS first"
    )
    p.add_argument("--eps-sweep", default=DEFAULT_SWEEP, help="comma list of ε for the figure's right panel")
    p.add_argument(
        "--tokenizer", type=Path, help="tokenizer.json for SinkLab checkpoints (default: --dataset's or one beside it)"
    )
    p.add_argument("--out", type=Path, default=Path("analysis") / "survey", help="output directory")
    p.add_argument(
        "--mlflow-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the project's mlruns/)"
    )
    p.add_argument("--experiment", default="sinklab-analysis", help="MLflow experiment name")
    p.add_argument("--no-mlflow", action="store_true", help="write the files only")
    return p


def column(kind: str, bos: bool) -> str:
    return f"{kind}_bos" if bos else kind


def survey_model(
    spec: str, kind: str, tokenizer: Path | None, probe: ProbeSettings, bos_modes: list[bool], sweep: list[float]
) -> dict:
    started = time.perf_counter()
    subject = Subject(spec, kind, tokenizer, "survey")
    subject.check_seq_len(probe.seq_len)
    loaded = time.perf_counter() - started
    result = {**subject.header(), "spec": spec, "run_id": subject.run_id, "cells": {}, "skipped": []}
    for bos in bos_modes:
        if bos and getattr(subject.tokenizer, "bos_token_id", None) is None:
            result["skipped"].append("BOS: the model's tokenizer has no BOS token")
            continue
        for kind, tokens in probe_sets(subject, replace(probe, bos=bos)).items():
            measures = subject.measure(tokens, probe)
            result["layers"], result["heads"] = measures.alpha1.shape
            result["cells"][column(kind, bos)] = {
                "input": kind,
                "bos": bos,
                "sink1": measures.sink1,
                "alpha1_mean": float(measures.alpha1.mean()),
                "sweep": [metrics.sink_rate(measures.alpha1_all, e) for e in sweep],
                "massive_ratio": measures.massive_ratio.tolist(),
                "dormant_pct": measures.dormant_pct,
                "entropy_mean": float(measures.entropy.nanmean()),
            }
    result["seconds"] = {"load": round(loaded, 2), "measure": round(time.perf_counter() - started - loaded, 2)}
    del subject
    gc.collect()
    return result


def peak_ratio(cell: dict | None) -> tuple[float | None, int | None]:
    """The largest first-token norm ratio over layers and its 1-based layer."""
    if not cell:
        return None, None
    ratios = cell["massive_ratio"]
    layer = max(range(len(ratios)), key=lambda i: ratios[i])
    return ratios[layer], layer + 1


def table_rows(results: list[dict], columns: list[str]) -> list[dict]:
    rows = []
    for rec in results:
        cells = rec["cells"]
        natural = cells.get("natural") or next((c for c in cells.values() if not c["bos"]), None)
        natural_bos = cells.get("natural_bos") or next((c for c in cells.values() if c["bos"]), None)
        row = {"model": rec["model"], "layers": rec.get("layers"), "heads": rec.get("heads")}
        row.update({f"sink1_{c}": cells[c]["sink1"] if c in cells else None for c in columns})
        row["norm_ratio"], row["norm_ratio_layer"] = peak_ratio(natural)
        row["norm_ratio_bos"], row["norm_ratio_bos_layer"] = peak_ratio(natural_bos)
        row["dormant_pct"] = natural["dormant_pct"] if natural else None
        rows.append(row)
    return rows


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(rows: list[dict], columns: list[str], probe: ProbeSettings, bos_modes: list[bool]) -> str:
    bos_note = {(False,): "no BOS", (True,): "BOS first", (False, True): "without / with BOS"}
    head = (
        f"Sink_1^ε (%), ε={probe.eps}, T={probe.seq_len}, N={probe.num_sequences}, "
        f"{bos_note.get(tuple(bos_modes), 'BOS as listed')}; ‖h₁‖ ratio: max over layers (layer), natural input"
    )
    labels = [c.replace("_bos", " +BOS") for c in columns]
    lines = [
        head,
        "",
        "| model | L×H | " + " | ".join(labels) + " | ‖h₁‖ ratio | ‖h₁‖ ratio +BOS | dormant % |",
        "|---|---|" + "---|" * (len(columns) + 3),
    ]
    for r in rows:
        ratios = [
            "n/a" if r[key] is None else f"{_fmt(r[key], 1)} ({_fmt(r[key + '_layer'])})"
            for key in ("norm_ratio", "norm_ratio_bos")
        ]
        cells = " | ".join([_fmt(r[f"sink1_{c}"]) for c in columns] + ratios + [_fmt(r["dormant_pct"], 1)])
        lines.append(f"| {r['model']} | {r['layers']}×{r['heads']} | {cells} |")
    return "\n".join(lines)


def draw(
    results: list[dict], columns: list[str], sweep: list[float], probe: ProbeSettings, bos_modes, path: Path, by: str
) -> Path:
    bars = {rec["model"]: {c: rec["cells"][c]["sink1"] for c in columns if c in rec["cells"]} for rec in results}
    first = probe.inputs[0]
    cells = {(rec["model"], bos): rec["cells"].get(column(first, bos)) for rec in results for bos in bos_modes}
    curves = {key: cell["sweep"] for key, cell in cells.items() if cell}
    return plots.survey_figure(bars, curves, sweep, path, probe.eps, first, by)


def log_run(
    uri: str, experiment: str, settings: dict, results: list[dict], rows: list[dict], sweep: list[float]
) -> str:
    """The survey's MLflow run: ``settings`` (as survey.json records them) give its parameters and --out."""
    from pipeline.tracking import log_new_run

    tags = {"sinklab.kind": "analysis-survey", "sinklab.models": ",".join(r["spec"] for r in results)[:5000]}
    if sources := [r["run_id"] for r in results if r.get("run_id")]:
        tags["sinklab.source_runs"] = ",".join(sources)
    params = {k: settings[k] for k in ("num_sequences", "seq_len", "eps", "seed", "inputs", "bos", "eps_sweep")}
    values = {
        f"{row['model']}/{k}": v
        for row in rows
        for k, v in row.items()
        if k not in ("model", "layers", "heads") and isinstance(v, (int, float))
    }
    # the ε sweep as a curve: step = 100 ε
    curve = [
        (f"{rec['model']}/sweep_{name}", value, round(100 * eps))
        for rec in results
        for name, cell in rec["cells"].items()
        for eps, value in zip(sweep, cell["sweep"])
    ]
    name = "survey-" + "+".join(r["model"] for r in results)[:200]
    return log_new_run(uri, experiment, name, tags, params, values, Path(settings["out"]), curve)


@dataclass(frozen=True)
class Survey:
    """`sinklab survey`'s settings; ``options``: the command line as parsed, written into survey.json and logged."""

    models: list[str]
    kind: str
    tokenizer: Path | None
    probe: ProbeSettings
    bos_modes: list[bool]
    sweep: list[float]
    out: Path
    options: dict
    mlflow_uri: str | None
    experiment: str
    no_mlflow: bool


def check_args(args: argparse.Namespace) -> Survey:
    at_least(args, BY, num_sequences=1, seq_len=2)
    kinds = comma_list(args.inputs, "--inputs", BY, allowed=INPUT_KINDS)
    bos_modes = comma_list(args.bos, "--bos", BY, BOS_MODES.__getitem__, refusal="{item!r}: choose from no,yes")
    sweep = sorted(set(comma_list(args.eps_sweep, "--eps-sweep", BY, float) + [args.eps]))
    if any(not 0.0 <= e < 1.0 for e in sweep):
        raise SystemExit(f"sinklab survey: --eps/--eps-sweep {sweep}: every ε must lie in [0, 1)")
    probe = settings_of(ProbeSettings, args, inputs=tuple(kinds), positions=1, bos=False)  # only Sink_1 is surveyed
    parsed = {"inputs_list": kinds, "bos_modes": bos_modes, "positions": 1}
    options = json.loads(json.dumps(vars(args) | parsed, default=str))
    given = {"tokenizer": tokenizer_file(args.tokenizer, args.dataset), "options": options}
    return settings_of(Survey, args, probe=probe, bos_modes=bos_modes, sweep=sweep, **given)


def main(argv: list[str] | None = None) -> int:
    s = check_args(build_parser().parse_args(argv))
    probe, bos_modes, sweep = s.probe, s.bos_modes, s.sweep
    by = claimed(s.out, OUTPUTS, BY, s.models)
    results = []
    for spec in s.models:
        results.append(survey_model(spec, s.kind, s.tokenizer, probe, bos_modes, sweep))
        print(f"{results[-1]['model']}: {results[-1]['seconds']}", flush=True)
    columns = [column(k, b) for b in bos_modes for k in probe.inputs]
    rows = table_rows(results, columns)
    table = markdown(rows, columns, probe, bos_modes)
    write_output(s.out / "survey.md", table + "\n", by)
    write_output(s.out / "survey.csv", csv_text(rows), by)
    sweep_rows = [
        {"model": rec["model"], "input": cell["input"], "bos": int(cell["bos"]), "eps": eps, "sink1": value}
        for rec in results
        for cell in rec["cells"].values()
        for eps, value in zip(sweep, cell["sweep"])
    ]
    write_output(s.out / "sweep.csv", csv_text(sweep_rows), by)
    draw(results, columns, sweep, probe, bos_modes, s.out / "survey.png", by)
    saved = {"settings": s.options, "eps_sweep": sweep, "table": rows, "models": results}
    write_json(saved, s.out / "survey.json", by)
    if not s.no_mlflow:
        from pipeline.tracking import tracking_uri

        uri = s.mlflow_uri or tracking_uri()
        saved["mlflow_run_id"] = log_run(uri, s.experiment, s.options, results, rows, sweep)
        write_json(saved, s.out / "survey.json", by)
    print(table)
    print(
        f"wrote {s.out}/survey.md, survey.csv, sweep.csv, survey.png"
        + (f"; MLflow run {saved['mlflow_run_id']}" if "mlflow_run_id" in saved else "")
    )
    return 0
