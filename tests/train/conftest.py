from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packed_datasets import make_dataset

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "recipes" / "cpu-tiny.yaml")


@pytest.fixture(scope="session")
def tiny_ds(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("ds") / "tiny")


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def losses(run_dir: Path) -> dict[int, float]:
    return {row["step"]: row["train/loss"] for row in read_metrics(run_dir) if "train/loss" in row}


def checkpoints_only(every: int) -> list[str]:
    """fit flags for a run that writes every checkpoint and no probe or validation."""
    return [
        "--run.checkpoint_every",
        str(every),
        "--run.keep_last",
        "0",
        "--run.sink_every",
        "0",
        "--run.val_every",
        "0",
    ]


def fit_in_process(args: list[str], monkeypatch, tracking_uri: str) -> int:
    from pipeline.train.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    return main(["--config", TINY, *args])


def sinklab_process(args: list[str], uri: str) -> subprocess.Popen:
    """`sinklab fit` on the tiny recipe in a subprocess (stdout and stderr together, as text), in a
    process group of its own: ``os.killpg(proc.pid, ...)`` reaches every rank it launches."""
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "fit", "--config", TINY, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
