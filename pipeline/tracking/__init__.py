"""Everything that talks to MLflow, behind one surface: other parts import from here only.

- ``contract``: where the store is and the tags one part writes and another reads;
- ``logger``: the training run (one per job, kept across resumes) and its outage-proof metrics,
  with ``metrics_file`` (metrics.jsonl and how far it has reached MLflow);
- ``run_assets``: what a run leaves beyond metrics (dataset input, final model, system metrics);
- ``remote_checkpoints``: step checkpoints uploaded to the run, ``--resume runs:/<id>``;
- ``run_models``: ``runs:/`` and ``models:/`` URIs to local model directories;
- ``results``: analysis results on a training run or as runs of their own;
- ``runs``: what an experiment's runs are (sweeps, reports);
- ``views``: what the MLflow UI shows (training mode, chart layout, runs-table columns, names);
- ``images``: figures as MLflow images with steps.

Names are imported on first use, so that a command which needs only the tags does not load
MLflow or Lightning.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "contract": (
        "FINISHED",
        "PARENT_ENV",
        "TAG_EXPERIMENT",
        "TAG_KIND",
        "TAG_MODEL_ID",
        "TAG_PARENT",
        "TAG_PREVIOUS_RUN",
        "TAG_RUN_DIR",
        "TAG_SCALE",
        "TAG_SEED",
        "TAG_STATUS",
        "TAG_VARIANT",
        "experiment_id",
        "tracking_uri",
    ),
    "logger": ("RunLogger", "as_params", "code_version", "open_run"),
    "metrics_file": ("MetricsFile",),
    "run_assets": ("add_hf_export", "final_weights", "log_final_model", "log_run_model", "write_model_dir"),
    "remote_checkpoints": ("CheckpointUploader", "logged_checkpoints", "pulled_argv"),
    "run_models": ("CARD_METRICS", "ResolvedModel", "RunModelError", "final_metrics", "is_model_uri", "resolve_model"),
    "results": ("log_new_run", "log_results"),
    "views": (
        "dataset_name",
        "experiment_url",
        "home_url",
        "mark_training_experiment",
        "run_experiment_url",
        "run_url",
        "sent_to_mlflow",
    ),
    "images": ("log_image_file", "logged_image_keys"),
    "runs": (
        "RunSummary",
        "best_run",
        "best_runs",
        "client",
        "log_report",
        "metric_history",
        "parent_run",
        "variant_runs",
    ),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
