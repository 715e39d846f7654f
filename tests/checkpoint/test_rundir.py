"""pipeline/checkpoint/rundir.py: the run directory's lock, and which of its checkpoints is the
newest complete one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from pipeline.checkpoint import RunDir, RunDirError, acquire_lock, release_lock


def _write_lock(run: RunDir, pid: int, job: str | None = None):
    import json

    run.root.mkdir(parents=True, exist_ok=True)
    run.lock_path.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "slurm_job_id": job}))


def test_lock_refuses_a_live_job_and_takes_over_dead_or_requeued(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run = RunDir(tmp_path / "run")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(run, live.pid)
        with pytest.raises(RunDirError, match=f"in use by pid {live.pid}"):
            acquire_lock(run)
        monkeypatch.setenv("SLURM_JOB_ID", "777")
        _write_lock(run, live.pid, job="777")  # requeued SLURM job: same id, maybe another node
        assert acquire_lock(run)["pid"] == os.getpid()
    finally:
        live.kill()
        live.wait()
    monkeypatch.delenv("SLURM_JOB_ID")
    _write_lock(run, live.pid)  # now a dead pid on this host
    assert acquire_lock(run)["pid"] == os.getpid()
    release_lock(run)
    assert not run.lock_path.exists()


def test_newest_checkpoint_skips_partial_and_prunes(tmp_path):
    run = RunDir(tmp_path)
    run.create()
    for step in (4, 8, 12):
        (run.checkpoints / f"step-{step:06d}.ckpt").write_bytes(b"x")
    (run.checkpoints / ".step-000016.ckpt.partial").write_bytes(b"x")
    (run.checkpoints / "step-000020.ckpt").mkdir()  # DeepSpeed dir without 'latest': incomplete
    assert run.newest_checkpoint().name == "step-000012.ckpt"
    run.prune(2)
    assert [s for s, _ in run.step_checkpoints()] == [8, 12]
