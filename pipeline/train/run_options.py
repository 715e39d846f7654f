"""The ``run`` section of `sinklab fit`: names, cadences and the spike guard, none of them the model's."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.model.config import ConfigError

from .sharding import refuse_under_deepspeed
from .spikes import SpikeGuard


@dataclass
class RunOptions:
    """name: run name (default run dir runs/<name>). experiment: MLflow experiment.
    variant: one-line summary of what this run changes (a tag; default: derived).
    checkpoint_every / keep_last: step checkpoints and how many to keep (0 = all).
    sink_every / plot_every: cadence of the live sink metrics and the alpha_1 heat maps.
    flow: measure the information flow (flow/...) at each sink probe (false: Sink_1 and the rest only).
    val_every: validation cadence in optimizer steps. throughput_window: steps per tokens/s value.
    log_model: log the final weights to the MLflow run (a logged model named `model`, once per run).
    system_metrics: MLflow's system metrics (CPU, RAM, GPU where present) on the run.
    log_checkpoints: upload each kept step checkpoint to the MLflow run (rank 0, in the
    background), so that `--resume runs:/<run_id>` can continue it on another machine.
    skip_spikes: skip a step whose loss or gradient norm lies more than spike_sigmas standard
    deviations above the mean of the last spike_window steps (pipeline.train.spikes)."""

    name: str = "sinklab"
    experiment: str = "sinklab"
    variant: str = ""
    checkpoint_every: int = 1000
    keep_last: int = 3
    sink_every: int = 200
    flow: bool = True
    plot_every: int = 2000
    val_every: int = 500
    throughput_window: int = 20
    log_model: bool = True
    system_metrics: bool = True
    log_checkpoints: bool = False
    skip_spikes: bool = False
    spike_window: int = 128
    spike_sigmas: float = 6.0

    def validate(self) -> None:
        for name in ("checkpoint_every", "keep_last", "sink_every", "plot_every", "val_every"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"run.{name}={getattr(self, name)}: must be >= 0 ("
                    + ("0 keeps every checkpoint)" if name == "keep_last" else "0 turns it off)")
                )
        if self.spike_window < 20 or not self.spike_sigmas > 0:
            raise ConfigError(
                f"run.spike_window={self.spike_window}, run.spike_sigmas={self.spike_sigmas}: need a window of "
                "20 steps or more (the guard's verdicts need 20 steps of history) and a positive number of "
                "standard deviations"
            )
        if self.throughput_window < 1:
            raise ConfigError(f"run.throughput_window={self.throughput_window}: must be >= 1")

    def spike_guard(self, strategy, max_steps: int) -> SpikeGuard | None:
        """run.skip_spikes: the guard for the module, refused in one line under DeepSpeed and where
        the run ends before the guard's first verdict (it would guard nothing)."""
        if not self.skip_spikes:
            return None
        refuse_under_deepspeed("run.skip_spikes=true", "the engine owns the gradients and the step", strategy)
        guard = SpikeGuard(self.spike_window, self.spike_sigmas)
        if max_steps <= guard.needed:
            fix = f"a run.spike_window of at most {2 * max_steps - 1}" if max_steps > 20 else "more than 20 steps"
            raise ConfigError(
                f"run.spike_window={self.spike_window}: the spike guard gives no verdict before {guard.needed} steps "
                f"of history (max(20, window/2)) and trainer.max_steps={max_steps} ends sooner, so it would guard "
                f"nothing; give {fix}, or run.skip_spikes false"
            )
        return guard
