"""What a report reads of a run, with no MLflow: the config hash and the run shown per seed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.tracking.summaries import RunSummary, best_runs, config_hash


def test_the_config_hash_leaves_out_what_names_one_run_and_nothing_else():
    base = {"optim.lr": "0.002", "arch.preset": "bb-tiny", "seed_everything": "1234", "data.seed": "1234"}
    other_seed = {**base, "seed_everything": "1235", "data.seed": "1235", "run.name": "a s1235", "run_dir": "runs/x"}
    assert config_hash(base) == config_hash(other_seed) and len(config_hash(base)) == 12
    assert config_hash({**base, "optim.lr": "0.004"}) != config_hash(base)
    assert config_hash({}) is None and config_hash({"seed_everything": "1"}) is None


def test_per_seed_the_newest_finished_run_else_the_newest():
    runs = [
        RunSummary("failed-new", "a", "failed", 3, seed=2),
        RunSummary("done", "a", "finished", 2, seed=2),
        RunSummary("running", "a", "running", 1, seed=1),
    ]  # newest first, as MLflow lists them
    assert {seed: r.run_id for seed, r in best_runs(runs).items()} == {1: "running", 2: "done"}
    assert list(best_runs(runs)) == [1, 2]


def test_reading_a_run_summary_loads_no_mlflow():
    code = "import sys; from pipeline import tracking; tracking.best_runs([]); assert 'mlflow' not in sys.modules"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
