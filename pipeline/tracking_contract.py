"""The MLflow contract between SinkLab's parts: where the tracking store is, and the tags one
part writes and another reads (docs/contracts.md section 4). Standard library only, so that
the training layer, the analysis layer and the experiments layer all import it from here.
"""
from __future__ import annotations

import os
from pathlib import Path

# written by `sinklab fit` on every training run; read by sweeps and reports
TAG_EXPERIMENT = "sinklab.experiment"
TAG_VARIANT = "sinklab.variant"
TAG_SCALE = "sinklab.scale"
TAG_STATUS = "sinklab.status"
FINISHED = "finished"
# "sweep" on the run that groups an experiment's variants; other kinds for analysis runs
TAG_KIND = "sinklab.kind"
# the newest logged model of a training run (written at the end of fit; read by runs:/<id>)
TAG_MODEL_ID = "sinklab.model_id"
# a sweep's parent run: passed to each `sinklab fit` in this environment variable, kept as MLflow's tag
PARENT_ENV = "SINKLAB_PARENT_RUN_ID"
TAG_PARENT = "mlflow.parentRunId"


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else the project's sqlite store ``mlruns/mlflow.db`` under the
    working directory (what the Makefile exports)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlruns' / 'mlflow.db'}"
