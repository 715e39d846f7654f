"""The one path from training to its run: ``record_metrics`` for every metric (names from
``pipeline.metric_names``); ``set_tag``, ``log_artifact`` and ``log_image`` for the rest, sent to
the run's logger (``pipeline.tracking.RunLogger``) where the trainer has one."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import lightning as L
import torch


def reduced(trainer: L.Trainer, value: torch.Tensor | float, reduce: str = "mean") -> float:
    """``value`` reduced over the ranks by ``reduce`` ("mean" or "sum"; a collective: every rank calls it)."""
    if trainer.world_size > 1:
        tensor = torch.as_tensor(value, dtype=torch.float32, device=trainer.strategy.root_device)
        value = trainer.strategy.reduce(tensor, reduce_op=reduce)
    return float(value)


def record_metrics(
    module: L.LightningModule,
    metrics: Mapping[str, torch.Tensor | float],
    step: int | None = None,
    reduce: str | None = None,
    bar: bool = False,
    log: bool = True,
) -> None:
    """Record ``metrics`` at ``step`` (default: the steps taken) as floats. reduce: over the
    ranks first (a collective); log: to the trainer's loggers, on rank 0; bar: on the progress bar."""
    trainer = module.trainer
    values = {name: reduced(trainer, v, reduce) if reduce else float(v) for name, v in metrics.items()}
    if log and trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(values, step=trainer.global_step if step is None else step)
    if bar:
        module.log_dict(values, prog_bar=True, logger=False)


def run_logger(trainer: L.Trainer | None):
    """The trainer's RunLogger (the MLflow run), or None (no trainer, or a run without MLflow)."""
    from pipeline.tracking import RunLogger

    return next((logger for logger in (trainer.loggers if trainer else []) if isinstance(logger, RunLogger)), None)


def set_tag(trainer: L.Trainer | None, key: str, value: str) -> None:
    if (logger := run_logger(trainer)) is not None:
        logger.set_tag(key, value)


def log_artifact(trainer: L.Trainer, path: Path, artifact_path: str | None = None) -> None:
    if (logger := run_logger(trainer)) is not None:
        logger.log_artifact(path, artifact_path=artifact_path)


def log_image(trainer: L.Trainer, path: Path, key: str, step: int) -> None:
    """A figure as an MLflow image of ``step`` (its key from pipeline.metric_names)."""
    if (logger := run_logger(trainer)) is not None:
        logger.log_image(path, key, step)
