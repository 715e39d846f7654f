"""A resume continues its checkpoint's run: `trainer.max_steps` extends it with the
cosine going on from the resumed step's lr, and a change to what defines the run (model,
optimiser, data order) is refused in one line before anything of the new start is written."""

from __future__ import annotations

import math

import pytest
from fit_runs import fit_in_process, keep_checkpoints, lean_tracking, paths, read_metrics
from mlflow.tracking import MlflowClient

RUN = [
    "--trainer.max_steps",
    "8",
    *keep_checkpoints(4),
    "--run.sink_every",
    "0",
    *lean_tracking(),
    "--run.experiment",  # of its own: the refusals count its runs while other files' runs go on
    "train-resume-changes",
]


def _tree(root):
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def finished_run(tiny_ds, tmp_path_factory, mlflow_server):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    mp = pytest.MonkeyPatch()
    assert fit_in_process([*paths(tiny_ds, run_dir), *RUN], mp, mlflow_server) == 0
    mp.undo()
    return run_dir


@pytest.mark.parametrize(
    "change, named",
    [
        (["--data.seed", "99"], "data.seed=99 (the checkpoint's: 1234)"),
        (["--arch.n_layers", "1"], "arch.n_layers=1 (the checkpoint's: 2)"),
        (["--optim.lr", "1.0"], "optim.lr=1.0 (the checkpoint's: 0.003)"),
        (
            ["--data.interventions.fix_position", "1", "--data.interventions.fix_token", "bos"],
            "data.interventions.fix_position=1",
        ),
        (["--trainer.max_steps", "6"], "trainer.max_steps=6 is below the checkpoint's step 8"),
    ],
)
def test_a_resume_that_would_change_the_run_is_refused_before_anything_is_written(
    finished_run, tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys, change, named
):
    how = "path into a new run dir" if "n_layers" in change[0] else "auto"
    client = MlflowClient(mlflow_server)
    run_id = (finished_run / "mlflow_run_id").read_text().strip()
    runs_before = len(client.search_runs([client.get_run(run_id).info.experiment_id]))
    before = _tree(finished_run)
    target = (
        ["--run-dir", str(finished_run), "--resume", "auto"]
        if how == "auto"
        else ["--run-dir", str(tmp_path / "new"), "--resume", str(finished_run / "checkpoints" / "step-000008.ckpt")]
    )
    capsys.readouterr()
    args = ["--data.path", str(tiny_ds), *RUN, *target, *change]
    assert fit_in_process(args, monkeypatch, mlflow_server) == 2
    out, err = capsys.readouterr()
    err = [line for line in err.splitlines() if line.startswith("sinklab fit:")]
    assert len(err) == 1 and named in err[0] and out == "", (err, out)  # no run-dir banner before the refusal
    assert _tree(finished_run) == before and not (tmp_path / "new").exists()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["sinklab.status"] == "finished"
    assert len(client.search_runs([run.info.experiment_id])) == runs_before


def test_extending_max_steps_continues_the_cosine_without_a_jump(
    finished_run, tiny_ds, tmp_path, monkeypatch, mlflow_server
):
    """From the step-4 checkpoint of an 8-step run to 16 steps: the lr at step 4 is the one the
    run had there, then a cosine down to min_lr at step 16, never up; the recorded config says 16."""
    first = {r["step"]: r["train/lr"] for r in read_metrics(finished_run) if "train/lr" in r}
    run_dir = tmp_path / "extended"
    args = [
        "--data.path",
        str(tiny_ds),
        *RUN,
        "--trainer.max_steps",
        "16",
        "--run-dir",
        str(run_dir),
        "--resume",
        str(finished_run / "checkpoints" / "step-000004.ckpt"),
    ]
    assert fit_in_process(args, monkeypatch, mlflow_server) == 0
    lrs = {r["step"]: r["train/lr"] for r in read_metrics(run_dir) if "train/lr" in r}
    assert sorted(lrs) == list(range(4, 16))
    peak, floor, start = 3e-3, 3e-4, first[4]
    assert lrs[4] == pytest.approx(start, rel=1e-9)
    for s in range(4, 16):
        assert lrs[s] == pytest.approx(floor + (start - floor) * (1 + math.cos(math.pi * (s - 4) / 12)) / 2, rel=1e-9)
    assert all(a > b for a, b in zip(list(lrs.values()), list(lrs.values())[1:])) and lrs[15] < 1.2 * floor < peak
    assert "max_steps: 16" in (run_dir / "config.yaml").read_text()


def test_a_checkpoint_of_an_older_format_is_refused_in_one_line(finished_run, tmp_path):
    """The architecture as ``hyper_parameters["model_config"]``, or the lr schedule as a SequentialLR."""
    import torch

    from pipeline.checkpoint import RunDirError, check_resume
    from pipeline.model import ConfigError

    ckpt = finished_run / "checkpoints" / "step-000004.ckpt"
    blob = torch.load(ckpt, weights_only=False)
    hparams, order = blob["hyper_parameters"], blob["SinkDataModule"]["order"]
    assert check_resume(ckpt, hparams["arch"], hparams["optim"], order, 8) == 4  # today's format
    old = tmp_path / "old.ckpt"
    torch.save({**blob, "hyper_parameters": {"model_config": hparams["arch"], "optim": hparams["optim"]}}, old)
    with pytest.raises(
        ConfigError,
        match=r"^\S+old.ckpt: hyper_parameters\['model_config'\] is an older checkpoint format, no longer read",
    ):
        check_resume(old, hparams["arch"], hparams["optim"], order, 8)
    sequential = {"_schedulers": [{}, {}], "_milestones": [2], "last_epoch": 4}
    torch.save({**blob, "lr_schedulers": [sequential]}, old)
    with pytest.raises(RunDirError) as err:
        check_resume(old, hparams["arch"], hparams["optim"], order, 8)
    assert str(err.value) == (
        f"--resume {old}: lr_schedulers holds an older schedule format (SequentialLR / CosineAnnealingLR), "
        f"no longer read; to train those weights under new settings, start a new run with --model.init {old}"
    )
