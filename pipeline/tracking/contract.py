"""The MLflow contract between SinkLab's parts: where the tracking store is, and the tags one part writes
and another reads (docs/contracts.md section 4). Standard library only."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

# written by `sinklab fit` on every training run; read by sweeps and reports
TAG_EXPERIMENT = "sinklab.experiment"
TAG_VARIANT = "sinklab.variant"
TAG_SCALE = "sinklab.scale"
TAG_STATUS = "sinklab.status"
# the run's seed_everything; a sweep sets the data order's seed (data.seed) to the same value
TAG_SEED = "sinklab.seed"
# `git describe` of the code a run trained with (written by `sinklab fit`; read by reports)
TAG_CODE_VERSION = "sinklab.code_version"
FINISHED = "finished"
# "sweep" on the run that groups an experiment's variants; other kinds for analysis runs
TAG_KIND = "sinklab.kind"
# the newest logged model of a training run (written at the end of fit; read by runs:/<id>)
TAG_MODEL_ID = "sinklab.model_id"
MODEL_NAME = "model"  # the logged model's name: runs:/<run_id>/model
# a sweep's parent run: passed to each `sinklab fit` in this environment variable, kept as MLflow's tag
PARENT_ENV = "SINKLAB_PARENT_RUN_ID"
TAG_PARENT = "mlflow.parentRunId"
# where a training run's directory is (written by `sinklab fit` at every start; a copy is told by it)
TAG_RUN_DIR = "sinklab.run_dir"
# the MLflow run a training run's directory logged to before (a copy's original, a start over, a deleted run)
TAG_PREVIOUS_RUN = "sinklab.previous_run"


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlruns/mlflow.db`` (what the Makefile exports)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlruns' / 'mlflow.db'}"


def prepare_store(uri: str) -> str:
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    return uri


def artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a sqlite store; None where the store decides."""
    if not uri.startswith("sqlite:///"):
        return None
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment).strip("._") or "experiment"
    digest = hashlib.sha1(experiment.encode()).hexdigest()[:8]  # names differing only in symbols stay apart
    return (Path(uri[len("sqlite:///") :]).resolve().parent / "artifacts" / f"{safe}-{digest}").as_uri()


def experiment_id(client, experiment: str) -> str:
    """The id of the experiment named ``experiment``, created where missing: every SinkLab command's way."""
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(
            experiment, artifact_location=artifact_location(client.tracking_uri, experiment)
        )
    except Exception as error:  # another process (a sweep, an array task) created it in between
        if getattr(error, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(experiment).experiment_id
