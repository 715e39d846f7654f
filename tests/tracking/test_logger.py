"""A run directory's metrics are written from that directory only: a copy, a start over
and a run deleted in the MLflow UI each get a new MLflow run linked by a tag, never a second
history in the old one; --resume auto passes over a checkpoint whose stored step is not its name."""

from __future__ import annotations

import shutil

import pytest
from fit_runs import checkpoints_only, fit_in_process, lean_tracking, losses, paths
from mlflow.tracking import MlflowClient

from pipeline.tracking import TAG_PREVIOUS_RUN, TAG_RUN_DIR


def _args(tiny_ds, run_dir) -> list[str]:
    return [*paths(tiny_ds, run_dir), *checkpoints_only(2), *lean_tracking()]


def _history(client, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))


@pytest.fixture
def trained(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    run_dir = tmp_path / "a"
    assert fit_in_process([*_args(tiny_ds, run_dir), "--trainer.max_steps", "4"], monkeypatch, mlflow_server) == 0
    return run_dir


def test_a_copied_run_dir_never_writes_into_the_originals_mlflow_run(
    trained, tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys
):
    client = MlflowClient(mlflow_server)
    original = (trained / "mlflow_run_id").read_text().strip()
    before = client.get_run(original)
    copy = tmp_path / "b"
    shutil.copytree(trained, copy)
    capsys.readouterr()
    assert (
        fit_in_process(
            [*_args(tiny_ds, copy), "--trainer.max_steps", "6", "--resume", "auto"], monkeypatch, mlflow_server
        )
        == 0
    )
    assert f"{copy} is a copy of {trained.resolve()}, whose MLflow run {original} is not written from here" in (
        capsys.readouterr().err
    )
    after = client.get_run(original)  # the original's record is as it was
    assert _history(client, original) == [0, 1, 2, 3]
    assert after.data.tags[TAG_RUN_DIR] == str(trained.resolve()) and after.data.tags == before.data.tags
    new = (copy / "mlflow_run_id").read_text().strip()
    assert new != original
    tags = client.get_run(new).data.tags
    assert tags[TAG_PREVIOUS_RUN] == original and tags[TAG_RUN_DIR] == str(copy.resolve())
    assert _history(client, new) == list(range(6))  # the history it continues, then its own steps

    # the original continues its own run as before
    assert (
        fit_in_process(
            [*_args(tiny_ds, trained), "--trainer.max_steps", "6", "--resume", "auto"], monkeypatch, mlflow_server
        )
        == 0
    )
    assert (trained / "mlflow_run_id").read_text().strip() == original and _history(client, original) == list(range(6))


def test_a_run_deleted_in_mlflow_is_said_and_continued_in_a_new_run(
    trained, tiny_ds, monkeypatch, mlflow_server, capsys
):
    client = MlflowClient(mlflow_server)
    deleted = (trained / "mlflow_run_id").read_text().strip()
    client.delete_run(deleted)
    capsys.readouterr()
    assert (
        fit_in_process(
            [*_args(tiny_ds, trained), "--trainer.max_steps", "6", "--resume", "auto"], monkeypatch, mlflow_server
        )
        == 0
    )
    err = capsys.readouterr().err
    assert f"MLflow run {deleted} of {trained} was deleted" in err and "unreachable" not in err
    new = (trained / "mlflow_run_id").read_text().strip()
    assert new != deleted and client.get_run(new).data.tags[TAG_PREVIOUS_RUN] == deleted
    assert _history(client, new) == list(range(6))


def test_resume_auto_checks_each_checkpoints_step_and_starts_over_in_a_new_record(
    trained, tiny_ds, monkeypatch, mlflow_server, capsys
):
    client = MlflowClient(mlflow_server)
    first = (trained / "mlflow_run_id").read_text().strip()
    ckpts = trained / "checkpoints"
    reference = losses(trained)

    # a step-2 checkpoint under the name step-000004.ckpt (what `consolidate` once wrote over another run's)
    shutil.copyfile(ckpts / "step-000002.ckpt", ckpts / "step-000004.ckpt")
    capsys.readouterr()
    assert (
        fit_in_process(
            [*_args(tiny_ds, trained), "--trainer.max_steps", "4", "--resume", "auto"], monkeypatch, mlflow_server
        )
        == 0
    )
    err = capsys.readouterr().err
    assert f"passing over {ckpts / 'step-000004.ckpt'}: it holds step 2, not step 4 as its name says" in err
    assert losses(trained)[3] == reference[3]  # steps 2-3 trained again from the real step-2 checkpoint

    # every checkpoint damaged: said in one line, and a new record instead of a second history in the old one
    old_history = _history(client, first)
    for ckpt in ckpts.iterdir():
        ckpt.write_bytes(ckpt.read_bytes()[:100])
    assert (
        fit_in_process(
            [*_args(tiny_ds, trained), "--trainer.max_steps", "3", "--resume", "auto"], monkeypatch, mlflow_server
        )
        == 0
    )
    err = capsys.readouterr().err
    assert f"no checkpoint of {trained} can be resumed (each is named above): starting over from step 0" in err
    aside = trained / "restart-1"
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["step-000002.ckpt", "step-000004.ckpt"]
    assert (aside / "mlflow_run_id").read_text().strip() == first and (aside / "metrics.jsonl").exists()
    second = (trained / "mlflow_run_id").read_text().strip()
    assert second != first and client.get_run(second).data.tags[TAG_PREVIOUS_RUN] == first
    assert _history(client, first) == old_history and _history(client, second) == [0, 1, 2]  # one value per step
    assert sorted(losses(trained)) == [0, 1, 2]


def test_a_store_error_of_several_lines_is_one_notice(tmp_path, monkeypatch, capsys):
    """A two-line SQLAlchemy error (a sqlite store on a full disk) is one 'unreachable' notice line."""
    from pipeline.checkpoint.rundir import RunDir
    from pipeline.tracking import logger

    def fails(*_):
        raise RuntimeError(
            "(sqlite3.OperationalError) disk I/O error\n(Background on this error at: https://sqlalche.me)"
        )

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setattr(logger, "experiment_id", fails)
    assert logger.open_run(RunDir(tmp_path), "e", "r", {}, {}, []) is None
    assert capsys.readouterr().err.splitlines() == [
        "sinklab: MLflow at http://127.0.0.1:9 unreachable (RuntimeError: (sqlite3.OperationalError) disk I/O "
        f"error); training goes on, metrics are kept in {tmp_path / 'metrics.jsonl'}"
    ]


def test_an_experiment_created_by_another_process_in_between_is_used(tmp_path):
    """Two sweeps (or SLURM array tasks) starting together both find no experiment; the second
    create fails with RESOURCE_ALREADY_EXISTS and must take the first one's."""
    from pipeline.tracking.contract import experiment_id

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    first = client.create_experiment("sinklab/race")
    real_get = client.get_experiment_by_name
    calls = []

    def get_after_the_other_created(name):
        calls.append(name)
        return None if len(calls) == 1 else real_get(name)

    client.get_experiment_by_name = get_after_the_other_created
    assert experiment_id(client, "sinklab/race") == first
    assert len(client.search_experiments(filter_string="name = 'sinklab/race'")) == 1
