"""Analysis results in MLflow: back on the training run a model came from (:func:`log_results`),
or as an analysis run of their own (:func:`log_new_run`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from sinklab_io.outputs import written

from .contract import experiment_id


def log_results(
    resolved_uri: str,
    run_id: str,
    values: dict[str, float],
    tags: dict[str, object],
    out: Path | None,
    artifact_path: str,
) -> str:
    """``values`` (step 0), ``tags`` (JSON) and ``out``'s files under ``artifact_path`` on a training run; its id."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(resolved_uri)
    now = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, 0) for k, v in values.items()],
        tags=[RunTag(k, json.dumps(v, sort_keys=True)[:5000]) for k, v in tags.items()],
    )
    if out is not None:  # a folder: what the command wrote there, not whatever else it holds
        for path in written(out) if Path(out).is_dir() else [out]:
            client.log_artifact(run_id, str(path), artifact_path=artifact_path)
    return run_id


def log_new_run(
    uri: str,
    experiment: str,
    run_name: str,
    tags: dict[str, str],
    params: dict[str, object],
    metrics: dict[str, float],
    out: Path,
    curves: list[tuple[str, float, int]] = (),
) -> str:
    """An analysis as a new run of ``experiment``: tags, params, metrics, ``curves`` and ``out``'s files; its id."""
    import mlflow
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(uri)
    exp_id = experiment_id(MlflowClient(uri), experiment)
    with mlflow.start_run(experiment_id=exp_id, run_name=run_name) as run:
        mlflow.set_tags(tags)
        mlflow.log_params(params)
        mlflow.log_metrics(metrics)
        if curves:
            now = int(time.time() * 1000)
            MlflowClient(uri).log_batch(run.info.run_id, metrics=[Metric(k, v, now, step) for k, v, step in curves])
        for path in written(out):
            mlflow.log_artifact(str(path))
        return run.info.run_id
