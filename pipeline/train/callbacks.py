"""Training callbacks: preemption, live sink metrics, throughput / MFU (step checkpoints:
pipeline.checkpoint.StepCheckpoint)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from pipeline import metric_names as N
from pipeline import probe as sink_probe
from pipeline.checkpoint import RunDir, StepCheckpoint, at_step_end
from pipeline.flops import PEAK_ENV, device_peak_flops, flops_per_token, mfu
from pipeline.flow import TRAINING_MIXING_SEQUENCES
from pipeline.model import has_sharded

from . import emergence
from .compiling import uncompiled
from .recording import log_artifact, log_image, record_metrics, set_tag


class Preemption(Callback):
    """SIGUSR1 stops the run at the next optimizer-step end, with that step's checkpoint; the handler
    only sets a flag, which the ranks agree on at each step end (docs/training.md, "Preemption")."""

    def __init__(self, checkpoint: StepCheckpoint):
        self.checkpoint = checkpoint
        self.received = False
        self.stopped_at: int | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        signal.signal(signal.SIGUSR1, lambda signum, frame: setattr(self, "received", True))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if at_step_end(trainer, batch_idx) and trainer.strategy.reduce_boolean_decision(self.received, all=False):
            if self.checkpoint.last_saved != trainer.global_step:
                self.checkpoint.save(trainer)
            self.stopped_at = trainer.global_step
            trainer.should_stop = True

    def requeue(self) -> None:
        """On rank 0 of a SLURM job stopped by the signal: ``scontrol requeue`` the job."""
        job = os.environ.get("SLURM_JOB_ID")
        if array := os.environ.get("SLURM_ARRAY_JOB_ID"):
            job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        if self.stopped_at is None or not job:
            return
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"sinklab fit: scontrol requeue {job} failed: {done.stderr.strip()}", flush=True)


class SinkMetrics(Callback):
    """The sink probe at step 0, every ``every`` steps and at the end (rank 0 logs it), its figures every
    ``plot_every`` steps; ``seconds`` and ``figure_seconds`` are the time both took."""

    def __init__(self, every: int, plot_every: int, run_dir: Path, flow: bool = True):
        self.every, self.plot_every, self.flow = every, plot_every, flow
        self.plot_dir = Path(run_dir) / "plots"
        self.metrics_path = RunDir(run_dir).metrics_path  # emergence reads the run's history
        self.seconds = self.figure_seconds = 0.0  # the probes (metrics and logging); their figures
        self._probe: torch.Tensor | None = None
        self._done_step = -1
        self._last, self._uniform = None, None  # the newest probe's measures and uniform α₁

    def on_train_start(self, trainer, pl_module) -> None:
        self._maybe_probe(trainer, pl_module, force=trainer.global_step == 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if at_step_end(trainer, batch_idx):
            self._maybe_probe(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._maybe_probe(trainer, pl_module, force=True)
        if trainer.is_global_zero and self._last is not None:  # α₁ of each head over the run
            shape = self._last.alpha1.shape
            figures = (
                emergence.draw_trajectory(
                    self.metrics_path, *shape, self.plot_dir / "alpha1_trajectory.png", self._uniform
                ),
                emergence.draw_extreme_tokens(self.metrics_path, shape[0], self.plot_dir / "extreme_tokens.png"),
            )
            for path in filter(None, figures):
                log_artifact(trainer, path, "plots")
            if figures[0] is not None:
                log_image(trainer, figures[0], N.TRAJECTORY_IMAGE, trainer.global_step)

    def _maybe_probe(self, trainer, pl_module, force: bool = False) -> None:
        step = trainer.global_step
        if self.every <= 0 or step == self._done_step or not (force or step % self.every == 0):
            return
        self._done_step = step
        if not (trainer.is_global_zero or has_sharded(pl_module.model)):  # every rank gathers sharded weights
            return
        t0 = time.perf_counter()
        if self._probe is None:
            self._probe = trainer.datamodule.probe_tokens()
        # a Bigram-Backcopy dataset's triggers: the active/dormant split and the value-state drain
        triggers = getattr(trainer.datamodule.manifest, "trigger_ids", None)
        model, gathered = pl_module.model, contextlib.nullcontext()  # FSDP2 gathers each block in its forward
        if getattr(trainer.strategy, "zero_stage_3", False):
            import deepspeed

            gathered = deepspeed.zero.GatheredParameters(list(model.parameters()))
        with gathered, uncompiled():
            measures = sink_probe.run_probe(
                model,
                self._probe.to(pl_module.device),
                trigger_ids=triggers,
                output_qkv=triggers is not None,
                flow=self.flow,
                mixing_sequences=TRAINING_MIXING_SEQUENCES,
            )
        if not trainer.is_global_zero:
            return
        # beside the sink measures, heads/entropy_*, heads/out_norm_*, heads/dormant_pct
        metrics = measures.to_metrics() | measures.head_metrics()
        self._last, self._uniform = measures, emergence.probe_uniform_alpha1(pl_module.arch, measures.seq_len)
        metrics |= emergence.step_metrics(
            measures.alpha1, measures.sink1, metrics[N.ALPHA1_MEAN], step, self.metrics_path, self._uniform
        )
        record_metrics(pl_module, metrics, step)
        for key, value in emergence.tags_of(metrics).items():
            set_tag(trainer, key, value)
        self.seconds += time.perf_counter() - t0
        if self.plot_every > 0 and (step % self.plot_every == 0 or force):
            t0 = time.perf_counter()
            for path, key in probe_figures(measures, step, self.plot_dir, self._uniform):
                if key is None:
                    log_artifact(trainer, path, "plots")
                else:
                    log_image(trainer, path, key, step)
            self.figure_seconds += time.perf_counter() - t0


def probe_figures(measures, step: int, plot_dir: Path, uniform: float | None) -> list[tuple[Path, str | None]]:
    """A probe's figures: (path, MLflow image key, or None for an artifact under ``plots/``)."""
    from pipeline.plots import alpha1_heatmap, head_map

    title = f"step {step}: α₁ per layer and head (Sink₁ = {measures.sink1:.1f}%)"
    path = alpha1_heatmap(
        measures.alpha1,
        plot_dir / f"alpha1_step-{step:06d}.png",
        title,
        measures.entropy,
        measures.out_norm,
        measures.dormant,
        uniform=uniform,
        max_logit=measures.max_logit,
    )
    # the UI's image charts show a thumbnail (256 px): α₁ alone, one image per step
    alone = alpha1_heatmap(
        measures.alpha1, plot_dir / f"alpha1_map_step-{step:06d}.png", title, dormant=measures.dormant, uniform=uniform
    )
    figures = [(path, None), (alone, N.ALPHA1_IMAGE)]
    if measures.max_logit is not None:
        peak = float(measures.max_logit.max())
        logits = head_map(
            measures.max_logit,
            plot_dir / f"max_logit_step-{step:06d}.png",
            f"step {step}: largest q·k/√d_h per layer and head (max {peak:.1f})",
            "max q·k/√d_h",
        )
        figures.append((logits, N.MAX_LOGIT_IMAGE))
    return figures


class Throughput(Callback):
    """Tokens/s over windows of ``window`` optimizer steps (wall time, everything included), MFU =
    tokens/s/device x FLOPs/token / peak where the peak is known, and a GPU's peak allocated memory."""

    def __init__(self, tokens_per_step: int, context_length: int, window: int = 10):
        self.tokens_per_step, self.context_length, self.window = tokens_per_step, context_length, window

    def on_train_start(self, trainer, pl_module) -> None:
        self._flops_token = flops_per_token(pl_module.arch, self.context_length)
        # on CPU only an explicit SINKLAB_PEAK_TFLOPS gives a peak (the table names GPUs)
        self._peak = device_peak_flops() if pl_module.device.type == "cuda" or os.environ.get(PEAK_ENV) else None
        self._t_window = time.perf_counter()
        self._step_window = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step - self._step_window < self.window:
            return
        now = time.perf_counter()
        tokens_per_s = (step - self._step_window) * self.tokens_per_step / (now - self._t_window)
        metrics = {N.TOKENS_PER_S: tokens_per_s}
        if (value := mfu(tokens_per_s / trainer.world_size, self._flops_token, self._peak)) is not None:
            metrics[N.MFU] = value
        if pl_module.device.type == "cuda":  # this rank's high-water mark of allocated memory
            metrics[N.MAX_MEMORY_GIB] = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
        record_metrics(pl_module, metrics, step, bar=True)
        self._t_window, self._step_window = now, step
