"""run.log_checkpoints and `sinklab fit --resume runs:/<id>`: a run continued on another machine
from the checkpoint it logged to MLflow (the real tracking server over HTTP)."""

from __future__ import annotations

from fit_runs import fit_in_process, lean_tracking, losses, paths
from mlflow.tracking import MlflowClient

from pipeline.tracking.remote_checkpoints import ARTIFACT_DIR, logged_checkpoints

ARGS = [
    "--trainer.max_steps",
    "12",
    "--run.checkpoint_every",
    "4",
    "--run.keep_last",
    "2",
    "--run.sink_every",
    "0",
    *lean_tracking(),
    "--run.experiment",  # of its own: the resume counts its runs while other files' runs go on
    "train-remote-checkpoints",
]


def test_a_run_continues_elsewhere_from_its_logged_checkpoint(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    first = tmp_path / "machine-a"
    assert (
        fit_in_process(
            [*paths(tiny_ds, first), "--run.log_checkpoints", "true", *ARGS],
            monkeypatch,
            mlflow_server,
        )
        == 0
    )
    client, run_id = MlflowClient(mlflow_server), (first / "mlflow_run_id").read_text().strip()
    # kept in step with the run dir: step 4 was pruned there, so it is gone from MLflow too
    assert logged_checkpoints(client, run_id) == ["step-000008.ckpt", "step-000012.ckpt"]
    assert "checkpoint upload(s) to MLflow done" in capsys.readouterr().out

    # as if the job had died before its last upload: the newest logged checkpoint is step 8
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    get_artifact_repository(client.get_run(run_id).info.artifact_uri).delete_artifacts(
        f"{ARTIFACT_DIR}/step-000012.ckpt"
    )
    second = tmp_path / "machine-b"
    runs_before = len(client.search_runs([client.get_run(run_id).info.experiment_id]))
    # no --config: the run's own config comes from MLflow, with its dataset path
    from pipeline.train.cli import main

    assert main(["--resume", f"runs:/{run_id}", "--run-dir", str(second)]) == 0
    assert (second / "mlflow_run_id").read_text().strip() == run_id  # the same MLflow run, continued
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == runs_before
    assert losses(second) == {s: v for s, v in losses(first).items() if s >= 8}
    assert sorted(p.name for p in (second / "checkpoints").iterdir()) == ["step-000008.ckpt", "step-000012.ckpt"]


def test_resume_from_a_run_without_logged_checkpoints_is_refused_in_one_line(
    tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys
):
    run_dir = tmp_path / "plain"
    assert (
        fit_in_process(
            [*paths(tiny_ds, run_dir), "--trainer.max_steps", "4", *ARGS[2:]],
            monkeypatch,
            mlflow_server,
        )
        == 0
    )
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    capsys.readouterr()
    from pipeline.train.cli import main

    assert main(["--resume", f"runs:/{run_id}", "--run-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"sinklab fit: --resume runs:/{run_id}: the run logged no checkpoint; runs log them with "
        "--run.log_checkpoints true (continue it where its run directory is, with --resume auto)"
    ]
    assert not (tmp_path / "b").exists()
