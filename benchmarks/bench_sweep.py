"""A local sweep's wall time against the sum of its runs' training times, side by side in one run.

The last line is `ratio=<per-run wall / worker wall>` (docs/experiments.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import arguments

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT, SEEDS = "bb-norm", 3
MODES = {
    "per-run processes": "from pipeline.experiments import pool, sweep; "
    "sys.exit(sweep.main(sys.argv[1:], runner=pool.subprocess_runner))",
    "one warm worker": "from pipeline.experiments import sweep; sys.exit(sweep.main(sys.argv[1:]))",
}


def training_seconds(run_dir: Path) -> float:
    times = [json.loads(line)["time"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return max(times) - min(times)


def measure(mode: str, work: Path, data: Path, steps: int) -> tuple[float, list[float]]:
    store, runs = work / mode.replace(" ", "-"), work / mode.replace(" ", "-") / "runs"
    store.mkdir(parents=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}", "PYTHONPATH": str(ROOT)}
    argv = [EXPERIMENT, "--scale", "cpu", "--local", "--seeds", str(SEEDS), "--runs-root", str(runs)]
    argv += ["--data-path", str(data), "--", "--trainer.max_steps", str(steps)]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "import sys; " + MODES[mode], *argv], env=env, cwd=store)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"bench-sweep: the {mode} sweep failed (exit {done.returncode}); logs under {runs}")
    return wall, [training_seconds(d) for d in sorted(runs.glob(f"{EXPERIMENT}/cpu/*/s*")) if d.is_dir()]


def main() -> None:
    args = arguments(__doc__, steps=400).parse_args()  # steps per run, the recipe's
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "bb-tiny"
        prep = [sys.executable, "-m", "pipeline.cli", "prep", "bb", "--out", str(data), "--context-length", "32"]
        prep += ["--sequences", "4000", "--val-sequences", "64", "--probe-sequences", "50", "--probe-length", "32"]
        subprocess.run(prep, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
        results = {mode: measure(mode, work, data, args.steps) for mode in MODES}
    print(f"\n{EXPERIMENT} at the cpu scale, 2 variants x {SEEDS} seeds, {args.steps} steps a run, one run at a time:")
    print(
        f"{'mode':<20} {'runs':>4} {'wall s':>8} {'training s (sum)':>17} {'other s per run':>16} {'wall/training':>14}"
    )
    for mode, (wall, trained) in results.items():
        total = sum(trained)
        print(
            f"{mode:<20} {len(trained):>4} {wall:>8.1f} {total:>17.1f} {(wall - total) / len(trained):>16.1f} "
            f"{wall / total:>14.2f}"
        )
    walls = [wall for wall, _ in results.values()]
    print(f"ratio={walls[0] / walls[1]:.2f}")


if __name__ == "__main__":
    main()
