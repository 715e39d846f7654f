"""The end-of-run summary `sinklab fit` prints (rank 0)."""

from __future__ import annotations

import contextlib
import json
import math

from pipeline import metric_names as N
from pipeline.metrics import memorising
from pipeline.model.attention_ops import proxy_label


def sink_trajectory(
    history: list[tuple[int, float, float]], width: int = 12, column: int = 1, fmt: str = "{:.1f}%"
) -> str:
    """`step:value` pairs of one column of the sink history, thinned to about `width` of them."""
    if not history:
        return "(no sink measurements)"
    picked = history[:: max(1, len(history) // width)]
    if picked[-1] != history[-1]:
        picked.append(history[-1])
    return "  ".join(f"{row[0]}:" + fmt.format(row[column]) for row in picked)


def metric_rows(metrics_path, *keys: str) -> list[tuple]:
    """``(step, value of each key)`` for the rows of metrics.jsonl (every start) that have ``keys[0]``, by
    step; a step logged twice keeps its last value."""
    by_step = {}
    with contextlib.suppress(OSError), open(metrics_path) as f:  # no file yet: no rows
        for line in f:
            row = json.loads(line)
            if keys[0] in row:
                by_step[row["step"]] = (row["step"], *(row.get(k, float("nan")) for k in keys))
    return [by_step[s] for s in sorted(by_step)]


def health_problems(metrics_path, max_steps: int, log_every: int, first_step: int = 0) -> list[str]:
    """What is wrong with a finished run's metrics.jsonl, as lines: train/loss missing where due (every
    ``log_every`` steps from ``first_step``), or a train or validation loss that is not finite."""
    losses = dict(metric_rows(metrics_path, N.TRAIN_LOSS))
    problems = []
    if missing := [s for s in range(first_step, max_steps) if s % max(1, log_every) == 0 and s not in losses]:
        shown = ", ".join(map(str, missing[:5])) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        problems.append(f"{N.TRAIN_LOSS} missing at step {shown} (due every {log_every} steps from {first_step})")
    for key, rows in ((N.TRAIN_LOSS, sorted(losses.items())), (N.VAL_LOSS, metric_rows(metrics_path, N.VAL_LOSS))):
        if bad := next(((s, v) for s, v in rows if not math.isfinite(v)), None):
            problems.append(f"{key} is {bad[1]} at step {bad[0]}")
    return problems


def skipped_lines(guard) -> list[str]:
    """The steps the spike guard skipped (run.skip_spikes), named; nothing without the guard."""
    if guard is None:
        return []
    named = ", ".join(map(str, guard.skipped[:20])) + (
        f" (+{len(guard.skipped) - 20} more)" if len(guard.skipped) > 20 else ""
    )
    rule = f"loss or grad norm > {guard.sigmas:g}σ above the last {guard.window} steps"
    return [f"skipped      {len(guard.skipped)} steps ({rule})" + (f": {named}" if named else "")]


def print_summary(cli, train_s: float) -> None:
    """The summary of this start, whose fit took ``train_s`` seconds."""
    trainer, plan = cli.trainer, cli.plan
    steps = trainer.global_step
    vals = metric_rows(cli.run_dir.metrics_path, N.VAL_LOSS)
    sinks = metric_rows(cli.run_dir.metrics_path, N.SINK1, N.ALPHA1_MEAN)
    proxy = proxy_label(cli.model.arch.attention)
    sink_s, figure_s = cli.sink_cb.seconds, cli.sink_cb.figure_seconds
    share = lambda part, whole: f"{100 * part / whole if whole else 0:.2f}%"  # noqa: E731
    logger = trainer.logger
    lines = [
        "",
        "── sinklab fit: summary " + "─" * 40,
        f"run dir      {cli.run_dir.root}",
        f"steps        {steps}  ({plan.describe()})",
        f"tokens       {steps * plan.global_batch_tokens:,}",
        "val loss     " + ("  ".join(f"{s}:{v:.3f}" for s, v in vals[-6:]) if vals else "(none)"),
        *(["             warning: " + note] if (note := memorising(vals)) else []),
        "Sink_1 (ε=0.3, % of layer×head×sequence" + (f"; {proxy})" if proxy else ")"),
        f"             {sink_trajectory(sinks)}",
        "mean α₁      " + sink_trajectory(sinks, column=2, fmt="{:.3f}"),
        *skipped_lines(cli.model.spike_guard),
        f"time         {train_s:.0f} s training in this start; sink metrics {sink_s:.1f} s "
        f"({share(sink_s, train_s)} of it), their figures {figure_s:.1f} s ({share(figure_s, train_s)})",
    ]
    if getattr(logger, "_run_id", None) and getattr(logger, "offline", False):
        lines.append(
            f"MLflow       run {logger._run_id} at {logger._tracking_uri}, unreachable: what it lacks waits in "
            f"{cli.run_dir.metrics_path} for the next start (--resume auto)"
        )
    elif getattr(logger, "_run_id", None):
        lines.append(f"MLflow       run {logger._run_id} in experiment '{logger.name}' at {logger._tracking_uri}")
        from pipeline.tracking import run_experiment_url

        served = "" if logger._tracking_uri.startswith("http") else "`make ui`, then "
        lines.append(f"             open it: {served}{run_experiment_url(logger._tracking_uri, logger._run_id)}")
    else:
        lines.append(f"MLflow       offline; metrics in {cli.run_dir.metrics_path}")
    print("\n".join(lines), flush=True)
