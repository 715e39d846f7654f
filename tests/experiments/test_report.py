"""Reports: rows from runs on a real MLflow server, markdown, figure and the report artifact."""
from __future__ import annotations

import time

from pipeline.experiments import report
from pipeline.experiments.report import Row
from pipeline.experiments.runs import variant_runs
from pipeline.experiments.spec import load_experiment

from experiment_helpers import log_training_run, write_experiment


def test_rows_put_paper_and_measured_values_side_by_side(tmp_path, mlflow_env, unique_name):
    exp = load_experiment(write_experiment(tmp_path, unique_name))
    log_training_run(mlflow_env, unique_name, "a", "cpu", status="finished",
                     metrics={"sink/sink1": 11.0, "val/loss": 4.0})
    time.sleep(0.01)
    newest_a = log_training_run(mlflow_env, unique_name, "a", "cpu", status="finished",
                                metrics={"sink/sink1": 20.0, "val/loss": 4.5})
    time.sleep(0.01)
    log_training_run(mlflow_env, unique_name, "a", "cpu", status="failed",  # newer, but failed
                     metrics={"sink/sink1": 99.0})
    log_training_run(mlflow_env, unique_name, "a", "paper", status="finished",  # other scale
                     metrics={"sink/sink1": 77.0, "val/loss": 3.0})
    log_training_run(mlflow_env, unique_name, "b", "cpu", status="failed", metrics={"sink/sink1": 3.0})

    rows = report.build_rows(exp, variant_runs(mlflow_env, exp.mlflow_experiment, "cpu"))
    a, b, c = rows
    assert (a.paper, a.measured, a.status, a.run_id) == ([15.2, 3.72], [20.0, 4.5], "finished", newest_a)
    assert (b.paper, b.measured, b.status) == ([41.08, None], [3.0, None], "failed")
    assert (c.paper, c.measured, c.status, c.paper_status) == ([None, None], [None, None], "missing",
                                                              "training failure")

    markdown = report.to_markdown(exp, "cpu", rows).splitlines()
    assert "| variant | Sink_1 (%) paper | Sink_1 (%) ours | valid loss paper | valid loss ours | run |" in markdown
    assert "| variant a | 15.20 | 20.00 | 3.72 | 4.50 | finished |" in markdown
    assert "| variant b | 41.08 | 3.00 | — | — | failed |" in markdown
    assert "| variant c | training failure | — | training failure | — | missing |" in markdown
    assert "1 of 3 variants finished; — = no value (paper: not published; ours: not run or not logged)." in markdown
    assert "CPU scale: tiny test setup" in markdown


def test_report_command_writes_logs_and_plots(tmp_path, mlflow_env, unique_name, monkeypatch, capsys):
    path = write_experiment(tmp_path, unique_name,
                            plot="plot: {kind: curve, metric: sink/sink1, title: Sink_1 over steps}")
    for variant, final in (("a", 30.0), ("b", 10.0)):
        log_training_run(mlflow_env, unique_name, variant, "cpu", status="finished",
                         metrics={"sink/sink1": [(100, final / 3), (200, final)], "val/loss": 4.0})
    out = tmp_path / "out"
    assert report.main([str(path), "--scale", "cpu", "--plot", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    md = (out / "report.md").read_text()
    assert md in printed
    assert "| variant a | 15.20 | 30.00 | 3.72 | 4.00 | finished |" in md
    png = out / f"{unique_name}-cpu.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    # Run it again: the same report run is reused and holds both artifacts.
    assert report.main([str(path), "--scale", "cpu", "--plot", "--out", str(out)]) == 0
    exp = mlflow_env.get_experiment_by_name(f"sinklab/{unique_name}")
    reports = mlflow_env.search_runs([exp.experiment_id], "tags.`sinklab.kind` = 'report'")
    assert len(reports) == 1
    listed = sorted(f.path for f in mlflow_env.list_artifacts(reports[0].info.run_id, "report-cpu"))
    assert listed == sorted([f"report-cpu/{unique_name}-cpu.png", "report-cpu/report.md"])
    # The report run is not mistaken for a variant's training run.
    assert set(variant_runs(mlflow_env, exp.name, "cpu")) == {"a", "b"}


def test_bar_plot_and_missing_experiment(tmp_path, mlflow_env, unique_name, capsys):
    path = write_experiment(tmp_path, unique_name, plot="plot: {kind: bar, metric: sink/sink1}")
    out = tmp_path / "out"
    assert report.main([str(path), "--plot", "--out", str(out), "--no-log"]) == 0
    md = (out / "report.md").read_text()
    assert "| variant a | 15.20 | — | 3.72 | — | missing |" in md
    assert (out / f"{unique_name}-cpu.png").exists()
    assert mlflow_env.get_experiment_by_name(f"sinklab/{unique_name}") is None  # --no-log
    assert report.main(["no-such-experiment"]) == 2
    assert "no experiment 'no-such-experiment'" in capsys.readouterr().err


def test_a_column_the_paper_has_no_number_for_is_shown_once_with_its_decimals(tmp_path, unique_name):
    path = write_experiment(tmp_path, unique_name)
    path.write_text(path.read_text().replace(
        "label: valid loss}", "label: valid loss}\n  - {key: alpha1, metric: sink/alpha1_mean, label: mean alpha_1, digits: 3}"))
    exp = load_experiment(path)
    rows = [Row("a", "variant a", [15.2, 3.72, None], [0.0, 4.231, 0.0786], "finished"),
            Row("c", "variant c", [None, None, None], [None, None, None], "missing", "training failure")]
    markdown = report.to_markdown(exp, "cpu", rows).splitlines()
    assert ("| variant | Sink_1 (%) paper | Sink_1 (%) ours | valid loss paper | valid loss ours | mean alpha_1 | run |"
            in markdown)
    assert "|---|---:|---:|---:|---:|---:|---|" in markdown
    assert "| variant a | 15.20 | 0.00 | 3.72 | 4.23 | 0.079 | finished |" in markdown
    assert "| variant c | training failure | — | training failure | — | — | missing |" in markdown
