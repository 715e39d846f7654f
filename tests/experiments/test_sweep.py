"""Sweeps: planning from MLflow, idempotence, configs on disk, the dry run (with a fake runner)."""

from __future__ import annotations

import pytest
import yaml
from experiment_helpers import log_training_run, write_experiment
from packed_datasets import make_dataset

from pipeline import tracking as mlruns
from pipeline.experiments import sweep
from pipeline.experiments.spec import load_experiment


def test_plan_skips_finished_runs_and_reruns_the_rest(tmp_path, mlflow_env, unique_name):
    exp = load_experiment(write_experiment(tmp_path, unique_name))
    finished_a = log_training_run(mlflow_env, unique_name, "a", "cpu", status="finished", metrics={"val/loss": 4.0})
    failed_b = log_training_run(mlflow_env, unique_name, "b", "cpu", status="failed", metrics={})
    log_training_run(mlflow_env, unique_name, "c", "paper", status="finished", metrics={})  # other scale
    runs_root = tmp_path / "runs"

    planned = sweep.plan(exp, "cpu", runs_root, mlflow_env)
    assert [(r.variant, r.seed, r.state, r.previous_run_id) for r in planned] == [
        ("a", 1234, "finished", finished_a),
        ("b", 1234, "failed", failed_b),
        ("c", 1234, "pending", None),
    ]
    assert planned[1].run_dir == runs_root / unique_name / "cpu" / "b" / "s1234"
    text = sweep.format_plan(exp, "cpu", planned)
    assert "skip (finished)" in text and "run again (failed before)" in text
    assert text.splitlines()[-1] == "failed before: b s1234"

    calls = []

    def fake_fit(run, command):  # what `sinklab fit` would leave behind: a run in MLflow
        calls.append(command)
        ok = run.variant == "c"
        log_training_run(
            mlflow_env, unique_name, run.variant, "cpu", status="finished" if ok else "nonfinite", metrics={}
        )
        return 0 if ok else 3

    sweep.write_configs(exp, "cpu", planned)
    codes = sweep.run_local(planned, runner=fake_fit, extra=["--trainer.max_steps", "5"])
    assert codes == {"b s1234": 3, "c s1234": 0}
    assert (
        calls[1][-9:]
        == [
            "fit",
            "--config",
            str(runs_root / unique_name / "cpu" / "c" / "s1234.yaml"),
            "--run-dir",
            str(runs_root / unique_name / "cpu" / "c" / "s1234"),
            "--resume",
            "auto",
            "--trainer.max_steps",
            "5",
        ][-9:]
    )
    # configs are written for the variants that run, none for the finished one
    written = yaml.safe_load((runs_root / unique_name / "cpu" / "c" / "s1234.yaml").read_text())
    assert written["optim"]["weight_decay"] == 5.0
    assert written["run"] == {
        **written["run"],
        "experiment": f"sinklab/{unique_name}",
        "variant": "c",
        "name": f"c s1234 ({unique_name}/cpu)",
    }
    assert written["seed_everything"] == 1234 and written["data"]["seed"] == 1234
    assert not (runs_root / unique_name / "cpu" / "a" / "s1234.yaml").exists()

    again = sweep.plan(exp, "cpu", runs_root, mlflow_env)
    assert [(r.variant, r.state) for r in again] == [("a", "finished"), ("b", "failed"), ("c", "finished")]
    calls.clear()
    assert sweep.run_local([r for r in again if r.variant != "b"], runner=fake_fit) == {}
    assert calls == []


def test_more_seeds_run_only_the_new_ones(tmp_path, mlflow_env, unique_name):
    """Seeds count up from the recipe's seed_everything (1234): a one-seed study's runs are seed
    1234 of a three-seed one; each (variant, seed) has its own run dir and config with both seeds set."""
    exp = load_experiment(write_experiment(tmp_path, unique_name))
    log_training_run(mlflow_env, unique_name, "a", "cpu", status="finished", metrics={})
    log_training_run(mlflow_env, unique_name, "b", "cpu", status="finished", metrics={})
    log_training_run(mlflow_env, unique_name, "c", "cpu", status="failed", metrics={}, seed=1235)
    planned = sweep.plan(exp, "cpu", tmp_path / "runs", mlflow_env, n_seeds=3)
    assert [(r.name, r.state) for r in planned] == [
        ("a s1234", "finished"),
        ("a s1235", "pending"),
        ("a s1236", "pending"),
        ("b s1234", "finished"),
        ("b s1235", "pending"),
        ("b s1236", "pending"),
        ("c s1234", "pending"),
        ("c s1235", "failed"),
        ("c s1236", "pending"),
    ]
    assert "3 variants x 3 seeds" in sweep.format_plan(exp, "cpu", planned)
    sweep.write_configs(exp, "cpu", planned)
    written = yaml.safe_load((tmp_path / "runs" / unique_name / "cpu" / "c" / "s1236.yaml").read_text())
    assert (written["seed_everything"], written["data"]["seed"], written["run"]["variant"]) == (1236, 1236, "c")
    assert not (tmp_path / "runs" / unique_name / "cpu" / "a" / "s1234.yaml").exists()
    assert [len(r) for r in mlruns.variant_runs(mlflow_env, f"sinklab/{unique_name}", "cpu").values()] == [1, 1, 1]


def test_an_interrupted_run_is_resumed(tmp_path, mlflow_env, unique_name):
    exp = load_experiment(write_experiment(tmp_path, unique_name))
    log_training_run(mlflow_env, unique_name, "a", "cpu", status="interrupted", metrics={})
    planned = sweep.plan(exp, "cpu", tmp_path, mlflow_env)
    assert planned[0].state == "incomplete" and planned[0].to_run
    assert "resume (unfinished before)" in sweep.format_plan(exp, "cpu", planned)


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, mlflow_env, unique_name, capsys):
    path = write_experiment(tmp_path, unique_name)
    code = sweep.main(
        [
            str(path),
            "--dry-run",
            "--no-check",
            "--runs-root",
            str(tmp_path / "runs"),
            "--variants",
            "a,c",
            "--",
            "--trainer.max_steps",
            "3",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"{unique_name} (Gu et al. 2025, Table 2), scale cpu: 2 variants x 1 seed -> MLflow experiment sinklab/{unique_name}"
    )
    commands = [line for line in out if line.startswith("  $ ")]
    assert len(commands) == 2 and commands[1].endswith(
        f"fit --config {tmp_path}/runs/{unique_name}/cpu/c/s1234.yaml --run-dir {tmp_path}/runs/{unique_name}/cpu/c/s1234 "
        "--resume auto --trainer.max_steps 3"
    )
    assert not (tmp_path / "runs").exists()


def test_a_misspelt_fit_flag_after_the_double_dash_is_caught_by_the_fit_parser_check(
    tmp_path, mlflow_env, unique_name, capsys
):
    path = write_experiment(tmp_path, unique_name)
    argv = [str(path), "--dry-run", "--runs-root", str(tmp_path / "runs"), "--variants", "a", "--"]
    assert sweep.main([*argv, "--trainer.max_stepz", "3"]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no plan printed before the refusal
    err = err.strip()
    assert err.startswith(f"sinklab sweep: {path}: variant 'a' at scale cpu with --trainer.max_stepz 3: `sinklab fit`")
    assert "max_stepz" in err.split("rejects it:")[1] and len(err.splitlines()) == 1
    assert sweep.main([*argv, "--trainer.max_steps", "3"]) == 0
    assert not (tmp_path / "runs").exists()


def test_unknown_variant_is_an_error(tmp_path, mlflow_env, unique_name, capsys):
    path = write_experiment(tmp_path, unique_name)
    assert sweep.main([str(path), "--dry-run", "--variants", "a,zz"]) == 2
    assert "no variant 'zz'; variants: a, b, c" in capsys.readouterr().err
    assert sweep.main([str(path), "--dry-run", "--variants", ""]) == 2  # not "all of them"
    assert "--variants '': names no variant; give some of a, b, c" in capsys.readouterr().err


def test_submit_sends_one_job_array_of_the_unfinished_variants(tmp_path, mlflow_env, unique_name, monkeypatch, capsys):
    import cluster.submit

    submitted = []
    monkeypatch.setattr(cluster.submit, "sbatch", lambda script: submitted.append(script) or "4242")
    monkeypatch.setenv("SINKLAB_PARTITION", "gpu")
    path = write_experiment(tmp_path, unique_name)
    log_training_run(mlflow_env, unique_name, "b", "cpu", status="finished", metrics={})
    root = tmp_path / "runs"
    assert (
        sweep.main(
            [
                str(path),
                "--submit",
                "--no-check",
                "--runs-root",
                str(root),
                "--gpus-per-node",
                "2",
                "--time",
                "1:00:00",
                "--seeds",
                "2",
                "--",
                "--trainer.max_steps",
                "7",
            ]
        )
        == 0
    )
    assert "submitted job array 4242 with 5 tasks" in capsys.readouterr().out
    sweep_dir = root / unique_name / "cpu"
    assert submitted == [sweep_dir / "array.sbatch"]
    # one task per (variant, seed) not finished: b's seed 1234 is
    assert (sweep_dir / "runs.tsv").read_text().splitlines() == [
        f"{sweep_dir / v / f's{seed}.yaml'}\t{sweep_dir / v / f's{seed}'}"
        for v, seed in [("a", 1234), ("a", 1235), ("b", 1235), ("c", 1234), ("c", 1235)]
    ]
    script = (sweep_dir / "array.sbatch").read_text()
    assert "#SBATCH --array=0-4" in script and "#SBATCH --partition=gpu" in script
    assert "#SBATCH --gpus-per-node=2" in script and "#SBATCH --time=1:00:00" in script
    assert "--trainer.max_steps 7" in script and f"MLFLOW_TRACKING_URI={mlflow_env.tracking_uri}" in script


def test_a_sweep_groups_its_variants_under_one_parent_run(tmp_path, mlflow_env, unique_name, monkeypatch):
    """Two variants trained for real (in this process) become the children of one parent run that
    carries the experiment's name and paper reference; a repeated sweep reuses that parent."""
    from experiment_helpers import micro_recipe

    from pipeline.train.cli import main as fit

    monkeypatch.chdir(tmp_path)
    recipe = micro_recipe(tmp_path, make_dataset(tmp_path / "dataset"), steps=3)
    path = write_experiment(
        tmp_path,
        unique_name,
        recipe=recipe,
        variants="""\
      - {name: a, label: "variant a", overrides: {optim.weight_decay: 0.0}}
      - {name: b, label: "variant b", overrides: {optim.weight_decay: 0.5}}
    """,
    )

    def in_process(run, command):  # `sinklab fit ...` without a new interpreter
        return fit(command[command.index("fit") + 1 :] + ["--run.log_model", "false", "--run.system_metrics", "false"])

    args = [str(path), "--local", "--no-check", "--runs-root", str(tmp_path / "runs")]
    assert sweep.main(args, runner=in_process) == 0
    exp = mlflow_env.get_experiment_by_name(f"sinklab/{unique_name}")
    runs = mlflow_env.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("sinklab.kind") == "sweep"]
    children = [r for r in runs if "sinklab.variant" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2 and len(runs) == 3
    parent = parents[0]
    assert parent.info.run_name == f"{unique_name}/cpu" and parent.info.status == "FINISHED"
    assert (
        parent.data.tags["sinklab.paper_ref"] == "Gu et al. 2025, Table 2"
        and parent.data.tags["sinklab.experiment"] == unique_name
    )
    assert sorted((r.data.tags["sinklab.variant"], r.data.tags["sinklab.seed"]) for r in children) == [
        ("a", "1234"),
        ("b", "1234"),
    ]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert mlruns.parent_run(mlflow_env, load_experiment(path), "cpu") == parent.info.run_id
    assert "SINKLAB_PARENT_RUN_ID" not in __import__("os").environ


def test_the_gpu_scale_says_what_the_embedded_corpus_does_and_takes_a_data_path(
    tmp_path, mlflow_env, capsys, monkeypatch
):
    """gpu-small on the embedded corpus memorises (docs/experiments.md); a prepared Pile dataset, given once
    for the sweep (--data-path or SINKLAB_DATA_PATH), goes to every variant's `sinklab fit`."""
    monkeypatch.delenv("SINKLAB_DATA_PATH", raising=False)
    common = [
        "weight-decay",
        "--scale",
        "gpu",
        "--dry-run",
        "--no-check",
        "--runs-root",
        str(tmp_path / "runs"),
        "--variants",
        "wd-0.5",
    ]
    assert sweep.main(common) == 0
    out = capsys.readouterr()
    assert "note: the gpu scale trains on the embedded corpus" in out.err and "--data-path DIR" in out.err
    assert "--data.path" not in out.out
    pile = make_dataset(tmp_path / "pile-c512")
    monkeypatch.setenv("SINKLAB_DATA_PATH", str(pile))
    assert sweep.main(common) == 0
    out = capsys.readouterr()
    assert "note:" not in out.err
    assert [line for line in out.out.splitlines() if line.startswith("  $ ")][0].endswith(
        f"--resume auto --data.path {pile}"
    )
    assert sweep.main([*common, "--data-path", str(tmp_path / "nothing")]) == 2
    assert f"sinklab sweep: --data-path {tmp_path / 'nothing'}: no manifest.json there" in capsys.readouterr().err


@pytest.mark.parametrize("count", ["99999999999999999999", "1001", "0", "²"])
def test_a_seed_count_outside_1_to_1000_is_refused_before_any_plan(count, capsys):
    """`--seeds 99999999999999999999 --dry-run` built the whole list of seeds and ran out of memory."""
    with pytest.raises(SystemExit) as refused:
        sweep.parse_args(["weight-decay", "--seeds", count, "--dry-run"])
    assert refused.value.code == 2
    assert f"--seeds: {count!r}: give how many seeds per variant, a whole number in 1..1000" in capsys.readouterr().err
    assert sweep.parse_args(["weight-decay", "--seeds", "1000"])[0].seeds == 1000
