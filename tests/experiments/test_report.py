"""Reports: rows from runs on a real MLflow server, markdown, figure and the report artifact."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from experiment_helpers import log_training_run, write_experiment

from pipeline.experiments import report, report_plot, run_table
from pipeline.experiments.agreement import compare
from pipeline.experiments.report import Row
from pipeline.experiments.spec import load_experiment
from pipeline.experiments.stats import spread
from pipeline.tracking import RunSummary, variant_runs
from sinklab_io.outputs import write_output

HEADER = (
    "| variant | seeds | Sink_1 (%) paper | Sink_1 (%) ours | valid loss paper | valid loss ours | "
    "emerged: Sink_1 > 10% | emerged: alpha_1 > 1.25 x uniform | runs |"
)


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
    log_training_run(
        mlflow_env, unique_name, "a", "cpu", status="finished", metrics={"sink/sink1": 30.0, "val/loss": 4.7}, seed=1235
    )
    log_training_run(mlflow_env, unique_name, "b", "cpu", status="failed", metrics={"sink/sink1": 3.0})

    rows = report.build_rows(exp, variant_runs(mlflow_env, exp.mlflow_experiment, "cpu"))
    a, b, c = rows
    # per seed the newest finished run: seed 1234's 20.0 (not the older 11.0 or the failed 99.0), seed 1235's 30.0
    assert [r.seed for r in a.runs] == [1234, 1235] and a.runs[0].run_id == newest_a
    assert (a.paper, a.measured[0].values, a.measured[1].values, a.status) == (
        [15.2, 3.72],
        (20.0, 30.0),
        (4.5, 4.7),
        "2 finished",
    )
    assert (b.paper, b.measured[0].values, b.measured[1].n, b.status) == ([41.08, None], (3.0,), 0, "1 failed")
    assert (c.measured[0].n, c.status, c.paper_status) == (0, "missing", "training failure")

    markdown = report.to_markdown(exp, "cpu", rows).splitlines()
    assert HEADER in markdown
    # 20 and 30: mean 25, std 5·√2, half-width t(0.975, 1)·5 = 63.53, clipped to Sink_1's [0, 100];
    # 4.5 and 4.7: half-width 1.27
    assert "| variant a | 2 | 15.20 | 25.00 [0.00, 88.53] | 3.72 | 4.60 [3.33, 5.87] | — | — | 2 finished |" in markdown
    assert "| variant b | 1 | 41.08 | 3.00 | — | — | — | — | 1 failed |" in markdown
    assert "| variant c | 0 | training failure | — | training failure | — | — | — | missing |" in markdown
    assert "| variant a | valid loss | 2 | 4.60 | 0.14 | [3.33, 5.87] | 4.50 (s1234), 4.70 (s1235) |" in markdown
    assert markdown.count("| variant b | Sink_1 (%) | 1 | 3.00 | — | — | 3.00 (s1234) |") == 1
    assert "- Sink_1 (%): " not in "\n".join(markdown)  # one seed for b: no ordering claimed
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
    assert "| variant a | 1 | 15.20 | 30.00 | 3.72 | 4.00 | — | — | 1 finished |" in md
    assert (
        "Warnings:\n\n- variant b (seed 1234): valid loss rising since step 500 (min 2.800 at 500, 3.600 at 1000): the "
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
    assert listed == sorted([f"report-cpu/{unique_name}-cpu.png", "report-cpu/report.md", "report-cpu/report.json"])
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
    # nor one that the command wrote for another subject
    write_output(tmp_path / "res" / "report.json", "{}", "sinklab report of other at scale cpu")
    assert report.main([str(path), "--scale", "cpu", "--out", str(tmp_path / "res")]) == 2
    assert "already holds report.json, which sinklab report of other at scale cpu wrote" in capsys.readouterr().err
    assert (tmp_path / "res" / "report.json").read_text() == "{}" and not (tmp_path / "res" / "report.md").exists()


def test_bar_plot_and_missing_experiment(tmp_path, mlflow_env, unique_name, capsys):
    path = write_experiment(tmp_path, unique_name, plot="plot: {kind: bar, metric: sink/sink1}")
    out = tmp_path / "out"
    assert report.main([str(path), "--plot", "--out", str(out), "--no-log"]) == 0
    md = (out / "report.md").read_text()
    assert "| variant a | 0 | 15.20 | — | 3.72 | — | — | — | missing |" in md
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
        Row(
            "a",
            "variant a",
            [15.2, 3.72, None],
            [spread([v]) for v in (0.0, 4.231, 0.0786)],
            "1 finished",
            alpha1=spread([0.0786]),
        ),
        Row("c", "variant c, Z = max(|sum|, 1)", [None, None, None], [spread([])] * 3, "missing", "training failure"),
    ]
    markdown = report.to_markdown(exp, "cpu", rows).splitlines()
    assert (
        "| variant | seeds | Sink_1 (%) paper | Sink_1 (%) ours | valid loss paper | valid loss ours | mean alpha_1 | "
        "emerged: Sink_1 > 10% | emerged: alpha_1 > 1.25 x uniform | runs |" in markdown
    )
    assert "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|" in markdown
    assert "| variant a | 0 | 15.20 | 0.00 | 3.72 | 4.23 | 0.079 | — | — | 1 finished |" in markdown
    assert sum(line.startswith("| variant a | mean alpha_1 |") for line in markdown) == 1  # the column, once
    assert (
        r"| variant c, Z = max(\|sum\|, 1) | 0 | training failure | — | training failure | — | — | — | — | missing |"
        in markdown
    )


KNOWN_RHO = """\
  - {name: a, label: "variant a", overrides: {optim.weight_decay: 0.0}, paper: {sink1: 10.0, val_loss: 3.7}}
  - {name: b, label: "variant b", overrides: {optim.weight_decay: 0.1}, paper: {sink1: 20.0}}
  - {name: c, label: "variant c", overrides: {optim.weight_decay: 0.5}, paper: {sink1: 30.0}}
  - {name: d, label: "variant d", overrides: {optim.weight_decay: 1.0}, paper: {sink1: 40.0}}
  - {name: e, label: "variant e", overrides: {optim.weight_decay: 5.0}, paper_status: training failure}
"""


def test_agreement_and_emergence_of_a_synthetic_experiment_with_known_rho(tmp_path, mlflow_env, unique_name, capsys):
    path = write_experiment(tmp_path, unique_name, variants=KNOWN_RHO)
    # Sink_1 ours 1, 3, 2, 4 against the paper's 10..40: one swap, rho = 0.8, tau = 4/6.
    # Mean alpha_1 0.1, 0.2, 0.2, 0.4 (a tie): rho = sqrt(0.9), tau-b = 5/sqrt(30).
    # Two seeds each that agree: the bootstrap interval is exactly the value.
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
        for seed in (1234, 1235):
            log_training_run(mlflow_env, unique_name, variant, "cpu", status="finished", metrics=metrics, seed=seed)
    out = tmp_path / "out"
    assert report.main([str(path), "--scale", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    md = (out / "report.md").read_text()
    assert md in printed
    assert (
        "| variant a | 2 | 10.00 | 1.00 [1.00, 1.00] | 3.70 | 4.00 [4.00, 4.00] | never, 0/2 | never, 0/2 | 2 finished |"
        in md
    )
    assert "| variant b | 2 | 20.00 | 3.00 [3.00, 3.00] | — | — | — | — | 2 finished |" in md
    assert "| variant c | 2 | 30.00 | 2.00 [2.00, 2.00] | — | — | 300, 2/2 | 150, 2/2 | 2 finished |" in md
    assert "| variant e | 0 | training failure | — | training failure | — | — | — | missing |" in md
    # rho 0.8 over 4 variants: 4 of the 24 permutations reach it, so p = 0.17 and no verdict; with the mean
    # alpha_1's p = 2/24 the family holds 2 rows, and Holm gives both 2 · 2/24 = 0.17
    assert (
        "| Sink_1 (%) | 4 | 2 | +0.80 [+0.80, +0.80] | 0.17 (all 24) | 0.17 | 2000/2000 | +0.67 [+0.67, +0.67] | 4 | "
        "no verdict: p = 0.17, Holm 0.17: not below 0.025 |" in md
    )
    assert "| valid loss | 1 | 2 | — | — | — | — | — | 1 | undefined |" in md
    assert "| mean alpha_1 (ours) vs Sink_1 (paper) | 4 | 2 | +0.95 [+0.95, +0.95] | 0.083 (all 24) | 0.17 |" in md
    assert "family of this report, its 2 rows with a p (Sink_1 (%), mean alpha_1 (ours) vs Sink_1 (paper))" in md
    # seeds that agree: Welch's t is infinite, and the exact permutation p of 2 seeds against 2 is at least 2/6
    assert "- Sink_1 (%): d 4.00, b 3.00, c 2.00, a 1.00; every pair not resolved at 2 seeds\n" in md

    exp = mlflow_env.get_experiment_by_name(f"sinklab/{unique_name}")
    (logged,) = mlflow_env.search_runs([exp.experiment_id], "tags.`sinklab.kind` = 'sweep'")
    m = logged.data.metrics
    assert m["agreement/sink1/n"] == 4 and m["agreement/sink1/spearman"] == pytest.approx(0.8)
    assert m["agreement/sink1/spearman_lo"] == m["agreement/sink1/spearman_hi"] == pytest.approx(0.8)
    assert m["agreement/sink1/min_seeds"] == 2 and m["agreement/sink1/kendall"] == pytest.approx(2 / 3)
    assert (m["agreement/sink1/spearman_p"], m["agreement/sink1/permutations"]) == (pytest.approx(4 / 24), 24)
    assert (m["agreement/sink1/spearman_p_holm"], m["agreement/sink1/family"]) == (pytest.approx(4 / 24), 2)
    assert (m["agreement/sink1/spearman_defined"], m["agreement/sink1/resamples"]) == (2000, 2000)
    assert m["agreement/sink1/distinct"] == 4 and math.isnan(m["agreement/val_loss/spearman_p"])
    assert m["agreement/alpha1_vs_sink1/spearman"] == pytest.approx(math.sqrt(0.9))
    assert m["agreement/alpha1_vs_sink1/kendall"] == pytest.approx(5 / math.sqrt(30))
    assert m["agreement/val_loss/n"] == 1 and math.isnan(m["agreement/val_loss/spearman"])
    assert (m["seeds/c/sink1/n"], m["seeds/c/sink1/mean"], m["seeds/c/sink1/std"]) == (2, 2.0, 0.0)
    assert m["seeds/d/alpha1_mean/lo"] == m["seeds/d/alpha1_mean/hi"] == pytest.approx(0.4)
    assert math.isnan(m["seeds/e/sink1/mean"])
    saved = json.loads((out / "report.json").read_text())
    assert saved["variants"][2]["columns"]["sink1"]["values"] == [2.0, 2.0]
    assert saved["agreement"][0]["verdict"] == "no verdict: p = 0.17, Holm 0.17: not below 0.025"
    assert (saved["agreement"][0]["p_holm"], saved["agreement"][0]["family"]) == (pytest.approx(4 / 24), 2)
    assert saved["agreement"][0]["p"] == {"p": 4 / 24, "p_reversed": 23 / 24, "permutations": 24, "exact": True}
    assert saved["agreement"][0]["rho_interval"]["defined"] == 2000


def run(variant: str, seed: int, **metrics) -> RunSummary:
    return RunSummary(f"{variant}{seed}", variant, "finished", seed, metrics=metrics, seed=seed)


def test_noisy_seeds_leave_the_ordering_undecided(tmp_path):
    """Means in the paper's order (rho 1) whose seeds overlap: the bootstrap interval includes 0, so
    the report does not call the ordering reproduced, and no two variants are apart."""
    exp = load_experiment(write_experiment(tmp_path, "noisy", variants=KNOWN_RHO))
    values = {"a": [0.0, 5.0, 10.0], "b": [2.0, 6.0, 9.0], "c": [4.0, 5.0, 11.0], "d": [3.0, 8.0, 10.0]}
    runs_by_variant = {v: [run(v, 1234 + i, **{"sink/sink1": x}) for i, x in enumerate(xs)] for v, xs in values.items()}
    rows = report.build_rows(exp, runs_by_variant)
    (sink1, *_) = report.agreement(exp, rows)
    assert sink1.rho == pytest.approx(1.0) and sink1.min_seeds == 3
    assert sink1.rho_interval.lo < 0 < sink1.rho_interval.hi and sink1.p.p == 1 / 24
    lo, hi = sink1.rho_interval.lo, sink1.rho_interval.hi
    # 1/24 alone in its family: not below 0.025 either
    failed = f"no verdict: the interval [{lo:+.2f}, {hi:+.2f}] includes 0; p = 0.042, Holm 0.042: not below 0.025"
    assert sink1.verdict == failed
    md = report.to_markdown(exp, "cpu", rows)
    assert f"Verdict: Sink_1 (%): {failed}; valid loss: " in md
    assert "- Sink_1 (%): d 7.00, c 6.67, b 5.67, a 5.00; every pair not resolved at 3 seeds\n" in md
    assert "within the noise" not in md


def seeds(*means: float) -> list:
    """One variant per mean, three seeds each at mean - 0.1, mean, mean + 0.1."""
    return [spread([m - 0.1, m, m + 0.1]) for m in means]


def test_a_two_variant_study_gets_no_directional_verdict():
    """Two variants always rank at rho = +1 or -1: with seeds that agree the interval is exact, but
    2 permutations give p = 0.5 and two values are too few for an ordering."""
    two = compare("sink1", "Sink_1 (%)", seeds(1.0, 5.0), [10.0, 20.0])
    assert (two.rho, two.rho_interval.lo, two.rho_interval.hi, two.p.p) == (1.0, 1.0, 1.0, 0.5)
    assert two.verdict == "no verdict: too few distinct values: 2; p = 0.5: not below 0.025"


def test_a_six_variant_perfect_ordering_is_reproduced_at_p_one_in_720():
    six = compare("val_loss", "valid loss", seeds(1.0, 2.0, 3.0, 4.0, 5.0, 6.0), [3.1, 3.2, 3.3, 3.4, 3.5, 3.6])
    assert (six.p.p, six.p.permutations, six.distinct) == (1 / 720, 720, 6)
    assert six.verdict == "ordering reproduced"
    assert compare("val_loss", "valid loss", seeds(6.0, 5.0, 4.0, 3.0, 2.0, 1.0), [1, 2, 3, 4, 5, 6]).verdict == (
        "ordering reversed"
    )


def test_ties_at_a_floor_count_once():
    """Six variants at Sink_1 = 0 in every seed, one at 0.001 (0.00 as printed) and one at 7: rho's
    interval lies above 0 and p = 1/56, but the means take two values, so there is no verdict."""
    floor = [spread([0.0, 0.0, 0.0]) for _ in range(6)] + [spread([0.0, 0.0, 0.003]), spread([6.0, 7.0, 8.0])]
    found = compare("sink1", "Sink_1 (%)", floor, [1, 2, 3, 4, 5, 6, 7, 8], 2, (0.0, 100.0))
    assert found.rho_interval.lo > 0 and found.p.p == pytest.approx(1 / 56) and found.tau > 0
    assert found.verdict == "no verdict: too few distinct values: 2"
    assert compare("sink1", "Sink_1 (%)", floor, [1, 2, 3, 4, 5, 6, 7, 8], 3, (0.0, 100.0)).distinct == 3


SIX = "".join(
    f'- {{name: v{i}, label: "v{i}", overrides: {{optim.weight_decay: 0.{i}}}, paper: {{sink1: {i}.0, val_loss: 3.{i}}}}}\n'
    for i in range(1, 7)
)


def test_a_reversal_at_one_sided_p_0_04_gets_no_verdict_and_the_report_names_its_family(tmp_path):
    """Six variants whose Sink_1 means run against the paper's at a reversed-tail p of 28/720 = 0.039: below the
    one-sided 0.05 a chosen tail used to pass, not below 0.025; valid loss in the paper's order (p = 1/720)."""
    exp = load_experiment(write_experiment(tmp_path, "six", variants=SIX))
    sink1, loss = seeds(3.0, 3.0, 4.0, 2.0, 2.0, 1.0), seeds(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    rows = [
        Row(f"v{i}", f"v{i}", [float(i), 3.0 + i / 10], [sink1[i - 1], loss[i - 1]], "3 finished") for i in range(1, 7)
    ]
    found, *_ = report.agreement(exp, rows)
    assert found.rho < 0 and found.tau < 0 and found.rho_interval.hi < 0 and found.distinct == 4
    assert found.p.p_reversed == pytest.approx(28 / 720)
    md = report.to_markdown(exp, "cpu", rows)
    # Holm over the family of 2: 1/720 · 2 = 0.0028 for valid loss, then max(0.0028, 28/720) for Sink_1
    assert "| 0.039 (all 720) | 0.039 | 2000/2000 |" in md and "| 0.0014 (all 720) | 0.0028 | 2000/2000 |" in md
    assert "no verdict: p = 0.039 for a reversal, Holm 0.039: not below 0.025 |" in md
    assert "| 6 | ordering reproduced |" in md and "ordering reversed" not in md
    assert "Holm p: p after Holm's step-down adjustment over the family of this report, its 2 rows with a p " in md
    assert "(Sink_1 (%), valid loss)" in md and "| p | Holm p |" in md


def test_a_statistic_that_is_not_defined_prints_a_dash_and_the_legend_says_why(tmp_path):
    """Means alike at the printed precision give no rho (a rho of the unseen digits would print as if ranked),
    and an undefined rho gets no resampled range (its resamples would rank the seeds' noise)."""
    alike = compare("val_loss", "valid loss", seeds(4.3671, 4.3672, 4.3674), [3.1, 3.2, 3.3])
    assert (alike.rho, alike.tau, alike.p, alike.rho_interval, alike.distinct) == (None, None, None, None, 1)
    assert alike.verdict == "undefined"
    assert compare("val_loss", "valid loss", seeds(4.3671, 4.3672, 4.3674), [3.1, 3.2, 3.3], 4).rho == 1.0
    equal = [spread([1.0, 2.0, 3.0]), spread([0.0, 2.0, 4.0]), spread([2.5, 2.0, 1.5])]  # every mean 2
    flat = compare("sink1", "Sink_1 (%)", equal, [1.0, 2.0, 3.0])
    assert (flat.rho, flat.rho_interval, flat.tau_interval) == (None, None, None)
    exp = load_experiment(write_experiment(tmp_path, "flat"))
    rows = [Row(n, n, [p, None], [s, spread([])], "3 finished") for n, p, s in zip("abc", (15.2, 41.08, 7.0), equal)]
    md = report.to_markdown(exp, "cpu", rows)
    assert "| Sink_1 (%) | 3 | 3 | — | — | — | — | — | 1 | undefined |" in md and "[-1.00, +1.00]" not in md
    assert md.count("— for rho, tau and p: not defined") == 1 and "family of this report, empty" in md


def test_agreement_without_runs_is_not_available(tmp_path):
    exp = load_experiment(write_experiment(tmp_path, "agreement-offline", variants=KNOWN_RHO))
    rows = report.build_rows(exp, {})
    found = report.agreement(exp, rows)
    assert [(a.key, a.n, a.rho, a.tau) for a in found] == [
        ("sink1", 0, None, None),
        ("val_loss", 0, None, None),
        ("alpha1_vs_sink1", 0, None, None),
    ]
    assert "| Sink_1 (%) | 0 | 0 | — | — | — | — | — | 0 | undefined |" in report.to_markdown(exp, "cpu", rows)


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
    series = report_plot.curve_series(exp, rows, mlflow_env)
    assert series == {
        "lr 8e-4, 10k steps": [(1234, histories["lr8e-4-10k"])],
        "lr 4e-4, 20k steps (default)": [(1234, histories["lr4e-4-20k"])],
        "lr 1e-4, 20k steps": [(1234, histories["lr1e-4-20k"])],
    }
    out = tmp_path / "out"
    assert report.main([str(path), "--plot", "--out", str(out), "--no-log"]) == 0
    png = out / f"{unique_name}-cpu.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    # 23.44 > 18.18 > 2.90; one seed each: no interval, so no verdict
    assert "| Sink_1 (%) | 3 | 1 | +1.00 | 0.17 (all 6) | 0.17 | — | +1.00 | 3 | no verdict (one seed for some" in (
        capsys.readouterr().out
    )


def test_bars_show_a_measured_zero_and_mark_a_missing_value():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    report_plot.labelled_bars(ax, [0, 1, 2], [0.0, None, 12.5], "ours")
    assert [t.get_text() for t in ax.texts] == ["0.00", "—", "12.50"]
    zero_stub = [b for b in ax.patches if b.get_x() < 0.5 and b.get_height() > 0]
    assert zero_stub, "a measured 0 draws nothing"
    plt.close(fig)


def test_the_bar_figure_shows_the_mean_alpha1_its_agreement_uses(tmp_path, unique_name):
    from PIL import Image

    exp = load_experiment(write_experiment(tmp_path, unique_name, plot="plot: {kind: bar, metric: sink/sink1}"))
    rows = [
        Row(
            "a",
            "variant a",
            [15.2, 3.72],
            [spread([0.0, 0.0]), spread([4.2, 4.3])],
            "2 finished",
            alpha1=spread([0.071, 0.08]),
        ),
        Row("b", "variant b", [41.08, None], [spread([0.0]), spread([4.1])], "1 finished", alpha1=spread([0.093])),
    ]
    narrow = report_plot.plot(
        exp, [Row(**{**r.__dict__, "alpha1": spread([])}) for r in rows], None, tmp_path / "n.png", "sinklab report"
    )
    wide = report_plot.plot(exp, rows, None, tmp_path / "w.png", "sinklab report")
    assert Image.open(wide).width > 1.4 * Image.open(narrow).width  # a second panel: mean α₁ per variant


def test_the_results_page_keeps_its_prose_and_refuses_a_page_it_did_not_write(
    tmp_path, mlflow_env, unique_name, capsys
):
    path = write_experiment(tmp_path, unique_name)
    log_training_run(
        mlflow_env, unique_name, "a", "cpu", status="finished", metrics={"sink/sink1": 30.0, "val/loss": 4.0}
    )
    docs, out = tmp_path / "docs", tmp_path / "out"
    argv = [str(path), "--scale", "cpu", "--out", str(out), "--docs", str(docs), "--no-log"]
    assert report.main(argv) == 0
    page = docs / f"{unique_name}.md"
    text = page.read_text()
    assert text.startswith(f"# {unique_name}\n\nWritten by `sinklab report {unique_name} --scale cpu --docs DIR` from ")
    assert (out / "report.md").read_text() in text  # the tables as printed, agreement and verdict included
    assert "| variant a | 1 | 15.20 | 30.00 | 3.72 | 4.00 | — | — | 1 finished |" in text
    assert f"| [{unique_name}]({unique_name}.md) |" in (docs / "README.md").read_text()

    # a person writes inside the prose region; a run with new values replaces the tables and keeps the prose
    start, end = run_table.PROSE
    page.write_text(text.replace(f"{start}\n{end}", f"{start}\nWhy a leads.\n{end}"))
    log_training_run(mlflow_env, unique_name, "a", "cpu", status="finished", metrics={"sink/sink1": 40.0}, seed=1235)
    assert report.main(argv) == 0
    again = page.read_text()
    assert f"{start}\nWhy a leads.\n{end}\n" in again and "| variant a | 2 | 15.20 | 35.00 [" in again

    # an edit outside the region, or a page the command did not write, is refused in one line
    page.write_text(again.replace("Written by", "Typed by"))
    capsys.readouterr()
    assert report.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"already holds {unique_name}.md, which sinklab did not write" in err
    assert page.read_text() == again.replace("Written by", "Typed by")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / f"{unique_name}.md").write_text("my notes")
    assert report.main([*argv[:5], "--docs", str(mine), "--no-log"]) == 2
    assert "which sinklab did not write" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == [f"{unique_name}.md"]
