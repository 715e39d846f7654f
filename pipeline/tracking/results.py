"""Analysis results in MLflow: back on the training run a model came from (:func:`log_results`,
:func:`log_analysis`), or as an analysis run of their own (:func:`log_new_run`)."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from .contract import experiment_id


def log_analysis(resolved_uri: str, run_id: str, record: dict, out: Path) -> str:
    """`sinklab analyze runs:/<id>`: the results on the training run itself, metrics and the
    output directory (report.json, plots) under ``analysis/``. Returns the run id."""
    values = {f"analysis/table1/{k}": v for k, v in record["table1"].items()}
    for kind, rep in record["reports"].items():
        values.update({f"analysis/{kind}/sink_k{k}": v for k, v in enumerate(rep["profile"], start=1)})
        if rep.get("alpha1") is not None:
            values[f"analysis/{kind}/alpha1_mean"] = _mean(rep["alpha1"])
        summary = (rep.get("outliers") or {}).get("summary", {})  # activation outliers, largest over layers
        values.update({f"analysis/{kind}/act/{k}": v for k, v in summary.items() if not k.endswith("_at")})
    values.update({f"analysis/domain/{re.sub(r'[^A-Za-z0-9_.-]', '_', d)}": v
                   for d, v in record.get("domains", {}).items()})
    return log_results(resolved_uri, run_id, values, {"sinklab.analysis.settings": record["settings"]}, out, "analysis")


def log_results(resolved_uri: str, run_id: str, values: dict[str, float], tags: dict[str, object],
                out: Path | None, artifact_path: str) -> str:
    """An analysis of a training run's model back on that run: ``values`` as metrics (step 0),
    ``tags`` (JSON, at most 5,000 characters each) and ``out`` (the output directory, or one
    file; None: no artifact) as artifacts under ``artifact_path``. Returns the run id."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(resolved_uri)
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in values.items()],
                     tags=[RunTag(k, json.dumps(v, sort_keys=True)[:5000]) for k, v in tags.items()])
    if out is not None and Path(out).is_dir():
        client.log_artifacts(run_id, str(out), artifact_path=artifact_path)
    elif out is not None:
        client.log_artifact(run_id, str(out), artifact_path)
    return run_id


def log_new_run(uri: str, experiment: str, run_name: str, tags: dict[str, str], params: dict[str, object],
                metrics: dict[str, float], out: Path, curves: list[tuple[str, float, int]] = ()) -> str:
    """An analysis as a run of its own in ``experiment`` (created where missing): ``tags``,
    ``params``, ``metrics`` (step 0), ``curves`` as (key, value, step) points, and the output
    directory ``out`` as its artifacts. Returns the new run's id."""
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
        mlflow.log_artifacts(str(out))
        return run.info.run_id


def _mean(nested) -> float:
    flat: list[float] = []

    def walk(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        else:
            flat.append(float(x))

    walk(nested)
    return sum(flat) / len(flat) if flat else float("nan")
