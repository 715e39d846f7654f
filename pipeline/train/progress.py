"""The training progress bar: one bar for the run, optimizer steps out of ``trainer.max_steps``."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import CustomBarColumn, CustomTimeColumn, ProcessingSpeedColumn
from rich.progress import TextColumn
from rich.text import Text

from pipeline import metric_names as N


def _si(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


class StepsPerSecond(ProcessingSpeedColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed or 0:.2f} steps/s", style=self.style)


# what the module and the Throughput callback put on the bar (record_metrics(..., bar=True)), shown as
SHOWN = {
    N.TRAIN_LOSS: ("loss", "{:.3f}".format),
    N.VAL_LOSS: ("val loss", "{:.3f}".format),
    N.TOKENS_PER_S: ("tokens/s", _si),
    N.MFU: ("MFU", lambda v: f"{100 * v:.1f}%"),
}


class StepProgressBar(RichProgressBar):
    def _initialize_train_progress_bar_id(self) -> None:
        self.train_progress_bar_id = self.progress.add_task(
            "train", total=self.trainer.max_steps, completed=self.trainer.global_step
        )

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        """One bar for the run: a new pass over the data neither resets nor replaces it."""
        if self.is_enabled and self.progress is not None and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.is_enabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, trainer.global_step)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def configure_columns(self, trainer) -> list:
        return [
            TextColumn("[progress.description]{task.description}"),
            CustomBarColumn(
                complete_style=self.theme.progress_bar,
                finished_style=self.theme.progress_bar_finished,
                pulse_style=self.theme.progress_bar_pulse,
            ),
            TextColumn("step {task.completed:.0f}/{task.total:.0f}", style=self.theme.batch_progress),
            CustomTimeColumn(style=self.theme.time),
            StepsPerSecond(style=self.theme.processing_speed),
        ]

    def get_metrics(self, trainer, pl_module) -> dict[str, str]:
        values = super().get_metrics(trainer, pl_module)
        return {label: fmt(float(values[key])) for key, (label, fmt) in SHOWN.items() if key in values}
