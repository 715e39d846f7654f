"""What other libraries print that a SinkLab user did not cause, each filtered by name where it is raised
(its logger, or its warning's category and message); everything else they print still shows."""

from __future__ import annotations

import logging
import os
import warnings

# (logger, the start of the records dropped from it, why)
_DROPPED = (
    # a CPU run asked for the CPU; DeepSpeed says so whenever it finds no GPU at import
    ("DeepSpeed", "Setting accelerator to CPU"),
    # Lightning's advertisements for its cloud logger and model registry (SinkLab logs to MLflow)
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip:"),
    ("lightning.fabric.utilities.rank_zero", "💡 Tip:"),
)
# MLflow's progress notes on its store and system-metrics thread; their warnings still show
_INFO_ONLY = ("mlflow.store.db.utils", "mlflow.system_metrics.system_metrics_monitor")


class _Drop(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def quiet_third_party() -> None:
    """Install the filters (again: no change); call before DeepSpeed, Lightning or MLflow print."""
    for name, start in _DROPPED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.start == start for f in logger.filters):
            logger.addFilter(_Drop(start))
    for name in _INFO_ONLY:
        logging.getLogger(name).setLevel(logging.WARNING)
    # SinkLab's own summary names the run's MLflow address; MLflow would print it again on each run's end
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # Lightning's own pytree helper builds torch's deprecated LeafSpec; nothing a user can change
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
