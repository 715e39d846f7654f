"""docs/guides/cluster.md, run as written against real SLURM daemons and a basic-auth MLflow server it
starts itself: a tiny Pile prepared, one run submitted, preempted with SIGUSR1 and resumed, a sweep of
two variants as an array, its report; beside them a job with a wrong password; then the password searched
for in every script, log and MLflow param."""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard
from guide_runner import GuideShell, guide_env, run_guide
from guide_runner import steps as guide_steps

REPO = Path(__file__).resolve().parents[2]
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()


def write_pile(folder: Path) -> None:
    """A Pile-format corpus: 300 train and 30 val documents of two domains, as .jsonl.zst."""
    folder.mkdir()
    for name, n in (("train", 300), ("val", 30)):
        docs = [
            {"text": " ".join(WORDS[(i * 7 + j * j) % len(WORDS)] for j in range(150)), "meta": {"pile_set_name": d}}
            for i in range(n)
            for d in (("Pile-CC", "Github")[i % 2],)
        ]
        text = "".join(json.dumps(doc) + "\n" for doc in docs).encode()
        (folder / f"{name}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(text))


def release_requeued(slurm) -> None:
    """Start every job held for BeginTime after a requeue (docs/cluster.md), as the cluster tests do."""
    out = slurm.run("squeue", "-h", "-o", "%i %T %r", check=False).stdout
    for line in out.splitlines():
        job, state, reason = (line.split() + ["", "", ""])[:3]
        slurm.release_requeued(job, state, reason)


def texts_under(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file() and p.stat().st_size < 2**22)


def test_cluster_guide_runs_as_written(slurm, tmp_path):
    from mlflow.tracking import MlflowClient
    from slurm_cluster import free_port

    from pipeline.tracking.views import VIEW_TAG

    work, home = tmp_path / "sinklab", tmp_path / "home"
    work.mkdir()
    (work / "configs").symlink_to(REPO / "configs")
    write_pile(work / "pile")
    env = guide_env(
        home,
        tmp_path / "bin",
        port=str(free_port()),
        admin_password="admin-" + secrets.token_hex(8),
        user_password="user-" + secrets.token_hex(8),
    )
    env.update(USER="alice", SINKLAB_COMMAND=f"{shlex.quote(sys.executable)} -m pipeline.cli")
    password = env["GUIDE_USER_PASSWORD"]
    shell = GuideShell(work, env, poll=lambda: release_requeued(slurm))
    try:
        submitted = next(s.line for s in guide_steps("cluster.md") if s.command.startswith("sinklab submit"))
        skipped = run_guide("cluster.md", shell, until_line=submitted)
        # A job whose password is wrong, run beside the guide's: the server refuses it, nothing of it logged.
        uri = shell.exported("MLFLOW_TRACKING_URI")
        wrong = dict(
            env, MLFLOW_TRACKING_URI=uri, MLFLOW_TRACKING_USERNAME="alice", MLFLOW_TRACKING_PASSWORD="not-" + password
        )
        submit = ["sinklab", "submit", "configs/recipes/cpu-tiny.yaml", "--gpus-per-node", "0", "--cpus-per-task", "1"]
        submit += ["--run-dir", "runs/wrong", "--", "--data.path", "data/pile", "--trainer.max_steps", "4"]
        done = subprocess.run(submit, cwd=work, env=wrong, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        job = done.stdout.split()[2].rstrip(":")
        skipped += run_guide("cluster.md", shell, after_line=submitted)
        assert [s.skip.split()[0] for s in skipped] == ["installs", "needs"], skipped

        assert slurm.wait_for(job, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
        log = (work / "runs" / "wrong" / "slurm" / f"{job}.out").read_text()
        assert "error code 401" in log and "training goes on" in log, log[-3000:]
        assert not (work / "runs" / "wrong" / "mlflow_run_id").exists()

        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
            patch.setenv("MLFLOW_TRACKING_PASSWORD", password)
            client = MlflowClient(uri)
            runs = {}
            for exp in client.search_experiments():
                assert exp.name == "Default" or VIEW_TAG in exp.tags, exp.name
                for run in client.search_runs([exp.experiment_id]):
                    runs[run.info.run_id] = run
        by_dir = {Path(r.data.tags.get("sinklab.run_dir", "-")).name: r for r in runs.values()}
        assert "wrong" not in by_dir, "a refused job logged a run"

        # The preempted run: one MLflow run, resumed from its checkpoint, every step once.
        single = by_dir["paper-60m"]
        log = "".join(p.read_text() for p in (work / "runs" / "paper-60m" / "slurm").glob("*.out"))
        assert "restart 1 on" in log and "Restored all states from the checkpoint" in log.split("restart 1 on")[1]
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
            patch.setenv("MLFLOW_TRACKING_PASSWORD", password)
            steps = sorted(m.step for m in MlflowClient(uri).get_metric_history(single.info.run_id, "train/loss"))
        assert steps == list(range(steps[0], steps[0] + 160)) and steps[0] in (0, 1), (
            steps
        )  # 160 steps, none lost or twice
        assert single.info.status == "FINISHED"
        # The sweep: both variants finished, as children of its parent run.
        sweep = [r for r in runs.values() if r.data.params.get("run.variant") in ("wd-0.0", "wd-0.5")]
        assert len(sweep) == 2 and all(r.info.status == "FINISHED" for r in sweep), sweep

        # The credentials: in no rendered script, log, run directory or MLflow param or tag.
        assert password not in texts_under(work / "runs")
        for run in runs.values():
            assert password not in json.dumps([run.data.params, run.data.tags])
    finally:
        shell.close()
