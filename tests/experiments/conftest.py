"""Fixtures of the experiment tests (helpers live in experiment_helpers.py)."""

from __future__ import annotations

import itertools

import pytest
from mlflow.tracking import MlflowClient

_ids = itertools.count()


@pytest.fixture
def unique_name(request):
    """An experiment name no other test on the shared MLflow server uses."""
    return f"t{next(_ids)}-{request.node.name.split('[')[0].replace('_', '-')[:30].lower()}"


@pytest.fixture
def mlflow_env(mlflow_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    return MlflowClient(tracking_uri=mlflow_server)
