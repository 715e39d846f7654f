"""Exact resume: a run killed with SIGKILL between checkpoints and resumed with --resume auto
matches an uninterrupted run bit for bit (losses, final weights, optimizer state), continues
the same MLflow run, and replays no batch. Also the 2-process gloo DDP run."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from fit_runs import fit_in_process, keep_checkpoints, losses, paths, read_metrics, sinklab_process, wait_for_step
from mlflow.tracking import MlflowClient

ARGS = ["--trainer.max_steps", "12", *keep_checkpoints(4), "--run.sink_every", "6"]
# two gloo processes of micro-batch 2: the 8-sequence step in 2 accumulated micro-batches each
# the killed run: 8 steps between its checkpoints, so the kill lands between two with steps to spare
KILL_ARGS = ["--trainer.max_steps", "24", *keep_checkpoints(8), "--run.sink_every", "6"]
DDP_TWO_RANKS = ["--data.micro_batch_size", "2", "--trainer.devices", "2", "--trainer.strategy", "ddp"]


def test_sigkill_then_resume_is_bitwise_identical(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    data = ["--data.path", str(tiny_ds)]
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "killed"
    assert fit_in_process([*data, "--run-dir", str(ref_dir), *KILL_ARGS], monkeypatch, mlflow_server) == 0

    proc = sinklab_process([*data, "--run-dir", str(run_dir), *KILL_ARGS], mlflow_server)
    wait_for_step(proc, run_dir, 10)  # past the step-8 checkpoint, before step 16
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    killed_at = max(losses(run_dir))
    assert killed_at < 16
    assert [p.name for p in sorted((run_dir / "checkpoints").iterdir())] == ["step-000008.ckpt"]
    assert (run_dir / "lock").exists()  # left behind by the dead process, taken over below

    assert (
        fit_in_process([*data, "--run-dir", str(run_dir), "--resume", "auto", *KILL_ARGS], monkeypatch, mlflow_server)
        == 0
    )
    ref, rows = losses(ref_dir), read_metrics(run_dir)
    resumed = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}  # later rows win
    assert resumed == ref and sorted(ref) == list(range(24))
    before_kill = [r for r in rows if "train/loss" in r][: killed_at + 1]
    assert all(r["train/loss"] == ref[r["step"]] for r in before_kill)  # the subprocess agreed too

    a = torch.load(ref_dir / "checkpoints" / "step-000024.ckpt", weights_only=False)
    b = torch.load(run_dir / "checkpoints" / "step-000024.ckpt", weights_only=False)
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in ("exp_avg", "exp_avg_sq"))
    assert (
        a["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        == b["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        == [{"consumed_samples": 192, "global_batch_seqs": 8, "seed": 1234, "n_sequences": 64}]
    )

    client = MlflowClient(mlflow_server)
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    hist = {m.step: m.value for m in client.get_metric_history(run_id, "train/loss")}
    assert hist == ref  # one MLflow run across the kill and the resume
    assert client.get_run(run_id).data.tags["sinklab.status"] == "finished"
    assert (run_dir / "config.yaml").exists() and not (run_dir / "config.1.yaml").exists()


def test_two_process_ddp_over_gloo_matches_one_process(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    data = [
        "--data.path",
        str(tiny_ds),
        "--trainer.max_steps",
        "4",
        "--run.sink_every",
        "4",
        "--run.checkpoint_every",
        "4",
        "--run.experiment",
        "train-ddp",
    ]
    one = tmp_path / "one"
    # global batch 8 seqs: 1 process x micro 2 x accum 4  vs  2 processes x micro 2 x accum 2
    assert (
        fit_in_process([*data, "--run-dir", str(one), "--data.micro_batch_size", "2"], monkeypatch, mlflow_server) == 0
    )
    two = tmp_path / "two"
    proc = sinklab_process([*data, "--run-dir", str(two), *DDP_TWO_RANKS], mlflow_server)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "micro 2 x accum 2 x world 2" in out
    l1, l2 = losses(one), losses(two)
    assert sorted(l2) == [0, 1, 2, 3]
    assert all(abs(l1[s] - l2[s]) < 1e-5 for s in l1), (l1, l2)
    a = torch.load(one / "checkpoints" / "step-000004.ckpt", weights_only=False)["state_dict"]
    b = torch.load(two / "checkpoints" / "step-000004.ckpt", weights_only=False)["state_dict"]
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("train-ddp")
    assert len(client.search_runs([exp.experiment_id])) == 2  # one per job, none from rank 1
    assert len([r for r in read_metrics(two) if "train/loss" in r]) == 4  # rank 0 only


def test_resume_twice_with_gradient_accumulation(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    """Micro-batch 2 of an 8-sequence step: 4 micro-batches per step. Checkpoints must be taken at
    step ends only, so resuming from one, and again from the next, reproduces the reference."""
    import shutil

    args = ["--data.path", str(tiny_ds), "--data.micro_batch_size", "2", *ARGS]
    ref_dir = tmp_path / "reference"
    assert fit_in_process([*args, "--run-dir", str(ref_dir)], monkeypatch, mlflow_server) == 0
    ref = losses(ref_dir)
    source = ref_dir / "checkpoints" / "step-000004.ckpt"
    for hop, resume_step in enumerate((4, 8)):
        run_dir = tmp_path / f"hop{hop}"
        (run_dir / "checkpoints").mkdir(parents=True)
        start = run_dir / "checkpoints" / source.name
        shutil.copy(source, start)
        blob = torch.load(start, weights_only=False)
        assert blob["global_step"] == resume_step
        assert blob["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["consumed_samples"] == 8 * resume_step
        assert fit_in_process([*args, "--run-dir", str(run_dir), "--resume", "auto"], monkeypatch, mlflow_server) == 0
        resumed = losses(run_dir)
        # the checkpoint it resumed from is not written again (once, mid-accumulation, it was)
        assert start.read_bytes() == source.read_bytes()
        assert sorted(resumed) == list(range(resume_step, 12))
        assert resumed == {s: ref[s] for s in resumed}
        source = run_dir / "checkpoints" / "step-000008.ckpt"


def test_a_rank_killed_mid_run_is_named_in_one_line_and_the_run_resumes(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    """SIGKILL of one rank of a 2-process gloo run (DDP here; DeepSpeed's ZeRO talks over the same
    process group): one line, no gloo traceback, names the rank and how it ended, and says how to
    continue; --resume auto does."""
    import subprocess

    run_dir = tmp_path / "lost-rank"
    args = [
        *paths(tiny_ds, run_dir),
        "--trainer.max_steps",
        "40",
        "--run.sink_every",
        "0",
        "--run.checkpoint_every",
        "4",
        *DDP_TWO_RANKS,
        "--run.system_metrics",
        "false",
    ]
    proc = sinklab_process(args, mlflow_server)
    wait_for_step(proc, run_dir, 5)
    rank1 = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    os.kill(int(rank1[0]), signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.startswith("sinklab fit:")]
    assert proc.returncode == 1 and len(lines) == 1, out[-3000:]
    assert lines[0].startswith(
        f"sinklab fit: rank 1 (pid {rank1[0]}, killed by SIGKILL) ended during training at step "
    )
    assert "is kept: continue with --resume auto" in lines[0] and "Traceback" not in out
    assert (
        fit_in_process(
            [
                *args,
                "--resume",
                "auto",
                "--trainer.max_steps",
                "10",
                "--trainer.devices",
                "1",
                "--trainer.strategy",
                "auto",
            ],
            monkeypatch,
            mlflow_server,
        )
        == 0
    )  # on one process
    assert sorted(losses(run_dir)) == list(range(10))


def optimizer_tensors(ckpt) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's optimizer state, by parameter index and key."""
    state = torch.load(ckpt, weights_only=False)["optimizer_states"][0]["state"]
    return {f"{i}/{k}": v for i, s in state.items() for k, v in s.items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("name", ["muon", "orthoadam"])
def test_muon_and_orthoadam_resume_bitwise_after_sigkill(name, tiny_ds, tmp_path, monkeypatch, mlflow_server):
    """Each optimiser's state (Muon's momentum and AdamW's moments; OrthoAdam's moments,
    its rotations re-derived) survives a SIGKILL between checkpoints bit for bit."""
    args = ["--data.path", str(tiny_ds), "--optim.name", name, *ARGS, "--trainer.max_steps", "8"]
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "killed"
    assert fit_in_process([*args, "--run-dir", str(ref_dir)], monkeypatch, mlflow_server) == 0
    proc = sinklab_process([*args, "--run-dir", str(run_dir)], mlflow_server)
    wait_for_step(proc, run_dir, 5)  # past the step-4 checkpoint, before step 8
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert max(losses(run_dir)) < 8
    assert fit_in_process([*args, "--run-dir", str(run_dir), "--resume", "auto"], monkeypatch, mlflow_server) == 0
    ref = losses(ref_dir)
    assert losses(run_dir) == ref and sorted(ref) == list(range(8))
    a, b = (d / "checkpoints" / "step-000008.ckpt" for d in (ref_dir, run_dir))
    wa, wb = (torch.load(c, weights_only=False)["state_dict"] for c in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = optimizer_tensors(a), optimizer_tensors(b)
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    kinds = {k.split("/")[1] for k in sa}
    assert kinds == (
        {"momentum_buffer", "exp_avg", "exp_avg_sq", "step"} if name == "muon" else {"exp_avg", "exp_avg_sq", "step"}
    )
    params = MlflowClient(mlflow_server).get_run((run_dir / "mlflow_run_id").read_text().strip()).data.params
    assert params["optim.name"] == name
    halves = {k.rsplit(".", 1)[1] for k in params if k.startswith("optim.split.")}
    assert halves == ({"muon", "adamw"} if name == "muon" else {"orthoadam"})


def test_muon_under_deepspeed_is_refused_in_one_line(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    run_dir = tmp_path / "refused"
    args = [*paths(tiny_ds, run_dir), "--optim.name", "muon"]
    assert fit_in_process([*args, "--trainer.strategy", "deepspeed_stage_2"], monkeypatch, mlflow_server) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sinklab fit:")]
    assert len(err) == 1 and "optim.name=muon: under DeepSpeed ZeRO" in err[0] and "ddp or fsdp2" in err[0]
    assert not run_dir.exists()
