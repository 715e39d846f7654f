"""The progress bar of `sinklab fit`: optimizer steps out of max_steps, with the run's speed."""

from __future__ import annotations

from fit_runs import fit_in_process, lean_tracking, paths

from pipeline.train.progress import StepProgressBar


def test_the_bar_counts_optimizer_steps_to_max_steps_and_resumes_where_it_stopped(tiny_ds, tmp_path, monkeypatch):
    seen = []
    real = StepProgressBar.on_train_batch_end

    def recording(self, trainer, *args):
        real(self, trainer, *args)
        task = self.train_progress_bar
        seen.append((task.description, task.completed, task.total, self.get_metrics(trainer, trainer.lightning_module)))

    monkeypatch.setattr(StepProgressBar, "on_train_batch_end", recording)
    monkeypatch.setenv("SINKLAB_PEAK_TFLOPS", "0.001")  # a peak for the CPU, so MFU is shown
    run = [
        *paths(tiny_ds, tmp_path / "run"),
        "--trainer.enable_progress_bar",
        "true",
        "--run.sink_every",
        "0",
        "--run.val_every",
        "0",
        *lean_tracking(),
        "--run.checkpoint_every",
        "2",
        "--run.throughput_window",
        "2",
    ]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # cpu-tiny: 8 sequences a step in micro-batches of 4, so two batches per optimizer step
    assert fit_in_process([*run, "--trainer.max_steps", "4"], monkeypatch, uri) == 0
    assert [(d, c, t) for d, c, t, _ in seen] == [("train", c, 4) for c in (0, 1, 1, 2, 2, 3, 3, 4)]
    assert set(seen[-1][3]) == {"loss", "tokens/s", "MFU"} and seen[-1][3]["MFU"].endswith("%")
    seen.clear()
    assert fit_in_process([*run, "--trainer.max_steps", "6", "--resume", "auto"], monkeypatch, uri) == 0
    assert [(c, t) for _, c, t, _ in seen] == [(4, 6), (5, 6), (5, 6), (6, 6)]
