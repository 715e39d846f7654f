"""Results as data: a report's runs as one table, read from MLflow or from the study's data file, the same page
from either, and the results pages in docs/results that `sinklab report --docs` may regenerate."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from experiment_helpers import log_training_run, write_experiment

from pipeline.experiments import report, run_table
from pipeline.experiments.agreement import Agreement, adjust, from_data
from pipeline.experiments.spec import load_experiment
from pipeline.experiments.stats import Interval, Permutation
from pipeline.tracking import RunSummary
from sinklab_io.outputs import MARKER, theirs

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
DATA = sorted((RESULTS / run_table.DATA).glob("*.csv"))
AS_PRINTED = "## As printed when the study ran (cannot be regenerated: its MLflow store is gone)"

# the --from path in a process of its own: MLflow's store unreachable, and MLflow never imported
FROM_ALONE = """
import sys
from pipeline.experiments import report
code = report.main(sys.argv[1:])
assert "mlflow" not in sys.modules, "the --from path imported MLflow"
sys.exit(code)
"""


def log_study(client, name: str) -> None:
    """Three variants: a with two seeds (one memorising), b with one failed run, c never run."""
    rising = [(250, 3.0), (500, 2.8), (750, 3.2), (1000, 3.6)]
    runs = [
        ("a", 1234, "finished", {"sink/sink1": [(100, 5.0), (1000, 30.0)], "val/loss": rising}),
        ("a", 1235, "finished", {"sink/sink1": 20.0, "val/loss": 4.1, "sink/alpha1_mean": 0.2}),
        ("b", 1234, "failed", {"sink/sink1": 3.0, "train/loss": [(7, 5.5)]}),
    ]
    for variant, seed, status, metrics in runs:
        emerged = {"sink/emerged_step_sink1_10pct": 1000.0, "sink/alpha1_uniform": 0.05} if seed == 1234 else {}
        run_id = log_training_run(
            client, name, variant, "cpu", status=status, metrics={**metrics, **emerged}, seed=seed
        )
        client.set_tag(run_id, "sinklab.code_version", "abc1234-dirty")
        for key, value in (("optim.lr", "0.002"), ("seed_everything", str(seed)), ("run.name", f"{variant} s{seed}")):
            client.log_param(run_id, key, value)


def test_the_page_from_its_data_file_is_the_page_from_mlflow_byte_for_byte(tmp_path, mlflow_env, unique_name):
    path = write_experiment(tmp_path, unique_name)
    log_study(mlflow_env, unique_name)
    docs = tmp_path / "docs"
    common = [str(path), "--docs", str(docs), "--no-log"]
    assert report.main([*common, "--scale", "cpu", "--out", str(tmp_path / "a")]) == 0
    page, data = docs / f"{unique_name}.md", docs / "data" / f"{unique_name}.csv"
    start, end = run_table.PROSE
    page.write_text(page.read_text().replace(f"{start}\n{end}", f"{start}\nWhy a leads.\n{end}"))
    before = {p: p.read_bytes() for p in (page, data)}

    lines = data.read_text().splitlines()
    assert lines[0].split(",")[: len(run_table.FIXED)] == list(run_table.FIXED)
    assert len(lines) == 4  # a's two seeds and b's failed run; c has none
    assert lines[1].startswith(f"{unique_name},cpu,") and ",a,1234," in lines[1] and ",1000,abc1234-dirty," in lines[1]
    assert '"valid loss rising since step 500' in lines[1] and ",b,1234," in lines[3] and ",failed,7," in lines[3]
    a1, a2 = (run_table.from_csv(data, load_experiment(path)).runs["a"][i] for i in (0, 1))
    assert a1.config_hash == a2.config_hash and len(a1.config_hash) == 12  # the seeds share the config
    text = page.read_text()
    assert f"from the study's MLflow runs as read on {lines[1].split(',')[2]}, which [data/{unique_name}.csv]" in text
    assert "Steps actually run: variant a 0/1000, variant b 7." in text
    assert "- variant a (seed 1234): valid loss rising since step 500" in text

    env = {**os.environ, "MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", FROM_ALONE, *common, "--from", str(data), "--out", str(tmp_path / "b")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert {p: p.read_bytes() for p in (page, data)} == before  # the prose kept, the rest the same bytes
    assert (tmp_path / "b" / "report.md").read_bytes() == (tmp_path / "a" / "report.md").read_bytes()
    assert (tmp_path / "b" / "report.json").read_bytes() == (tmp_path / "a" / "report.json").read_bytes()


def table_of(experiment, **changes) -> str:
    run = RunSummary("r1", "a", "finished", 0, {"sink/sink1": 12.5, "val/loss": 4.25}, 1234, steps=100)
    table = run_table.RunTable(experiment.name, "cpu", "2026-01-02", {"a": [run]})
    for key, value in changes.items():
        setattr(table, key, value)
    return run_table.to_csv(table, experiment)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (None, ": no such file; give a data file that `sinklab report --docs` wrote"),
        (lambda t: t.replace("val/loss,", "val/loss_x,", 1), ": no column val/loss; `sinklab report"),
        (lambda t: t.replace(",read_on,", ",date,", 1), ": no column read_on; not a data file of"),
        (lambda t: t.replace(",4.25,", ",four,", 1), ":2: val/loss: 'four' is not a number (or empty: not logged)"),
        (lambda t: t.replace(",a,1234,", ",z,1234,", 1), ":2: variant 'z' is not one of"),
        (lambda t: t.replace(",cpu,", ",paper,", 1), ": holds the paper scale's runs, not the cpu scale's"),
        (lambda t: t.splitlines()[0] + "\n", ": holds no runs; nothing to render"),
        (lambda t: t + t.splitlines()[1] + "\n", ":3: a second run of a seed 1234; a report shows one per seed"),
        (lambda t: t + "ours,cpu\n", ":3: 2 cells where the header has"),
        (lambda t: t.replace(",r1,", ',"r1"x,', 1), ":2: not CSV ("),
    ],
)
def test_a_data_file_the_report_cannot_render_from_is_refused_in_one_line(tmp_path, capsys, edit, message):
    experiment = load_experiment(write_experiment(tmp_path, "ours"))
    data = tmp_path / "given.csv"
    if edit is not None:
        data.write_text(edit(table_of(experiment)))
    out, docs = tmp_path / "out", tmp_path / "docs"
    argv = [str(experiment.path), "--scale", "cpu", "--from", str(data), "--out", str(out), "--docs", str(docs)]
    assert report.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"sinklab report: {data}") and message in err, err
    assert not out.exists() and not docs.exists()  # checked before any work


def test_a_data_file_of_another_study_is_refused(tmp_path, capsys):
    ours = load_experiment(write_experiment(tmp_path, "ours"))
    theirs = load_experiment(write_experiment(tmp_path, "theirs"))
    data = tmp_path / "theirs.csv"
    data.write_text(table_of(theirs))
    assert report.main([str(ours.path), "--from", str(data), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"sinklab report: {data}: holds the runs of 'theirs', not of 'ours'; give theirs's data file\n"
    assert run_table.from_csv(data, theirs).runs["a"][0].metrics == {"sink/sink1": 12.5, "val/loss": 4.25}


@pytest.mark.parametrize("data", DATA, ids=[p.stem for p in DATA])
def test_every_committed_page_regenerates_from_its_data_file(tmp_path, data):
    """The committed page (its prose kept) and data file, written again from the data file alone."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in (MARKER, f"{data.stem}.md"):  # the marker vouches for the page, so its prose is kept
        shutil.copy(RESULTS / name, docs / name)
    argv = [data.stem, "--from", str(data), "--docs", str(docs), "--out", str(tmp_path / "out")]
    assert report.main(argv) == 0
    assert (docs / f"{data.stem}.md").read_text() == (RESULTS / f"{data.stem}.md").read_text()
    assert (docs / "data" / data.name).read_bytes() == data.read_bytes()


def test_a_page_without_a_data_file_keeps_its_numbers_only_under_the_heading_that_says_so():
    pages = sorted(p for p in RESULTS.glob("*.md") if p.name not in (run_table.INDEX, "cpu-scale.md"))
    assert len(pages) >= 17
    for page in pages:
        if (RESULTS / run_table.DATA / f"{page.stem}.csv").exists():
            continue
        text = page.read_text()
        generated, prose = text.split(run_table.PROSE[0])
        assert not any(line.startswith("|") for line in generated.splitlines()), page.name
        assert AS_PRINTED in prose, page.name
        before = prose[: prose.index(AS_PRINTED)]
        assert not any(line.startswith("|") for line in before.splitlines()), page.name


def test_every_results_page_is_the_commands_own_outside_its_prose():
    pages = sorted(p.stem for p in RESULTS.glob("*.md") if p.name not in (run_table.INDEX, "cpu-scale.md"))
    assert len(pages) >= 17
    # an edit outside a page's prose region would make the command refuse to regenerate it
    for name in pages:
        assert theirs(RESULTS, [f"{name}.md"], run_table.page_by(name)) == [], name
    assert theirs(RESULTS, [run_table.INDEX], run_table.INDEX_BY) == []
    assert all(f"[{name}]({name}.md)" in (RESULTS / run_table.INDEX).read_text() for name in pages)


def test_the_index_judges_every_page_s_agreement_rows_over_one_holm_family(tmp_path):
    """Two pages whose rows pass alone (p 0.02 and 0.015 in rho's direction, each page a family of one): over the
    index's family of both, Holm gives 2 · 0.015 = 0.03 to both, and neither keeps its verdict."""

    def row(key, rho, p, p_reversed):
        interval = Interval(0.5, 1.0, 2000, 2000) if rho > 0 else Interval(-1.0, -0.5, 2000, 2000)
        found = Agreement(key, key, 6, rho, rho, interval, interval, 3, Permutation(p, p_reversed, 720, True), 6)
        return adjust([found])[0]

    undefined = adjust([Agreement("val_loss", "valid loss", 1, None, None, min_seeds=3, distinct=1)])[0]
    pages = {"one": [row("sink1", 0.9, 0.02, 0.99), undefined], "two": [row("sink1", -0.9, 0.99, 0.015)]}
    assert [rows[0].verdict for rows in pages.values()] == ["ordering reproduced", "ordering reversed"]
    for name, rows in pages.items():
        run_table.write_page(tmp_path, name, f"## {name}: study {name}\n\nits report\n", rows)
    assert from_data((tmp_path / "one.md").read_text())[0] == pages["one"][0]
    index = (tmp_path / run_table.INDEX).read_text()
    assert "over the family of this index, its 2 rows with a p (one: sink1, two: sink1)" in index
    assert (
        "| one | sink1 | 6 | 3 | +0.90 [+0.50, +1.00] | 0.02 (all 720) | 0.03 | 6 | no verdict: p = 0.02, Holm "
        in index
    )
    assert (
        "| two | sink1 | 6 | 3 | -0.90 [-1.00, -0.50] | 0.015 (all 720) | 0.03 | 6 | no verdict: p = 0.015 for a "
        in index
    )
    assert "| one | valid loss | 1 | 3 | — | — | — | 1 | undefined |" in index
    assert "ordering re" not in index
    # a page with no agreement rows leaves the family empty
    run_table.write_page(tmp_path / "bare", "bb", "## bb: a study\n\nno paper values\n")
    assert "the index's family is empty" in (tmp_path / "bare" / run_table.INDEX).read_text()
