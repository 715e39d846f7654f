"""Rendering of batch scripts and the errors of `sinklab submit` (no SLURM needed)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.jobs import JobError, JobSpec, render_array, render_job, time_limit_seconds, write_run_list
from cluster.submit import main as submit_main

REPO = Path(__file__).resolve().parents[2]
PAPER_RECIPE = REPO / "configs" / "recipes" / "paper-60m.yaml"


@pytest.fixture(autouse=True)
def fit_check_in_this_process(monkeypatch):
    """`sinklab submit` checks a config with `sinklab fit --check-only` in a process of its own (the
    cluster layer imports no training code). These tests of rendering and refusals run that same
    entry point in this process instead, 5-10 s less each; test_sinklab_submit_command_line_dispatch
    runs the real command end to end."""
    import contextlib
    import io

    from pipeline.train.cli import main as fit_main

    real = subprocess.run

    def run(command, **kwargs):
        if "--check-only" not in command:
            return real(command, **kwargs)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = fit_main(list(command[command.index("fit") + 1 :]))
        return subprocess.CompletedProcess(command, code, "", err.getvalue())

    monkeypatch.setattr(subprocess, "run", run)


def sbatch_lines(script: str) -> list[str]:
    return [line.split(None, 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]


def site_free(monkeypatch) -> None:
    for name in (
        "SINKLAB_PARTITION",
        "SINKLAB_ACCOUNT",
        "SINKLAB_QOS",
        "SINKLAB_SETUP",
        "SINKLAB_TIME",
        "SINKLAB_COMMAND",
        "MLFLOW_TRACKING_URI",
    ):
        monkeypatch.delenv(name, raising=False)


def test_paper_recipe_on_two_nodes_of_eight_gpus(capsys, monkeypatch, tmp_path):
    site_free(monkeypatch)
    monkeypatch.chdir(tmp_path)
    code = submit_main(
        [
            str(PAPER_RECIPE),
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--time",
            "2-00:00:00",
            "--partition",
            "gpu",
            "--account",
            "proj42",
            "--setup",
            "module load cuda/12.4",
            "--dry-run",
        ]
    )
    assert code == 0
    script = capsys.readouterr().out
    run_dir = tmp_path / "runs" / "paper-60m"
    assert sbatch_lines(script) == [
        "--job-name=paper-60m",
        "--nodes=2",
        "--ntasks-per-node=8",
        "--cpus-per-task=8",
        "--gpus-per-node=8",
        "--time=2-00:00:00",
        "--partition=gpu",
        "--account=proj42",
        f"--output={run_dir}/slurm/%j.out",
        "--open-mode=append",
        "--signal=USR1@180",
        "--requeue",
    ]
    srun = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1
    words = shlex.split(srun[0])
    assert words[words.index("fit") :] == [
        "fit",
        "--config",
        "$CONFIG",
        "--run-dir",
        "$RUN_DIR",
        "--resume",
        "auto",
        "--trainer.num_nodes",
        "2",
        "--trainer.devices",
        "8",
    ]
    assert f"CONFIG={PAPER_RECIPE}" in script and f"RUN_DIR={run_dir}" in script
    assert "module load cuda/12.4" in script
    assert not (tmp_path / "runs").exists(), "a dry run must write nothing"
    # The script is valid bash.
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_cpu_job_site_values_from_environment_and_extra_fit_args(capsys, monkeypatch, tmp_path):
    site_free(monkeypatch)
    monkeypatch.setenv("SINKLAB_PARTITION", "cpu-long")
    monkeypatch.setenv("SINKLAB_QOS", "low")
    monkeypatch.setenv("SINKLAB_SETUP", "source /opt/env/bin/activate")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    config = tmp_path / "tiny.yaml"
    config.write_text("trainer:\n  max_steps: 5\noptim:\n  warmup_steps: 2\n")  # warm-up below max_steps, as fit checks
    code = submit_main(
        [
            str(config),
            "--gpus-per-node",
            "0",
            "--tasks-per-node",
            "2",
            "--cpus-per-task",
            "1",
            "--run-dir",
            str(tmp_path / "r"),
            "--signal-seconds",
            "60",
            "--mem",
            "4G",
            "--sbatch-option=--constraint=skylake",
            "--dry-run",
            "--",
            "--trainer.max_steps",
            "7",
        ]
    )
    assert code == 0
    script = capsys.readouterr().out
    lines = sbatch_lines(script)
    assert "--ntasks-per-node=2" in lines and not any(l.startswith("--gpus") for l in lines)
    assert {"--partition=cpu-long", "--qos=low", "--mem=4G", "--constraint=skylake", "--signal=USR1@60"} <= set(lines)
    assert "source /opt/env/bin/activate" in script
    assert "export MLFLOW_TRACKING_URI=http://mlflow.example:5000" in script
    assert script.rstrip().endswith(
        "--trainer.num_nodes 1 --trainer.devices 2 --trainer.accelerator cpu --trainer.max_steps 7"
    )


def test_array_task_reads_its_own_line(tmp_path):
    configs = []
    for name in ("a", "b", "c"):
        configs.append(tmp_path / f"{name}.yaml")
        configs[-1].write_text("trainer: {}\n")
    runs = [(c, tmp_path / "runs" / c.stem) for c in configs]
    list_file = write_run_list(runs, tmp_path / "sweep" / "runs.tsv")
    spec = JobSpec(gpus_per_node=4, partition=None, account=None, qos=None, setup="", sinklab="sinklab")
    script = render_array(list_file, len(runs), tmp_path / "sweep" / "slurm", spec, max_parallel=2)
    assert "--array=0-2%2" in sbatch_lines(script)
    assert f"--output={tmp_path}/sweep/slurm/%A_%a.out" in sbatch_lines(script)
    # Run the selection lines as task 1 and read which run it picked.
    select = script[script.index("RUN_LIST=") : script.index("export SINKLAB_RUN_DIR")]
    out = subprocess.run(
        ["bash", "-c", select + 'echo "$CONFIG|$RUN_DIR"'],
        env={"SLURM_ARRAY_TASK_ID": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == f"{configs[1]}|{tmp_path / 'runs' / 'b'}"


def test_stray_ckpt_name_in_run_dir_is_refused(tmp_path, capsys, monkeypatch):
    site_free(monkeypatch)
    config = tmp_path / "c.yaml"
    config.write_text("trainer: {}\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "hpc_ckpt_3.ckpt").write_bytes(b"")  # Lightning's own: fine
    (run_dir / "best_ckpt_old.pt").write_bytes(b"")
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch reachable: nothing may be submitted
    assert submit_main([str(config), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "best_ckpt_old.pt" in err and "hpc_ckpt_3" not in err
    # --dry-run refuses what the real submit refuses, printing no script
    assert submit_main([str(config), "--run-dir", str(run_dir), "--dry-run"]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and "best_ckpt_old.pt" in printed.err
    # The job script refuses too (a stray file can appear after submission).
    script = render_job(config, run_dir, JobSpec(sinklab=f"{sys.executable} -m pipeline.cli", setup=""))
    check = script[script.index("RUN_DIR=") : script.index('echo "sinklab: job')]
    done = subprocess.run(["/bin/bash", "-c", check], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "best_ckpt_old.pt" in done.stderr
    (run_dir / "best_ckpt_old.pt").unlink()
    assert subprocess.run(["/bin/bash", "-c", check], env={"PATH": "/usr/bin:/bin"}).returncode == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["missing.yaml"], "config missing.yaml: no such file"),
        (["{bad}", "--nodes", "0"], "--nodes must be at least 1"),
        (["{bad}", "--time", "90min"], "--time '90min': expected minutes, MM:SS"),
        (["{bad}", "--time", "5", "--signal-seconds", "300"], "--signal-seconds 300 must be shorter than --time 5"),
        (["{bad}", "--", "--trainer.devices", "4"], "fit argument '--trainer.devices' is set by the job script"),
        (["{bad}", "--gpus-per-node", "-1"], "--gpus-per-node must be 0 (CPU job) or more"),
        (["{list}"], "expected a YAML mapping of settings, got list"),
        (["{broken}"], "config broken.yaml, line 3: not valid YAML (mapping values are not allowed here)"),
        (["{typo}"], "`sinklab fit` rejects it: optim: Option 'lrr' is not accepted"),
        (["{old}"], "old.yaml: model.optim is now optim; give it under that name"),
        (["{bad}", "--", "--arch.attention.op", "sigmod"], "rejects it: arch.attention.op: Expected"),
        (["{bad}", "--", "--trainer.max_stepz", "5"], "rejects it: unrecognized arguments: --trainer.max_stepz 5"),
    ],
)
def test_bad_input_gives_one_clear_line(argv, message, tmp_path, capsys, monkeypatch):
    site_free(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text("trainer: {}\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "broken.yaml").write_text("trainer:\n  max_steps: 5\n   lr: 1\n")
    (tmp_path / "typo.yaml").write_text("optim:\n  lrr: 1.0e-3\n")
    (tmp_path / "old.yaml").write_text("model:\n  optim:\n    lr: 1.0e-3\n")
    names = {
        "{bad}": "ok.yaml",
        "{list}": "list.yaml",
        "{broken}": "broken.yaml",
        "{typo}": "typo.yaml",
        "{old}": "old.yaml",
    }
    argv = [names.get(a, a) for a in argv]
    assert submit_main(argv + ["--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sinklab submit: ") and len(err.splitlines()) == 1, err
    assert message in err, err


def test_time_limits_in_every_slurm_format():
    assert [time_limit_seconds(t) for t in ("30", "30:15", "2:00:00", "1-2", "1-02:30", "1-00:00:10")] == [
        1800,
        1815,
        7200,
        93600,
        95400,
        86410,
    ]
    with pytest.raises(JobError):
        time_limit_seconds("1h")


def test_sinklab_submit_command_line_dispatch(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("trainer: {}\n")
    sinklab = Path(sys.executable).with_name("sinklab")
    out = subprocess.run(
        [str(sinklab), "submit", str(config), "--gpus-per-node", "2", "--dry-run"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert re.search(r"^#SBATCH --ntasks-per-node=2$", out, re.M)
    assert f"{sinklab} fit" in out  # default: the sinklab of the submitting Python


def test_default_run_dir_and_job_name_follow_run_name(tmp_path, capsys, monkeypatch):
    site_free(monkeypatch)
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "recipe.yaml"
    config.write_text("run:\n  name: lr-3e-4\ntrainer: {}\n")  # `sinklab fit` uses runs/<run.name>
    assert submit_main([str(config), "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "--job-name=lr-3e-4" in sbatch_lines(script)
    assert f"RUN_DIR={tmp_path / 'runs' / 'lr-3e-4'}\n" in script


def test_a_world_size_fit_would_refuse_is_refused_before_anything_is_queued(tmp_path, capsys, monkeypatch):
    """3 nodes x 1 task of an 8-sequence batch, a world size `sinklab fit` refuses at the job's start,
    is refused before it is rendered or queued. The check sees the dataset
    where it can be read from here; a dataset it cannot read leaves the check to the job."""
    from packed_datasets import make_dataset

    site_free(monkeypatch)
    data = make_dataset(tmp_path / "ds")  # C = 16
    recipe = REPO / "configs" / "recipes" / "cpu-tiny.yaml"  # 128 tokens a step: 8 sequences
    job = [
        str(recipe),
        "--nodes",
        "3",
        "--gpus-per-node",
        "0",
        "--tasks-per-node",
        "1",
        "--dry-run",
        "--",
        "--data.path",
        str(data),
    ]
    assert submit_main(job) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is 8 sequences, which 3 processes cannot share evenly" in err, err
    assert submit_main([*job[:2], "2", *job[3:]]) == 0  # 2 nodes share them
    assert submit_main([*job[:-1], str(tmp_path / "only-on-the-cluster")]) == 0
