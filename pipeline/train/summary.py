"""The end-of-run summary `sinklab fit` prints (rank 0)."""
from __future__ import annotations

import json


def sink_trajectory(history: list[tuple[int, float, float]], width: int = 12, column: int = 1,
                    fmt: str = "{:.1f}%") -> str:
    """`step:value` pairs of one column of the sink history, thinned to about `width` of them."""
    if not history:
        return "(no sink measurements)"
    stride = max(1, len(history) // width)
    picked = history[::stride]
    if picked[-1] != history[-1]:
        picked.append(history[-1])
    return "  ".join(f"{row[0]}:" + fmt.format(row[column]) for row in picked)


def val_losses(metrics_path) -> list[tuple[int, float]]:
    out = []
    try:
        with open(metrics_path) as f:
            for line in f:
                row = json.loads(line)
                if "val/loss" in row:
                    out.append((row["step"], row["val/loss"]))
    except OSError:
        pass
    return out


def print_summary(cli) -> None:
    trainer, plan = cli.trainer, cli.plan
    steps = trainer.global_step
    tokens = steps * plan.global_batch_tokens
    vals = val_losses(cli.run.metrics_path)
    train_s = cli.throughput_cb.train_seconds
    sink_s = cli.sink_cb.seconds
    logger = trainer.logger
    lines = [
        "",
        "── sinklab fit: summary " + "─" * 40,
        f"run dir      {cli.run.root}",
        f"steps        {steps}  ({plan.describe()})",
        f"tokens       {tokens:,}",
        "val loss     " + ("  ".join(f"{s}:{v:.3f}" for s, v in vals[-6:]) if vals else "(none)"),
        "Sink_1 (ε=0.3, % of layer×head×sequence" + ("; proxy scores sim/Σ sim)" if cli.sink_cb.is_proxy else ")"),
        f"             {sink_trajectory(cli.sink_cb.history)}",
        "mean α₁      " + sink_trajectory(cli.sink_cb.history, column=2, fmt="{:.3f}"),
        f"time         {train_s:.0f} s training; sink metrics {sink_s:.1f} s "
        f"({100 * sink_s / train_s if train_s else 0:.2f}% of it)",
    ]
    if getattr(logger, "_run_id", None):
        lines.append(f"MLflow       run {logger._run_id} in experiment '{logger.name}' at {logger._tracking_uri}")
        lines.append("             open it: `make ui`, then http://127.0.0.1:5000")
    else:
        lines.append(f"MLflow       offline; metrics in {cli.run.metrics_path}")
    print("\n".join(lines), flush=True)
