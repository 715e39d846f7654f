"""MLflow for training runs: one run per job, kept across resumes, metrics mirrored to metrics.jsonl and
re-sent after an outage (docs/training.md, "When the tracking server goes away")."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only

from pipeline.checkpoint import RunDir
from pipeline.model.config import ConfigError
from sinklab_io.mappings import flatten
from sinklab_io.notices import notice, why

from .contract import TAG_PREVIOUS_RUN, TAG_RUN_DIR, experiment_id, prepare_store, tracking_uri
from .metrics_file import MetricsFile
from .views import mark_training_experiment, sent_to_mlflow

DEFAULT_RETRIES = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}
RETRY_EVERY_S = 60.0  # how often an unreachable server is tried again


def _no_traceback(record: logging.LogRecord) -> bool:
    """Drops the traceback of the SQL store's failed-commit record: the raise is reported in one line."""
    record.exc_info, record.exc_text = None, None
    return True


logging.getLogger("mlflow.store.db.utils").addFilter(_no_traceback)


def code_version() -> str:
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"], cwd=repo, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def as_params(data: Mapping[str, Any]) -> dict[str, str]:
    """A nested config as MLflow params: dotted keys, lists and mappings as JSON, the rest as text."""
    return {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in flatten(data).items()}


def open_run(
    run: RunDir,
    experiment: str,
    run_name: str,
    tags: dict[str, str],
    params: dict[str, str],
    artifacts: list[Path],
    manifest=None,
) -> str | None:
    """Rank 0: the MLflow run of this run directory (created on the first start, with ``manifest`` as its
    dataset input); its id, or None where the store cannot be reached (training goes on offline)."""
    from mlflow.entities import Param, RunTag
    from mlflow.tracking import MlflowClient

    from .run_assets import dataset_input

    for key, value in DEFAULT_RETRIES.items():
        os.environ.setdefault(key, value)
    uri = prepare_store(tracking_uri())
    client = MlflowClient(uri)
    run_id = run.mlflow_run_id()
    try:
        if run_id is not None and (reason := _not_this_directorys(client, run_id, run)):
            notice(f"{reason}; this start logs to a new MLflow run (its tag {TAG_PREVIOUS_RUN} names {run_id})")
            tags = {**tags, TAG_PREVIOUS_RUN: run_id}
            run_id = None
        if run_id is None:
            exp_id = experiment_id(client, experiment)
            run_id = client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id
            MetricsFile(run.root).mark_sent(0)  # a new run: all of metrics.jsonl is still to send
            run.save_mlflow_run_id(run_id)
            client.log_batch(run_id, params=[Param(k, v[:6000]) for k, v in params.items()])  # sent 100 a request
            if manifest is not None:
                client.log_inputs(run_id, datasets=[dataset_input(manifest)])
            mark_training_experiment(client, exp_id)  # after the params: the view's columns are the varied ones
        else:
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
            client.update_run(run_id, status="RUNNING")
        for path in artifacts:
            client.log_artifact(run_id, str(path), artifact_path="config")
    except Exception as exc:  # noqa: BLE001 - any failure of the store means "offline"
        notice(f"MLflow at {uri} unreachable ({why(exc)}); training goes on, metrics are kept in {run.metrics_path}")
    return run_id


def _not_this_directorys(client, run_id: str, run: RunDir) -> str | None:
    """Why the run directory's MLflow run must not be continued from it (deleted, or a copy's), or None."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return f"MLflow run {run_id} of {run.root} no longer exists in {tracking_uri()}"
    if found.info.lifecycle_stage == "deleted":
        return f"MLflow run {run_id} of {run.root} was deleted (restore it in the MLflow UI to continue it instead)"
    home = found.data.tags.get(TAG_RUN_DIR)
    if home and Path(home) != run.root.resolve() and RunDir(Path(home)).mlflow_run_id() == run_id:
        return f"{run.root} is a copy of {home}, whose MLflow run {run_id} is not written from here"
    return None


def _as_mlflow(rows: list[dict]) -> list:
    from mlflow.entities import Metric

    return [
        Metric(k, float(v), int(row["time"] * 1000), int(row["step"]))
        for row in rows
        for k, v in row.items()
        if k not in ("step", "time") and sent_to_mlflow(k)
    ]


# sinklab.status -> MLflow's run status; any other (finished, preempted, Lightning's "success") is FINISHED
_MLFLOW_STATUS = {"failed": "FAILED", "nonfinite": "FAILED", "interrupted": "KILLED"}


class RunLogger(MLFlowLogger):
    """MLFlowLogger that never stops training and mirrors metrics to metrics.jsonl."""

    def __init__(self, run_dir: str, experiment_name: str, run_id: str | None):
        uri = tracking_uri()
        try:
            super().__init__(experiment_name=experiment_name, tracking_uri=uri, run_id=run_id)
        except Exception as exc:  # noqa: BLE001 - a sqlite:/// store is opened here (a bad path, a full disk)
            raise ConfigError(
                f"MLFLOW_TRACKING_URI={uri}: the store cannot be opened ({why(exc)}); "
                "check its path, free space or `ulimit -f`, or point MLFLOW_TRACKING_URI at another store"
            ) from None
        self.metrics_file = MetricsFile(Path(run_dir))
        self._pending: list[tuple[list, int]] = []  # (MLflow metrics, metrics.jsonl offset after them)
        self._last_failure = 0.0
        self.offline = run_id is None
        self.sent_batches = 0
        self.system_metrics = None

    def attach_run(self, run_id: str | None, resume_step: int | None) -> None:
        """The run :func:`open_run` created; then what earlier starts could not send, before anything new."""
        self._run_id, self.offline = run_id, run_id is None
        if run_id is not None:
            rows, end = self.metrics_file.backlog(resume_step)
            self._pending.insert(0, (_as_mlflow(rows), end))
            waiting = len(self._pending[0][0])
            if self.flush(force=True) and waiting:
                notice(
                    f"MLflow: {waiting} values that earlier starts could not send, sent from {self.metrics_file.path}"
                )

    def start_system_metrics(self) -> None:
        """Rank 0: MLflow's system metrics (CPU, RAM, GPU where present) on this run until :meth:`finalize`."""
        if self._run_id is None or self.system_metrics is not None:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        try:  # a sample every 15 s, one averaged point a minute; a resumed run continues its step count
            self.system_metrics = SystemMetricsMonitor(
                self._run_id,
                sampling_interval=15,
                samples_before_logging=4,
                resume_logging=True,
                tracking_uri=self._tracking_uri,
            )
            self.system_metrics.start()
        except Exception as exc:  # noqa: BLE001
            notice(f"MLflow system metrics off ({why(exc)})")

    # Lightning asks for name/version to build paths; answer without touching the server.
    @property
    def name(self) -> str:
        return self._experiment_name

    @property
    def version(self) -> str:
        return self._run_id or "offline"

    @property
    def experiment(self):
        """MLFlowLogger's client; while no run exists or the server is away, one that has not asked it yet."""
        from mlflow.tracking import MlflowClient

        if self._run_id is None:
            return MlflowClient(self._tracking_uri)
        try:
            return super().experiment
        except Exception:  # noqa: BLE001 - the server is away: sending fails later, and is retried
            return MlflowClient(self._tracking_uri)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        """The resolved config is logged once by :func:`open_run`; Lightning's copy is skipped."""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        row, end = self.metrics_file.append(int(step or 0), {k: float(v) for k, v in metrics.items()})
        if self._run_id is not None:  # without a run, metrics.jsonl is sent when one is created
            self._pending.append((_as_mlflow([row]), end))
            self.flush()

    def flush(self, force: bool = False) -> bool:
        """Send queued metrics in order, recording how far they got; True when nothing is left to send."""
        if not self._pending or self._run_id is None:
            return not self._pending
        if self.offline and not force and time.time() - self._last_failure < RETRY_EVERY_S:
            return False
        sent_to = None
        try:
            while self._pending:
                metrics, end = self._pending[0]
                self.experiment.log_batch(self._run_id, metrics=metrics)  # sent 1000 a request
                self._pending.pop(0)
                self.sent_batches += 1
                sent_to = end
        except Exception as exc:  # noqa: BLE001
            if not self.offline:
                notice(
                    f"MLflow tracking server unreachable ({why(exc)}); "
                    f"training goes on, metrics are queued and kept in {self.metrics_file.path}"
                )
            self.offline, self._last_failure = True, time.time()
            return False
        finally:
            if sent_to is not None:
                self.metrics_file.mark_sent(sent_to)
        if self.offline:
            notice(f"MLflow reachable again: {self.sent_batches} metric batches now on the server")
        self.offline = False
        return True

    def _send(self, send, failed: str | None = None) -> None:
        """``send()`` where a run exists; a failure costs the notice ``failed`` (None: nothing)."""
        if self._run_id is None:
            return
        try:
            send()
        except Exception as exc:  # noqa: BLE001
            if failed:
                notice(f"MLflow: {failed} not uploaded ({type(exc).__name__}); it stays in the run dir")

    @rank_zero_only
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._send(
            lambda: self.experiment.log_artifact(self._run_id, str(path), artifact_path=artifact_path),
            f"artifact {path}",
        )

    @rank_zero_only
    def log_image(self, path: Path, key: str, step: int) -> None:
        """The PNG at ``path`` as MLflow image ``key`` at ``step``, sent synchronously."""
        from PIL import Image

        def send() -> None:
            with Image.open(path) as image:
                self.experiment.log_image(self._run_id, image.convert("RGB"), key=key, step=int(step), synchronous=True)

        self._send(send, f"image {path}")

    @rank_zero_only
    def set_tag(self, key: str, value: str) -> None:
        self._send(lambda: self.experiment.set_tag(self._run_id, key, value))

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if self.system_metrics is not None:
            try:
                self.system_metrics.finish()
            except Exception as exc:  # noqa: BLE001 - never fail a run over its system metrics
                notice(f"MLflow system metrics: {why(exc)}")
            self.system_metrics = None
        if self._run_id is None:
            return
        if not self.flush(force=True):
            waiting = sum(len(metrics) for metrics, _ in self._pending)
            notice(
                f"MLflow: {waiting} values could not be sent before the end; they are in {self.metrics_file.path}, "
                f"and the next start of {self.metrics_file.path.parent} (--resume auto) sends them and closes the run"
            )
            return
        self._send(lambda: self.experiment.set_terminated(self._run_id, _MLFLOW_STATUS.get(status, "FINISHED")))
