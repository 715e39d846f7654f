"""Reports: rows from runs on a real MLflow server, markdown, figure and the report artifact."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from experiment_helpers import log_training_run, write_experiment

from pipeline.experiments import report
from pipeline.experiments.report import Row
from pipeline.experiments.spec import load_experiment
from pipeline.tracking import variant_runs


def test_rows_put_paper_and_measured_values_side_by_side(tmp_path, mlflow_env, unique_name):
    exp = load_experiment(write_experiment(tmp_path, unique_name))
    log_training_run(
        mlflow_env, unique_name, "a", "cpu", status="finished", metrics={"sink/sink1": 11.0, "val/loss": 4.0}
    )
    time.sleep(0.01)
    newest_a = log_training_run(
        mlflow_env, unique_name, "a", "cpu", status="finished", metrics={"sink/sink1": 20.0, "val/loss": 4.5}
    )
    time.sleep(0.01)
    log_training_run(
        mlflow_env,
        unique_name,
        "a",
        "cpu",
        status="failed",  # newer, but failed
        metrics={"sink/sink1": 99.0},
    )
    log_training_run(
        mlflow_env,
        unique_name,
        "a",
        "paper",
        status="finished",  # other scale
        metrics={"sink/sink1": 77.0, "val/loss": 3.0},
    )
    log_training_run(mlflow_env, unique_name, "b", "cpu", status="failed", metrics={"sink/sink1": 3.0})

    rows = report.build_rows(exp, variant_runs(mlflow_env, exp.mlflow_experiment, "cpu"))
    a, b, c = rows
    assert (a.paper, a.measured, a.status, a.run_id) == ([15.2, 3.72], [20.0, 4.5], "finished", newest_a)
    assert (b.paper, b.measured, b.status) == ([41.08, None], [3.0, None], "failed")
    assert (c.paper, c.measured, c.status, c.paper_status) == (
        [None, None],
        [None, None],
        "missing",
        "training failure",
    )

    markdown = report.to_markdown(exp, "cpu", rows).splitlines()
    assert (
        "| variant | Sink_1 (%) paper | Sink_1 (%) ours | valid loss paper | valid loss ours | emergence step (Sink_1 > 1% / > 10% / alpha_1 > 1.25 x uniform) | run |"
        in markdown
    )
    assert "| variant a | 15.20 | 20.00 | 3.72 | 4.50 | — | finished |" in markdown
    assert "| variant b | 41.08 | 3.00 | — | — | — | failed |" in markdown
    assert "| variant c | training failure | — | training failure | — | — | missing |" in markdown
    assert "1 of 3 variants finished; — = no value (paper: not published; ours: not run or not logged)." in markdown
    assert "CPU scale (as the experiment file plans it): tiny test setup" in markdown


def test_report_command_writes_logs_and_plots(tmp_path, mlflow_env, unique_name, monkeypatch, capsys):
    path = write_experiment(
        tmp_path, unique_name, plot="plot: {kind: curve, metric: sink/sink1, title: Sink_1 over steps}"
    )
    rising = [(250, 3.0), (500, 2.8), (750, 3.2), (1000, 3.6)]  # b memorises after step 500
    for variant, final in (("a", 30.0), ("b", 10.0)):
        log_training_run(
            mlflow_env,
            unique_name,
            variant,
            "cpu",
            status="finished",
            metrics={"sink/sink1": [(100, final / 3), (200, final)], "val/loss": 4.0 if variant == "a" else rising},
        )
    out = tmp_path / "out"
    assert report.main([str(path), "--scale", "cpu", "--plot", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    md = (out / "report.md").read_text()
    assert md in printed
    assert "| variant a | 15.20 | 30.00 | 3.72 | 4.00 | — | finished |" in md
    assert (
        "Warnings:\n\n- variant b: valid loss rising since step 500 (min 2.800 at 500, 3.600 at 1000): the "
        "model memorises its data; more data or fewer steps\n"
    ) in md and "variant a: valid" not in md
    assert "Steps actually run: variant a 200, variant b 1000." in md  # the runs' last steps, not the plan
    png = out / f"{unique_name}-cpu.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    # Run it again: the experiment's parent run (the one a sweep groups its variants under) is
    # reused and holds both artifacts.
    assert report.main([str(path), "--scale", "cpu", "--plot", "--out", str(out)]) == 0
    exp = mlflow_env.get_experiment_by_name(f"sinklab/{unique_name}")
    reports = mlflow_env.search_runs([exp.experiment_id], "tags.`sinklab.kind` = 'sweep'")
    assert len(reports) == 1
    listed = sorted(f.path for f in mlflow_env.list_artifacts(reports[0].info.run_id, "report-cpu"))
    assert listed == sorted([f"report-cpu/{unique_name}-cpu.png", "report-cpu/report.md"])
    # The parent run is not mistaken for a variant's training run.
    assert set(variant_runs(mlflow_env, exp.name, "cpu")) == {"a", "b"}

    # A report.md that sinklab did not write is never replaced: one line, exit 2, nothing written.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    capsys.readouterr()
    assert report.main([str(path), "--scale", "cpu", "--plot", "--out", str(mine)]) == 2
    assert "already holds report.md, which sinklab did not write" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["report.md"] and (mine / "report.md").read_text() == "my notes"


def test_bar_plot_and_missing_experiment(tmp_path, mlflow_env, unique_name, capsys):
    path = write_experiment(tmp_path, unique_name, plot="plot: {kind: bar, metric: sink/sink1}")
    out = tmp_path / "out"
    assert report.main([str(path), "--plot", "--out", str(out), "--no-log"]) == 0
    md = (out / "report.md").read_text()
    assert "| variant a | 15.20 | — | 3.72 | — | — | missing |" in md
    assert (out / f"{unique_name}-cpu.png").exists()
    assert mlflow_env.get_experiment_by_name(f"sinklab/{unique_name}") is None  # --no-log
    assert report.main(["no-such-experiment"]) == 2
    assert "no experiment 'no-such-experiment'" in capsys.readouterr().err


def test_a_column_the_paper_has_no_number_for_is_shown_once_with_its_decimals(tmp_path, unique_name):
    path = write_experiment(tmp_path, unique_name)
    path.write_text(
        path.read_text().replace(
            "label: valid loss}",
            "label: valid loss}\n  - {key: alpha1, metric: sink/alpha1_mean, label: mean alpha_1, digits: 3}",
        )
    )
    exp = load_experiment(path)
    rows = [
        Row("a", "variant a", [15.2, 3.72, None], [0.0, 4.231, 0.0786], "finished"),
        Row("c", "variant c", [None, None, None], [None, None, None], "missing", "training failure"),
    ]
    markdown = report.to_markdown(exp, "cpu", rows).splitlines()
    assert (
        "| variant | Sink_1 (%) paper | Sink_1 (%) ours | valid loss paper | valid loss ours | mean alpha_1 | "
        "emergence step (Sink_1 > 1% / > 10% / alpha_1 > 1.25 x uniform) | run |" in markdown
    )
    assert "|---|---:|---:|---:|---:|---:|---:|---|" in markdown
    assert "| variant a | 15.20 | 0.00 | 3.72 | 4.23 | 0.079 | — | finished |" in markdown
    assert "| variant c | training failure | — | training failure | — | — | — | missing |" in markdown


KNOWN_RHO = """\
  - {name: a, label: "variant a", overrides: {model.optim.weight_decay: 0.0}, paper: {sink1: 10.0, val_loss: 3.7}}
  - {name: b, label: "variant b", overrides: {model.optim.weight_decay: 0.1}, paper: {sink1: 20.0}}
  - {name: c, label: "variant c", overrides: {model.optim.weight_decay: 0.5}, paper: {sink1: 30.0}}
  - {name: d, label: "variant d", overrides: {model.optim.weight_decay: 1.0}, paper: {sink1: 40.0}}
  - {name: e, label: "variant e", overrides: {model.optim.weight_decay: 5.0}, paper_status: training failure}
"""


def test_agreement_and_emergence_of_a_synthetic_experiment_with_known_rho(tmp_path, mlflow_env, unique_name, capsys):
    path = write_experiment(tmp_path, unique_name, variants=KNOWN_RHO)
    # Sink_1 ours 1, 3, 2, 4 against the paper's 10..40: one swap, rho = 0.8, tau = 4/6.
    # Mean alpha_1 0.1, 0.2, 0.2, 0.4 (a tie): rho = sqrt(0.9), tau-b = 5/sqrt(30).
    runs = {
        "a": {
            "sink/sink1": 1.0,
            "val/loss": 4.0,
            "sink/alpha1_mean": 0.1,
            "sink/alpha1_uniform": 0.074,
            "sink/emerged_step_sink1_1pct": 100.0,
        },
        "b": {"sink/sink1": 3.0, "sink/alpha1_mean": 0.2},  # logged before emergence was tracked
        "c": {
            "sink/sink1": 2.0,
            "sink/alpha1_mean": 0.2,
            "sink/alpha1_uniform": 0.074,
            "sink/emerged_step_sink1_1pct": 200.0,
            "sink/emerged_step_sink1_10pct": 300.0,
            "sink/emerged_step_alpha1_125pct": 150.0,
        },
        "d": {"sink/sink1": 4.0, "sink/alpha1_mean": 0.4},
    }
    for variant, metrics in runs.items():
        log_training_run(mlflow_env, unique_name, variant, "cpu", status="finished", metrics=metrics)
    out = tmp_path / "out"
    assert report.main([str(path), "--scale", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    md = (out / "report.md").read_text()
    assert md in printed
    assert "| variant a | 10.00 | 1.00 | 3.70 | 4.00 | 100 / none / none | finished |" in md
    assert "| variant b | 20.00 | 3.00 | — | — | — | finished |" in md
    assert "| variant c | 30.00 | 2.00 | — | — | 200 / 300 / 150 | finished |" in md
    assert "| variant e | training failure | — | training failure | — | — | missing |" in md
    assert "| measured vs paper | variants | Spearman rho | Kendall tau |" in md
    assert "| Sink_1 (%) | 4 | +0.80 | +0.67 |" in md
    assert "| valid loss | 1 | n/a | n/a |" in md  # one variant with both values: undefined
    assert "| mean alpha_1 (ours) vs Sink_1 (paper) | 4 | +0.95 | +0.91 |" in md

    exp = mlflow_env.get_experiment_by_name(f"sinklab/{unique_name}")
    (logged,) = mlflow_env.search_runs([exp.experiment_id], "tags.`sinklab.kind` = 'sweep'")
    m = logged.data.metrics
    assert m["agreement/sink1/n"] == 4 and m["agreement/sink1/spearman"] == pytest.approx(0.8)
    assert m["agreement/sink1/kendall"] == pytest.approx(2 / 3)
    assert m["agreement/alpha1_vs_sink1/spearman"] == pytest.approx(math.sqrt(0.9))
    assert m["agreement/alpha1_vs_sink1/kendall"] == pytest.approx(5 / math.sqrt(30))
    assert m["agreement/val_loss/n"] == 1 and math.isnan(m["agreement/val_loss/spearman"])


def test_agreement_without_runs_is_not_available(tmp_path):
    exp = load_experiment(write_experiment(tmp_path, "agreement-offline", variants=KNOWN_RHO))
    rows = report.build_rows(exp, {})
    found = report.agreement(exp, rows)
    assert [(a.key, a.n, a.rho, a.tau) for a in found] == [
        ("sink1", 0, None, None),
        ("val_loss", 0, None, None),
        ("alpha1_vs_sink1", 0, None, None),
    ]
    assert "| Sink_1 (%) | 0 | n/a | n/a |" in report.to_markdown(exp, "cpu", rows)


def test_lr_steps_plot_is_sink1_over_steps_per_learning_rate(tmp_path, mlflow_env, unique_name, capsys):
    """`sinklab report lr-steps --plot`: the paper's Figure 4 (right) from the runs' histories."""
    source = Path("configs/experiments/optimisation/lr-steps.yaml").read_text()
    path = tmp_path / f"{unique_name}.yaml"
    path.write_text(source.replace("name: lr-steps", f"name: {unique_name}", 1))
    exp = load_experiment(path)
    assert exp.plot.kind == "curve" and exp.plot.metric == "sink/sink1"
    histories = {
        "lr8e-4-10k": [(0, 0.0), (250, 4.0), (500, 12.0)],
        "lr4e-4-20k": [(0, 0.0), (500, 0.5), (1000, 6.0)],
        "lr1e-4-20k": [(0, 0.0), (500, 0.0), (1000, 0.2)],
    }
    for variant, history in histories.items():
        log_training_run(
            mlflow_env, unique_name, variant, "cpu", status="finished", metrics={"sink/sink1": history, "val/loss": 4.5}
        )
    rows = report.build_rows(exp, variant_runs(mlflow_env, exp.mlflow_experiment, "cpu"))
    series = report.curve_series(exp, rows, mlflow_env)
    assert series == {
        "lr 8e-4, 10k steps": histories["lr8e-4-10k"],
        "lr 4e-4, 20k steps (default)": histories["lr4e-4-20k"],
        "lr 1e-4, 20k steps": histories["lr1e-4-20k"],
    }
    out = tmp_path / "out"
    assert report.main([str(path), "--plot", "--out", str(out), "--no-log"]) == 0
    png = out / f"{unique_name}-cpu.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "| Sink_1 (%) | 3 | +1.00 | +1.00 |" in capsys.readouterr().out  # 23.44 > 18.18 > 2.90


def test_bars_show_a_measured_zero_and_mark_a_missing_value():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    report.labelled_bars(ax, [0, 1, 2], [0.0, None, 12.5], "ours")
    assert [t.get_text() for t in ax.texts] == ["0.00", "—", "12.50"]
    zero_stub = [b for b in ax.patches if b.get_x() < 0.5 and b.get_height() > 0]
    assert zero_stub, "a measured 0 draws nothing"
    plt.close(fig)


def test_the_bar_figure_shows_the_mean_alpha1_its_agreement_uses(tmp_path, unique_name):
    from PIL import Image

    exp = load_experiment(write_experiment(tmp_path, unique_name, plot="plot: {kind: bar, metric: sink/sink1}"))
    rows = [
        Row("a", "variant a", [15.2, 3.72], [0.0, 4.2], "finished", alpha1=0.071),
        Row("b", "variant b", [41.08, None], [0.0, 4.1], "finished", alpha1=0.093),
    ]
    narrow = report.plot(exp, [Row(**{**r.__dict__, "alpha1": None}) for r in rows], None, tmp_path / "n.png")
    wide = report.plot(exp, rows, None, tmp_path / "w.png")
    assert Image.open(wide).width > 1.4 * Image.open(narrow).width  # a second panel: mean α₁ per variant
