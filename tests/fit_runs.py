"""`sinklab fit` on the tiny recipe for the tests of the training, tracking and checkpoint parts:
its flags, in process or as a subprocess, and what a run directory holds (imported by name:
tests/ is on sys.path through tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "recipes" / "cpu-tiny.yaml")


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def losses(run_dir: Path) -> dict[int, float]:
    return {row["step"]: row["train/loss"] for row in read_metrics(run_dir) if "train/loss" in row}


def paths(dataset: Path, run_dir: Path) -> list[str]:
    """fit flags naming the dataset and the run directory."""
    return ["--data.path", str(dataset), "--run-dir", str(run_dir)]


def keep_checkpoints(every: int) -> list[str]:
    """fit flags for a checkpoint every `every` steps, none pruned."""
    return ["--run.checkpoint_every", str(every), "--run.keep_last", "0"]


def checkpoints_only(every: int) -> list[str]:
    """fit flags for a run that keeps every checkpoint and runs no probe or validation."""
    return [*keep_checkpoints(every), "--run.sink_every", "0", "--run.val_every", "0"]


def lean_tracking() -> list[str]:
    """fit flags that log no model and no system metrics to MLflow (params and metrics only)."""
    return ["--run.log_model", "false", "--run.system_metrics", "false"]


def fit_in_process(args: list[str], monkeypatch, tracking_uri: str) -> int:
    from pipeline.train.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    return main(["--config", TINY, *args])


@contextmanager
def built_fit(args: list[str]):
    """`sinklab fit`'s CLI built from `args` (trainer, model and data; nothing run), its run lock
    released afterwards."""
    from pipeline.checkpoint import release_lock
    from pipeline.train.cli import SinkLabCLI
    from pipeline.train.data import SinkDataModule
    from pipeline.train.module import SinkLabModule

    cli = SinkLabCLI(
        SinkLabModule, SinkDataModule, run=False, save_config_callback=None, auto_configure_optimizers=False, args=args
    )
    try:
        yield cli
    finally:
        release_lock(cli.run_dir)


def fit_command(args: list[str]) -> list[str]:
    """The command line of `sinklab fit` on the tiny recipe."""
    return [sys.executable, "-m", "pipeline.cli", "fit", "--config", TINY, *args]


def sinklab_process(args: list[str], uri: str) -> subprocess.Popen:
    """`sinklab fit` on the tiny recipe in a subprocess (stdout and stderr together, as text), in a
    process group of its own: ``os.killpg(proc.pid, ...)`` reaches every rank it launches."""
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        fit_command(args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = 240) -> int:
    """Wait until the run in `proc` has logged `step`'s loss; the newest step logged."""
    deadline = time.time() + timeout
    while max(losses(run_dir), default=-1) < step:
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        assert time.time() < deadline, "the training processes made no progress"
        time.sleep(0.05)
    return max(losses(run_dir))


def logged_image_keys(client, run_id: str) -> dict[str, list[int]]:
    """Image key -> sorted steps of the run's logged images (MLflow keeps them under ``images/``)."""
    found: dict[str, set[int]] = {}
    for item in client.list_artifacts(run_id, "images"):
        name = Path(item.path).name
        if name.endswith(".png"):
            key, _, step, *_ = name.split("+")
            found.setdefault(key.replace("~", "/"), set()).add(int(step))
    return {key: sorted(steps) for key, steps in found.items()}
