"""A resume continues its checkpoint's run (issue 26): `trainer.max_steps` extends it with the
cosine going on from the resumed step's lr, and a change to what defines the run (model,
optimiser, data order) is refused in one line before anything of the new start is written."""

from __future__ import annotations

import math

import pytest
from conftest import fit_in_process, keep_checkpoints, lean_tracking, paths, read_metrics
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
        (["--model.optim.lr", "1.0"], "model.optim.lr=1.0 (the checkpoint's: 0.003)"),
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


def test_an_old_checkpoint_and_run_config_resume_with_a_notice(
    finished_run, tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys
):
    """A checkpoint and run config written while the architecture was `model.model` (checkpoint:
    ``hyper_parameters["model_config"]``) resume, and start a new run (--model.init), as today's."""
    import torch
    import yaml

    from pipeline.model import ModelConfig
    from pipeline.train.module import read_init

    blob = torch.load(finished_run / "checkpoints" / "step-000004.ckpt", weights_only=False)
    blob["hyper_parameters"]["model_config"] = blob["hyper_parameters"].pop("arch")
    old_ckpt = tmp_path / "old.ckpt"
    torch.save(blob, old_ckpt)
    config = yaml.safe_load((finished_run / "config.yaml").read_text())
    config["model"]["model"] = config.pop("arch")
    old_config = tmp_path / "old-config.yaml"
    old_config.write_text(yaml.safe_dump(config))
    capsys.readouterr()
    run_dir = tmp_path / "resumed"
    args = ["--config", str(old_config), "--run-dir", str(run_dir), "--resume", str(old_ckpt), "--data.path"]
    assert fit_in_process([*args, str(tiny_ds)], monkeypatch, mlflow_server) == 0
    err = capsys.readouterr().err
    assert f"sinklab: {old_config}: `model.model` read as `arch`" in err
    assert f"sinklab: {old_ckpt}: `hyper_parameters['model_config']` read as `arch`" in err
    assert sorted(r["step"] for r in read_metrics(run_dir) if "train/lr" in r) == [4, 5, 6, 7]  # resumed at 4
    assert "arch" in yaml.safe_load((run_dir / "config.yaml").read_text())  # recorded under today's name
    state, _ = read_init(str(old_ckpt), ModelConfig.from_dict(blob["hyper_parameters"]["model_config"]))
    assert torch.equal(state["embed.weight"], blob["state_dict"]["model.embed.weight"])
