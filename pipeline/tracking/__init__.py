"""Everything that talks to MLflow, behind one surface (its modules: docs/contracts.md); names are imported
on first use, so a command that needs only the tags loads neither MLflow nor Lightning."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "contract": (
        "FINISHED",
        "PARENT_ENV",
        "TAG_CODE_VERSION",
        "TAG_EXPERIMENT",
        "TAG_PARENT",
        "TAG_PREVIOUS_RUN",
        "TAG_RUN_DIR",
        "TAG_SEED",
        "TAG_STATUS",
        "TAG_VARIANT",
        "experiment_id",
        "tracking_uri",
    ),
    "logger": ("RunLogger", "as_params", "code_version", "open_run"),
    "metrics_file": ("MetricsFile",),
    "run_assets": ("add_hf_export", "final_weights", "log_run_model", "write_model_dir"),
    "remote_checkpoints": ("CheckpointUploader", "logged_checkpoints", "pulled_argv"),
    "run_models": ("CARD_METRICS", "RunModelError", "final_metrics", "is_model_uri", "resolve_model"),
    "results": ("log_new_run", "log_results"),
    "views": ("dataset_name", "experiment_url", "home_url", "run_experiment_url", "sent_to_mlflow"),
    "summaries": ("RunSummary", "best_runs", "config_hash"),
    "runs": ("client", "log_report", "metric_history", "parent_run", "variant_runs"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
