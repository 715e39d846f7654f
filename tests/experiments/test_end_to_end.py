"""A real small sweep: two variants of the micro model through `sinklab fit` (subprocesses),
logged to the MLflow server fixture, then the report's rows."""

from __future__ import annotations

import json
import re

from experiment_helpers import make_dataset, micro_recipe, write_experiment

from pipeline.experiments import report, sweep

VARIANTS = """\
- {name: softmax, label: "softmax", overrides: {arch.attention.op: softmax}, paper: {sink1: 18.18, val_loss: 3.73}}
- {name: sigmoid, label: "sigmoid, Z = 1", overrides: {arch.attention.op: sigmoid, arch.attention.normalizer: none}, paper: {sink1: 0.44, val_loss: 3.70}}
"""


def last_logged(run_dir, metric):
    values = [
        row[metric] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if metric in row
    ]
    return values[-1]


def test_sweep_runs_every_variant_once_and_the_report_shows_them(
    tmp_path, mlflow_env, unique_name, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    recipe = micro_recipe(tmp_path, make_dataset(tmp_path / "dataset"), steps=5)
    path = write_experiment(tmp_path, unique_name, recipe=recipe, variants=VARIANTS)
    runs = tmp_path / "runs" / unique_name / "cpu"

    assert sweep.main([str(path), "--scale", "cpu", "--local", "--runs-root", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "checked 2 configs with the `sinklab fit` parser" in out
    assert re.search(r"\[1/2\] softmax: done in \d+ s", out) and re.search(r"\[2/2\] sigmoid: done", out)
    for variant in ("softmax", "sigmoid"):
        assert (runs / variant / "mlflow_run_id").exists() and (runs / variant / "config.yaml").exists()

    # Idempotent: nothing left to run.
    assert sweep.main([str(path), "--local", "--runs-root", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "nothing to run: every variant has finished" in out and "[1/" not in out

    assert report.main([str(path), "--out", str(tmp_path / "report")]) == 0
    rows = report.build_rows(
        report.load_experiment(path), report.tracking.variant_runs(mlflow_env, f"sinklab/{unique_name}", "cpu")
    )
    assert [(r.variant, r.status) for r in rows] == [("softmax", "finished"), ("sigmoid", "finished")]
    for row in rows:
        sink1, val_loss = row.measured
        run_dir = runs / row.variant
        assert sink1 == last_logged(run_dir, "sink/sink1") and 0.0 <= sink1 <= 100.0
        assert val_loss == last_logged(run_dir, "val/loss") and 3.0 < val_loss < 6.0  # ln 64 = 4.16
        assert row.run_id == (run_dir / "mlflow_run_id").read_text().strip()
    md = (tmp_path / "report" / "report.md").read_text()
    emerged = [report.emergence_cell(r) for r in rows]  # every sweep run tracks emergence
    assert all(r.tracks_emergence for r in rows) and "—" not in emerged
    assert (
        f"| softmax | 18.18 | {rows[0].measured[0]:.2f} | 3.73 | {rows[0].measured[1]:.2f} | {emerged[0]} | finished |"
        in md
    )
    assert (
        f"| sigmoid, Z = 1 | 0.44 | {rows[1].measured[0]:.2f} | 3.70 | {rows[1].measured[1]:.2f} | {emerged[1]} | finished |"
        in md
    )
