"""What MLflow knows about the runs of one experiment at one scale (tags: docs/contracts.md section 4)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from mlflow.utils import get_results_from_paginated_fn

from .contract import (
    TAG_CODE_VERSION,
    TAG_EXPERIMENT,
    TAG_KIND,
    TAG_SCALE,
    TAG_SEED,
    TAG_STATUS,
    TAG_VARIANT,
    experiment_id,
    prepare_store,
    tracking_uri,
)
from .summaries import RunSummary, config_hash


def client(uri: str | None = None) -> MlflowClient:
    return MlflowClient(tracking_uri=prepare_store(uri or tracking_uri()))


def variant_runs(mlflow: MlflowClient, experiment_name: str, scale: str) -> dict[str, list[RunSummary]]:
    """Training runs of each variant at `scale`, newest first; {} when the experiment is new."""
    experiment = mlflow.get_experiment_by_name(experiment_name)
    if experiment is None:
        return {}
    found = get_results_from_paginated_fn(
        lambda n, token: mlflow.search_runs(
            [experiment.experiment_id], max_results=n, page_token=token, order_by=["attributes.start_time DESC"]
        ),
        1000,
    )
    runs: dict[str, list[RunSummary]] = {}
    for run in found:
        tags = run.data.tags
        if TAG_VARIANT not in tags or run_scale(run.info.run_name) != scale:  # a sweep's parent has no variant
            continue
        runs.setdefault(tags[TAG_VARIANT], []).append(
            RunSummary(
                run_id=run.info.run_id,
                variant=tags[TAG_VARIANT],
                status=tags.get(TAG_STATUS) or run.info.status.lower(),
                start_time=run.info.start_time or 0,
                metrics=dict(run.data.metrics),
                seed=run_seed(tags),
                commit=tags.get(TAG_CODE_VERSION),
                config_hash=config_hash(dict(run.data.params)),
            )
        )
    return runs


def run_scale(run_name: str | None) -> str | None:
    """The scale of a sweep's training run, from its name `<variant> s<seed> (<experiment>/<scale>)`
    (pipeline.experiments.configs.run_name); None for a run no sweep named."""
    named = re.fullmatch(r".+ \(.+/([^/()]+)\)", run_name or "")
    return named.group(1) if named else None


def run_seed(tags: dict[str, str]) -> int | None:
    try:
        return int(tags[TAG_SEED])
    except (KeyError, ValueError):
        return None


def metric_history(mlflow: MlflowClient, run_id: str, metric: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in mlflow.get_metric_history(run_id, metric))


def parent_run(mlflow: MlflowClient, experiment, scale: str) -> str:
    """The run grouping an experiment's (pipeline.experiments.spec.Experiment) variants at one scale (`sinklab
    report` logs there), found or created."""
    from .views import mark_training_experiment

    exp_id = experiment_id(mlflow, experiment.mlflow_experiment)
    mark_training_experiment(mlflow, exp_id)
    existing = mlflow.search_runs(
        [exp_id],
        filter_string=f"tags.`{TAG_KIND}` = 'sweep' and tags.`{TAG_SCALE}` = '{scale}'",
        order_by=["attributes.start_time ASC"],
        max_results=1,
    )
    if existing:
        return existing[0].info.run_id
    tags = {
        TAG_KIND: "sweep",
        TAG_SCALE: scale,
        TAG_EXPERIMENT: experiment.name,
        "sinklab.paper_ref": experiment.paper_ref,
        "sinklab.title": experiment.title,
        "mlflow.note.content": f"{experiment.title} ({experiment.paper_ref}), {scale} scale: "
        f"{len(experiment.variants)} variants, one child run each",
    }
    run = mlflow.create_run(exp_id, run_name=f"{experiment.name}/{scale}", tags=tags)
    mlflow.log_param(run.info.run_id, "variants", ",".join(v.name for v in experiment.variants)[:6000])
    return run.info.run_id


def log_report(mlflow, experiment, scale: str, files: list[Path], metrics: dict[str, float] | None = None) -> str:
    """Log the files and the metrics (the agreement) to the experiment's :func:`parent_run` at this scale."""
    run_id = parent_run(mlflow, experiment, scale)
    for f in files:
        mlflow.log_artifact(run_id, str(f), artifact_path=f"report-{scale}")
    if metrics:
        now = int(time.time() * 1000)
        mlflow.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
    running = mlflow.search_runs(
        [mlflow.get_run(run_id).info.experiment_id],
        f"tags.`mlflow.parentRunId` = '{run_id}' and attributes.status = 'RUNNING'",
    )
    if not running:  # a sweep still under way ends its parent itself
        mlflow.set_terminated(run_id)
    return run_id
