"""`make gpu-check`: the cluster path on one lent GPU, in under 10 minutes, with one summary.

1. the embedded corpus packed at C = 2048 (`sinklab prep embedded`, once);
2. `sinklab fit` of paper-60m.yaml as a cluster job runs it (DeepSpeed ZeRO-2, bf16-mixed) with
   a smaller batch (256K tokens) for 200 steps: stopped by SIGUSR1 after its step-100
   checkpoint, then resumed with `--resume auto` (the preemption path of a SLURM job);
3. `benchmarks/bench_gpu.py --compile` (SinkLab against HF LlamaForCausalLM, attention kernels).

The summary's tokens/s and MFU are the run's own `perf/*` metrics (median over its windows).
Without CUDA it says so and exits 2: on a CPU, `make test` runs the same DeepSpeed path on gloo.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DATA, RUN = REPO / "data" / "embedded-c2048", REPO / "runs" / "gpu-check"
STEPS, STOP_AFTER = 200, 100
SINKLAB = [sys.executable, "-m", "pipeline.cli"]
FIT = [*SINKLAB, "fit", "--config", "configs/recipes/paper-60m.yaml", "--data.path", str(DATA), "--run-dir", str(RUN),
       "--resume", "auto", "--trainer.devices", "1", "--trainer.max_steps", str(STEPS),
       "--data.global_batch_tokens", "262144", "--data.micro_batch_size", "16", "--model.optim.warmup_steps", "20",
       "--run.name", "gpu-check", "--run.experiment", "gpu-check", "--run.checkpoint_every", str(STOP_AFTER),
       "--run.sink_every", "50", "--run.val_every", "100", "--run.throughput_window", "10"]


def rows() -> list[dict]:
    path = RUN / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def fit_with_preemption() -> float:
    """First start: SIGUSR1 once the step-100 checkpoint exists; second start: to the end."""
    t0 = time.time()
    proc = subprocess.Popen(FIT, cwd=REPO)
    while proc.poll() is None and not (RUN / "checkpoints" / f"step-{STOP_AFTER:06d}.ckpt" / "latest").exists():
        time.sleep(1)
    if proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)
    if proc.wait() != 0:
        sys.exit(f"gpu-check: the first start of sinklab fit failed (exit {proc.returncode})")
    if subprocess.run(FIT, cwd=REPO).returncode != 0:
        sys.exit("gpu-check: the resumed start of sinklab fit failed")
    return time.time() - t0


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: needs a CUDA GPU (torch.cuda.is_available() is False); on a CPU, `make test` runs "
              "sinklab fit under DeepSpeed ZeRO 1-3 over gloo", file=sys.stderr)
        return 2
    if not (DATA / "manifest.json").exists():
        subprocess.run([*SINKLAB, "prep", "embedded", "--out", str(DATA), "--context-length", "2048",
                        "--no-progress"], cwd=REPO, check=True)
    fit_s = fit_with_preemption()
    metrics = rows()
    losses = {r["step"]: r["train/loss"] for r in metrics if "train/loss" in r}
    tps = [r["perf/tokens_per_s"] for r in metrics if "perf/tokens_per_s" in r]
    mfu = [r["perf/mfu"] for r in metrics if "perf/mfu" in r]
    bench = subprocess.run([sys.executable, "benchmarks/bench_gpu.py", "--compile"], cwd=REPO,
                           capture_output=True, text=True)
    print(bench.stdout[-6000:], bench.stderr[-2000:] if bench.returncode else "", sep="\n")
    lines = [
        "── gpu-check: summary " + "─" * 40,
        f"device       {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}",
        f"fit          paper-60m, DeepSpeed ZeRO-2, bf16-mixed, 256K tokens/step: {len(losses)} steps logged "
        f"({'0..' + str(STEPS - 1) + ' each once' if sorted(losses) == list(range(STEPS)) else 'GAPS: ' + str(sorted(losses))})",
        f"preemption   SIGUSR1 after step {STOP_AFTER}, resumed: "
        f"{'yes' if (RUN / 'checkpoints' / f'step-{STEPS:06d}.ckpt').exists() else 'NO final checkpoint'}; "
        f"{fit_s:.0f} s both starts",
        f"loss         {losses.get(0, float('nan')):.3f} -> {losses.get(STEPS - 1, float('nan')):.3f}",
        f"speed        {statistics.median(tps):,.0f} tokens/s, MFU {100 * statistics.median(mfu):.1f}% (median of "
        f"{len(tps)} windows)" if tps and mfu else "speed        no perf/* metrics logged",
        f"bench-gpu    {next((l for l in bench.stdout.splitlines() if l.startswith('ratio=')), 'no ratio line')}",
    ]
    print("\n".join(lines))
    return 0 if bench.returncode == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
