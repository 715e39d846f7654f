"""``runs:/<run_id>[/model]`` and ``models:/<model_id>`` to a local SinkLab model directory: the one place
SinkLab resolves MLflow model URIs (cached under ``$SINKLAB_CACHE/mlflow``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pipeline import metric_names as N
from sinklab_io.atomic import publish, remove

from .contract import MODEL_NAME, TAG_MODEL_ID, tracking_uri

PREFIXES = ("runs:/", "models:/")
# what an export's model card reports: label -> metric
CARD_METRICS = {
    "Sink_1 (%, ε = 0.3)": N.SINK1,
    "α₁ (mean over layers and heads)": N.ALPHA1_MEAN,
    "val loss": N.VAL_LOSS,
}


class RunModelError(ValueError):
    """A runs:/ or models:/ URI that names no model SinkLab can load."""


def is_model_uri(spec) -> bool:
    return str(spec).startswith(PREFIXES)


@dataclass(frozen=True)
class ResolvedModel:
    uri: str  # what was asked for, e.g. runs:/<run_id>
    path: Path  # local directory that load_pretrained reads
    run_id: str  # the training run the model came from
    tracking_uri: str

    @property
    def tokenizer(self) -> Path | None:
        found = self.path / "tokenizer.json"
        return found if found.is_file() else None


def parse(spec: str) -> tuple[str, str]:
    """('runs', run_id) with the artifact path, or ('models', model_id)."""
    m = re.fullmatch(r"runs:/([0-9A-Za-z_-]+)(?:/(.+?))?/?", spec)
    if m:
        return "runs", m.group(1) + "/" + (m.group(2) or MODEL_NAME)
    m = re.fullmatch(r"models:/([^/]+)/?", spec)
    if m:
        return "models", m.group(1)
    raise RunModelError(f"{spec}: expected runs:/<run_id>[/model] or models:/<model_id>")


def resolve_model(spec: str, uri: str | None = None) -> ResolvedModel:
    """Download the model of ``spec`` (once per run and path) and return where it lies."""
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from pipeline.model.hf_sources import cache_dir
    from pipeline.model.loading import CONFIG_NAME, WEIGHTS_NAME

    uri = uri or tracking_uri()
    scheme, ident = parse(spec)
    client = MlflowClient(uri)
    # from the locations ``client`` returns: MLflow's own URI resolution would ask the global tracking URI
    try:
        if scheme == "models":
            model = client.get_logged_model(ident)
            run_id, key, location = model.source_run_id, f"models/{ident}", model.artifact_location
        else:
            run_id, path = ident.split("/", 1)
            run = client.get_run(run_id)
            model_id = run.data.tags.get(TAG_MODEL_ID)  # the newest weights
            key = f"{run_id}/{path}" + (f"/{model_id}" if model_id else "")
            location = (
                client.get_logged_model(model_id).artifact_location
                if path == MODEL_NAME and model_id
                else f"{run.info.artifact_uri.rstrip('/')}/{path}"
            )
    except MlflowException as exc:
        raise RunModelError(f"{spec}: not found in the MLflow store at {uri} ({exc.message[:200]})") from None
    target = cache_dir() / "mlflow" / key
    if not ((target / CONFIG_NAME).is_file() and (target / WEIGHTS_NAME).is_file()):

        def download(tmp: Path) -> Path:
            try:
                local = Path(download_artifacts(artifact_uri=location, dst_path=str(tmp), tracking_uri=uri))
            except MlflowException as exc:
                raise RunModelError(
                    f"{spec}: the run has no logged model ({exc.message[:200]}); "
                    "runs log one at the end of `sinklab fit` unless --run.log_model false"
                ) from None
            if not (local / CONFIG_NAME).is_file():
                raise RunModelError(f"{spec}: the downloaded model holds no {CONFIG_NAME}: not a SinkLab model")
            return local

        remove(target)
        publish(target, download)
    return ResolvedModel(uri=spec, path=target, run_id=run_id, tracking_uri=uri)


def final_metrics(resolved: ResolvedModel) -> dict[str, float | None]:
    """The run's last value of each metric a model card reports (label -> value; None: never logged)."""
    from mlflow.tracking import MlflowClient

    logged = MlflowClient(resolved.tracking_uri).get_run(resolved.run_id).data.metrics
    return {label: logged.get(key) for label, key in CARD_METRICS.items()}
