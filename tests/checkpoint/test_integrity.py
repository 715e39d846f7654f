"""A checkpoint on disk is always finite and complete; `--resume auto` never picks a damaged one."""

from __future__ import annotations

import torch
from fit_runs import checkpoints_only, fit_in_process, losses, paths

from pipeline.checkpoint import checkpoint_problem, nonfinite_state


def test_a_diverging_run_writes_no_nonfinite_checkpoint(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    """lr 1e6: the update after step 1 breaks the weights. Step 2's checkpoint is not written, the
    step-1 one is not rotated away, and a resume starts from finite weights."""
    run_dir = tmp_path / "diverged"
    args = [
        *paths(tiny_ds, run_dir),
        "--optim.lr",
        "1e6",
        "--optim.min_lr",
        "1",
        "--run.checkpoint_every",
        "1",
        "--run.keep_last",
        "1",
    ]
    assert fit_in_process(args, monkeypatch, mlflow_server) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        "sinklab fit: non-finite weights or optimizer state after step 2: stopping without writing that checkpoint"
    ), err[-3:]
    ckpts = sorted((run_dir / "checkpoints").iterdir())
    assert [p.name for p in ckpts] == ["step-000001.ckpt"]
    blob = torch.load(ckpts[0], weights_only=False)
    assert all(torch.isfinite(t).all() for t in blob["state_dict"].values())
    moments = [t for s in blob["optimizer_states"][0]["state"].values() for t in s.values() if t.is_floating_point()]
    assert moments and all(torch.isfinite(t).all() for t in moments)


def test_nonfinite_state_sees_weights_and_moments():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    assert not nonfinite_state(model, [opt])
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert not nonfinite_state(model, [opt])
    opt.state[model.weight]["exp_avg_sq"][0, 0] = float("inf")
    assert nonfinite_state(model, [opt])
    opt.state[model.weight]["exp_avg_sq"][0, 0] = 0.0
    with torch.no_grad():
        model.bias[1] = float("nan")
    assert nonfinite_state(model, [opt])


def test_resume_auto_passes_over_a_truncated_checkpoint(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    run_dir = tmp_path / "run"
    args = [*paths(tiny_ds, run_dir), *checkpoints_only(4)]
    assert fit_in_process([*args, "--trainer.max_steps", "8"], monkeypatch, mlflow_server) == 0
    reference = losses(run_dir)
    newest = run_dir / "checkpoints" / "step-000008.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a copy cut short
    assert "step-000008.ckpt cannot be read" in checkpoint_problem(newest)
    capsys.readouterr()

    # --resume PATH: one line that names the file
    assert (
        fit_in_process([*args, "--trainer.max_steps", "12", "--resume", str(newest)], monkeypatch, mlflow_server) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"sinklab fit: --resume {newest}: damaged checkpoint: step-000008.ckpt cannot be read"), (
        err[-3:]
    )

    # --resume auto: a warning that names it, then the older one
    assert fit_in_process([*args, "--trainer.max_steps", "12", "--resume", "auto"], monkeypatch, mlflow_server) == 0
    assert f"sinklab fit: warning: passing over {newest}: step-000008.ckpt cannot be read" in capsys.readouterr().err
    resumed = losses(run_dir)
    assert sorted(resumed) == list(range(12))
    assert resumed[4] == reference[4]  # from the step-4 weights (later steps: a 12-step schedule)
    assert checkpoint_problem(newest) is None  # rewritten by the resumed run


def test_checkpoint_problem_names_what_is_wrong(tmp_path):
    assert checkpoint_problem(tmp_path / "gone.ckpt") == "not there"
    other = tmp_path / "other.ckpt"
    torch.save({"weights": torch.zeros(2)}, other)
    assert checkpoint_problem(other) == "not a Lightning checkpoint (no state_dict)"
    half = tmp_path / "half.ckpt"
    half.mkdir()
    assert "without its 'latest' file" in checkpoint_problem(half)
