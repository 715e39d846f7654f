"""The ``run`` section of `sinklab fit`: names, cadences and the spike guard, none of them the model's."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.model.config import ConfigError

from .sharding import refuse_under_deepspeed
from .spikes import SpikeGuard


@dataclass
class RunOptions:
    """Names, cadences and the spike guard of one run."""

    name: str = "sinklab"
    """The run's name; the run directory defaults to runs/<name>."""
    experiment: str = "sinklab"
    """The MLflow experiment the run is logged to."""
    variant: str = ""
    """One line of what this run changes (a tag); empty: derived from the config."""
    checkpoint_every: int = 1000
    """Optimizer steps between step checkpoints; 0: none."""
    keep_last: int = 3
    """How many step checkpoints to keep; 0: all."""
    sink_every: int = 200
    """Optimizer steps between live sink probes; 0: none."""
    flow: bool = True
    """Measure the information flow (flow/...) at each sink probe; false: the sink metrics only."""
    plot_every: int = 2000
    """Optimizer steps between α₁ heat maps; 0: none."""
    val_every: int = 500
    """Optimizer steps between validations; 0: none."""
    throughput_window: int = 20
    """Optimizer steps per tokens/s value."""
    log_model: bool = True
    """Log the final weights to the MLflow run (a logged model named model, once per run)."""
    system_metrics: bool = True
    """MLflow's system metrics (CPU, RAM, GPU where present) on the run."""
    log_checkpoints: bool = False
    """Upload each kept step checkpoint to the MLflow run, so that --resume runs:/<run_id> continues it elsewhere."""
    skip_spikes: bool = False
    """Skip a step whose loss or gradient norm lies spike_sigmas deviations above the last spike_window steps' mean."""
    spike_window: int = 128
    """Steps of history the spike guard compares with; 20 or more."""
    spike_sigmas: float = 6.0
    """Standard deviations above the mean that make a spike."""

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
