"""What MLflow knows about the runs of one experiment at one scale.

Training runs carry the tags `sinklab.variant` and `sinklab.status` (docs/contracts.md
section 4); a sweep names each run `<experiment>/<scale>/<variant>`, which is where the scale
is read from (a `sinklab.scale` tag, where present, wins). Sweeps and reports find their runs
by these.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient

TAG_EXPERIMENT = "sinklab.experiment"
TAG_VARIANT = "sinklab.variant"
TAG_SCALE = "sinklab.scale"
TAG_STATUS = "sinklab.status"
TAG_KIND = "sinklab.kind"  # "report" on the runs that hold a report
FINISHED = "finished"


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else the project default sqlite store under the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlruns' / 'mlflow.db'}"


def client(uri: str | None = None) -> MlflowClient:
    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=uri)


@dataclass
class RunRecord:
    """One training run of a variant as MLflow reports it."""
    run_id: str
    variant: str
    status: str            # sinklab.status tag, else MLflow's own status in lower case
    start_time: int        # ms since the epoch
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status == FINISHED


def variant_runs(mlflow: MlflowClient, experiment_name: str, scale: str) -> dict[str, list[RunRecord]]:
    """Training runs of each variant at `scale`, newest first; {} when the experiment is new."""
    experiment = mlflow.get_experiment_by_name(experiment_name)
    if experiment is None:
        return {}
    runs: dict[str, list[RunRecord]] = {}
    page_token = None
    while True:
        page = mlflow.search_runs([experiment.experiment_id], max_results=1000, page_token=page_token,
                                  order_by=["attributes.start_time DESC"])
        for run in page:
            tags = run.data.tags
            if TAG_VARIANT not in tags or tags.get(TAG_KIND) == "report":
                continue
            if run_scale(tags, run.info.run_name) != scale:
                continue
            status = tags.get(TAG_STATUS) or run.info.status.lower()
            runs.setdefault(tags[TAG_VARIANT], []).append(RunRecord(
                run_id=run.info.run_id, variant=tags[TAG_VARIANT], status=status,
                start_time=run.info.start_time or 0, metrics=dict(run.data.metrics)))
        page_token = page.token
        if not page_token:
            break
    return runs


def run_scale(tags: dict[str, str], run_name: str | None) -> str | None:
    """The scale of a training run: its sinklab.scale tag, else the middle part of a sweep's
    run name `<experiment>/<scale>/<variant>`."""
    if TAG_SCALE in tags:
        return tags[TAG_SCALE]
    parts = (run_name or "").split("/")
    return parts[-2] if len(parts) >= 3 else None


def best_run(records: list[RunRecord]) -> RunRecord | None:
    """The run a report shows for a variant: the newest finished one, else the newest."""
    if not records:
        return None
    finished = [r for r in records if r.finished]
    return (finished or records)[0]


def metric_history(mlflow: MlflowClient, run_id: str, metric: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric, in step order."""
    return sorted((m.step, m.value) for m in mlflow.get_metric_history(run_id, metric))
