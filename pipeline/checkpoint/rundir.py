"""The run directory: where one training run keeps everything a resumed job needs (docs/training.md).
Checkpoint names avoid ``ckpt_``, which Lightning's SLURM support scans for (``cluster.submit.check_run_dir``).
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path

import psutil

from sinklab_io.atomic import atomic_write, remove

CKPT_RE = re.compile(r"^step-(\d{6,})\.ckpt$")


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked."""


class RunDir:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.checkpoints = self.root / "checkpoints"
        self.lock_path = self.root / "lock"
        self.metrics_path = self.root / "metrics.jsonl"

    def create(self) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)

    def step_checkpoints(self) -> list[tuple[int, Path]]:
        """Complete `step-N.ckpt` checkpoints, oldest first: a file once renamed into place, a DeepSpeed
        directory once its ``latest`` file (written last) exists."""
        if not self.checkpoints.is_dir():
            return []
        names = ((CKPT_RE.match(p.name), p) for p in self.checkpoints.iterdir())
        return sorted((int(m.group(1)), p) for m, p in names if m and (p.is_file() or (p / "latest").is_file()))

    def newest_checkpoint(self, usable: Callable[[Path], bool] = lambda path: True) -> Path | None:
        """The newest complete step checkpoint that ``usable`` accepts."""
        return next((p for _, p in reversed(self.step_checkpoints()) if usable(p)), None)

    def prune(self, keep_last: int) -> None:
        """Delete all but the newest `keep_last` step checkpoints (0 keeps all)."""
        for _, p in self.step_checkpoints()[:-keep_last] if keep_last > 0 else []:
            remove(p)

    def mlflow_run_id(self) -> str | None:
        path = self.root / "mlflow_run_id"
        return path.read_text().strip() or None if path.exists() else None

    def save_mlflow_run_id(self, run_id: str) -> None:
        atomic_write(self.root / "mlflow_run_id", run_id + "\n")

    def set_aside(self) -> Path:
        """Move what the run recorded so far into ``restart-N/``, for a start over from step 0."""
        aside = self.root / f"restart-{1 + sum(1 for _ in self.root.glob('restart-*'))}"
        aside.mkdir()
        for name in ("checkpoints", "metrics.jsonl", "mlflow_sent", "mlflow_run_id"):
            if (self.root / name).exists():
                os.replace(self.root / name, aside / name)
        return aside

    def save_config(self, text: str) -> Path:
        """config.yaml for the first start; config.<n>.yaml for a resume whose config changed."""
        first = self.root / "config.yaml"
        if not first.exists():
            return atomic_write(first, text)
        versions = sorted(self.root.glob("config*.yaml"), key=lambda p: p.stat().st_mtime_ns)
        if versions[-1].read_text() == text:
            return versions[-1]
        return atomic_write(self.root / f"config.{len(versions)}.yaml", text)


def _holder(run: RunDir) -> dict:
    """Who the lock file names ({} when it is missing or unreadable)."""
    try:
        return json.loads(run.lock_path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return {}


def acquire_lock(run: RunDir) -> dict:
    """Claim the run directory for this job, or raise if another live job holds it; a dead process on
    this host or the same SLURM job id (a requeued job) is taken over."""
    run.root.mkdir(parents=True, exist_ok=True)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}
    for _ in range(2):
        try:
            fd = os.open(run.lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(run)
            same_job = me["slurm_job_id"] and holder.get("slurm_job_id") == me["slurm_job_id"]
            dead_local = (
                holder.get("host") == me["host"]
                and isinstance(holder.get("pid"), int)
                and not psutil.pid_exists(holder["pid"])
            )
            if not (same_job or dead_local or not holder):
                raise RunDirError(
                    f"{run.lock_path}: run directory is in use by pid {holder.get('pid')} on "
                    f"{holder.get('host')} (SLURM job {holder.get('slurm_job_id')}); wait for it to end, "
                    "use another --run-dir, or delete the lock file if that job is gone"
                ) from None
            run.lock_path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me))
        return me
    raise RunDirError(f"{run.lock_path}: could not take over the lock (another job raced for it)")


def release_lock(run: RunDir) -> None:
    holder = _holder(run)
    if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        run.lock_path.unlink(missing_ok=True)
