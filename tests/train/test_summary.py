"""pipeline/train/summary.py: the sink trajectory of the end-of-run summary, and the health check
that reads each metric at its logged cadence."""

from __future__ import annotations


def test_summary_trajectory_thins_and_keeps_the_last_point():
    from pipeline.train.summary import sink_trajectory

    history = [(s, s / 10, s / 1000) for s in range(0, 500, 100)]
    assert sink_trajectory(history, width=2) == "0:0.0%  200:20.0%  400:40.0%"
    assert sink_trajectory(history, width=2, column=2, fmt="{:.3f}") == "0:0.000  200:0.200  400:0.400"
    assert sink_trajectory([]) == "(no sink measurements)"


def test_health_reads_train_loss_at_its_logged_cadence(tmp_path):
    """The gpu-check summary once called a healthy run broken: train/loss is logged every
    log_every_n_steps, not every step, and the last step is not a multiple of it."""
    import json

    from pipeline.train.summary import health_problems

    def write(rows):
        path = tmp_path / "metrics.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path

    healthy = [{"step": s, "train/loss": 8.5 - s / 100, "train/lr": 1e-4} for s in range(0, 200, 10)]
    healthy += [{"step": s, "perf/tokens_per_s": 4e5} for s in range(10, 201, 10)] + [{"step": 100, "val/loss": 7.0}]
    assert health_problems(write(healthy), max_steps=200, log_every=10) == []
    # a resumed run: the first start logged up to step 110 before it stopped at its step-100 checkpoint
    resumed = healthy[:12] + healthy[10:]
    assert health_problems(write(resumed), max_steps=200, log_every=10) == []
    assert health_problems(write(healthy[10:]), max_steps=200, log_every=10, first_step=100) == []
    gap = [row for row in healthy if row["step"] not in (120, 130)]
    assert health_problems(write(gap), 200, 10) == ["train/loss missing at step 120, 130 (due every 10 steps from 0)"]
    nan = healthy[:5] + [{"step": 50, "train/loss": float("nan")}] + healthy[6:]
    assert health_problems(write(nan), 200, 10) == ["train/loss is nan at step 50"]
    assert health_problems(write([]), 20, 10) == ["train/loss missing at step 0, 10 (due every 10 steps from 0)"]
