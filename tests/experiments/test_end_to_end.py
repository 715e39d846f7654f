"""A real small sweep: two variants x two seeds of the micro model through `sinklab fit` (each run
forked from the sweep's warm worker), logged to the MLflow server fixture, then the report."""

from __future__ import annotations

import json
import re

from experiment_helpers import micro_recipe, write_experiment
from packed_datasets import make_dataset

from pipeline.experiments import report, sweep

VARIANTS = """\
- {name: softmax, label: "softmax", overrides: {arch.attention.op: softmax}, paper: {sink1: 18.18, val_loss: 3.73}}
- {name: sigmoid, label: "sigmoid, Z = 1", overrides: {arch.attention.op: sigmoid, arch.attention.normalizer: none}, paper: {sink1: 0.44, val_loss: 3.70}}
"""


def logged(run_dir, metric):
    return [
        row[metric] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if metric in row
    ]


def test_a_two_seed_sweep_runs_every_variant_and_seed_once_and_the_report_shows_their_spread(
    tmp_path, mlflow_env, unique_name, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    recipe = micro_recipe(tmp_path, make_dataset(tmp_path / "dataset"), steps=5)
    path = write_experiment(tmp_path, unique_name, recipe=recipe, variants=VARIANTS)
    runs = tmp_path / "runs" / unique_name / "cpu"
    args = [str(path), "--scale", "cpu", "--local", "--runs-root", str(tmp_path / "runs")]

    assert sweep.main([*args, "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "checked 2 configs with the `sinklab fit` parser" in out
    assert re.search(r"\[1/2\] softmax s1234: done in \d+ s", out) and re.search(r"\[2/2\] sigmoid s1234: done", out)

    # A second seed: only the new runs, forked from the worker like the first ones.
    assert sweep.main([*args, "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "softmax s1234                  skip (finished)" in out and "[1/2] softmax s1235: done" in out
    assert "[2/2] sigmoid s1235: done" in out and "[3/" not in out
    for variant in ("softmax", "sigmoid"):
        for seed in (1234, 1235):
            run_dir = runs / variant / f"s{seed}"
            config = (run_dir / "config.yaml").read_text()
            assert (run_dir / "mlflow_run_id").exists() and f"seed_everything: {seed}" in config
    # the seed moves the initialisation and the data order: the first training losses differ
    assert logged(runs / "softmax" / "s1234", "train/loss")[0] != logged(runs / "softmax" / "s1235", "train/loss")[0]

    assert sweep.main([*args, "--seeds", "2"]) == 0  # idempotent
    assert "nothing to run: every variant and seed has finished" in capsys.readouterr().out

    assert report.main([str(path), "--out", str(tmp_path / "report")]) == 0
    rows = report.build_rows(
        report.load_experiment(path), report.tracking.variant_runs(mlflow_env, f"sinklab/{unique_name}", "cpu")
    )
    assert [(r.variant, r.status, [run.seed for run in r.runs]) for r in rows] == [
        ("softmax", "2 finished", [1234, 1235]),
        ("sigmoid", "2 finished", [1234, 1235]),
    ]
    for row in rows:
        sink1, val_loss = row.measured
        last = [logged(runs / row.variant / f"s{seed}", "val/loss")[-1] for seed in (1234, 1235)]
        assert val_loss.values == tuple(last) and val_loss.n == 2 and val_loss.lo < val_loss.mean < val_loss.hi
        assert all(0.0 <= v <= 100.0 for v in sink1.values)
        assert [r.run_id for r in row.runs] == [
            (runs / row.variant / f"s{seed}" / "mlflow_run_id").read_text().strip() for seed in (1234, 1235)
        ]
    md = (tmp_path / "report" / "report.md").read_text()
    loss = rows[0].measured[1]
    assert (
        f"| softmax | 2 | 18.18 | {report.fmt_spread(rows[0].measured[0])} | 3.73 | {report.fmt_spread(loss)} |" in md
    )
    assert f"| softmax | valid loss | 2 | {loss.mean:.2f} | {loss.std:.2f} | [{loss.lo:.2f}, {loss.hi:.2f}] |" in md
    assert "| valid loss | 2 | 2 | " in md  # the agreement over 2 variants of 2 seeds, with its interval
