"""What a run leaves in MLflow beyond metrics: its dataset input and its final logged model ``model``
(docs/training.md, "Metrics and MLflow")."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sinklab_io.notices import why

from .contract import MODEL_NAME, TAG_MODEL_ID, tracking_uri
from .views import HEADLINE, dataset_name

DIGEST_LIMIT = 36  # mlflow.utils.validation.MAX_DATASET_DIGEST_SIZE


# ---- dataset -------------------------------------------------------------------------------
def manifest_summary(manifest) -> dict[str, Any]:
    """The manifest without shard lists: its settings and the counts of each split and domain."""
    splits = {
        name: {
            "sequences": info.sequences,
            "tokens": info.tokens,
            "documents": info.documents,
            "domains": {d: dict(v) for d, v in sorted(info.domains.items())},
        }
        for name, info in manifest.splits.items()
    }
    return {
        "manifest_hash": manifest.hash,
        "path": str(Path(manifest.root).resolve()),
        "tokenizer": manifest.raw.get("tokenizer"),
        "vocab_size": manifest.vocab_size,
        "context_length": manifest.context_length,
        "bos": manifest.bos,
        "special_ids": dict(manifest.special_ids),
        "splits": splits,
    }


def dataset_input(manifest):
    from mlflow.entities import Dataset, DatasetInput, InputTag

    summary = manifest_summary(manifest)
    profile = {
        "manifest_hash": manifest.hash,
        "context_length": manifest.context_length,
        "vocab_size": manifest.vocab_size,
        **{
            f"{split}_{key}": info[key]
            for split, info in summary["splits"].items()
            for key in ("sequences", "tokens", "documents")
        },
        "domains": {split: info["domains"] for split, info in summary["splits"].items()},
    }
    dataset = Dataset(
        name=dataset_name(manifest),
        digest=manifest.hash[:DIGEST_LIMIT],
        source_type="local",
        source=json.dumps({"uri": summary["path"]}),
        schema=None,
        profile=json.dumps(profile),
    )
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training")])


# ---- the final model -----------------------------------------------------------------------
def final_weights(module, checkpoint: str | os.PathLike | None = None):
    """(ModelConfig, {name: tensor}) of the trained model on rank 0: a DeepSpeed ``checkpoint``'s merged fp32
    master weights, else the module's own where unsharded, else the full ``checkpoint`` file; None without."""
    import torch

    from pipeline.model import has_sharded, load_pretrained

    model = module.model
    if checkpoint is not None and (Path(checkpoint) / "latest").is_file():
        from pipeline.checkpoint import merge_zero_checkpoint

        state = merge_zero_checkpoint(checkpoint)["state_dict"]
        return model.config, {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    if not has_sharded(model):
        return model.config, {k: v.detach() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    if checkpoint is not None and Path(checkpoint).is_file():
        loaded = load_pretrained(checkpoint)
        return loaded.config, dict(loaded.state_dict())
    return None


def log_run_model(cli) -> None:
    """Rank 0, after the final checkpoint: the final weights as the run's model; an outage costs a warning."""
    if not cli.options.log_model or not cli.mlflow_run_id:
        return
    newest = cli.run_dir.newest_checkpoint()
    try:
        weights = final_weights(cli.model, newest)
        if weights is None:
            print(
                f"sinklab fit: no whole final weights on rank 0 (sharded, and {newest} is not a file); "
                "model not logged to MLflow",
                file=sys.stderr,
                flush=True,
            )
            return
        logged = log_final_model(
            tracking_uri(), cli.mlflow_run_id, *weights, manifest=cli.datamodule.manifest, step=cli.trainer.global_step
        )
    except Exception as exc:  # noqa: BLE001 - the checkpoint is on disk; MLflow may be away
        print(
            f"sinklab fit: model not logged to MLflow ({why(exc)}); the weights are in {newest}",
            file=sys.stderr,
            flush=True,
        )
        return
    if logged:
        print(
            f"sinklab: final model logged to MLflow as runs:/{cli.mlflow_run_id}/model ({logged['megabytes']:.1f} MB "
            f"in {logged['seconds']:.1f} s)",
            flush=True,
        )


def write_model_dir(out: Path, config, state: dict, manifest=None) -> Path:
    """fp32 ``model.safetensors`` + ``sinklab_config.json`` (what ``load_pretrained`` reads),
    with the dataset's ``tokenizer.json`` and ``dataset.json`` (manifest summary) beside them."""
    from pipeline.model.loading import write_weights

    out.mkdir(parents=True, exist_ok=True)
    write_weights(config, {k: v.float() if v.is_floating_point() else v for k, v in state.items()}, out)
    if manifest is not None:
        (out / "dataset.json").write_text(json.dumps(manifest_summary(manifest), indent=2) + "\n")
        tokenizer = Path(manifest.root) / "tokenizer.json"
        if tokenizer.is_file():
            shutil.copyfile(tokenizer, out / "tokenizer.json")
    return out


def add_hf_export(model_dir: Path) -> str:
    """The model also as an HF directory ``hf/`` (``sinklab export-hf``); returns its tag, ``hf/ (<how it loads>)``."""
    from data_prep.errors import DataPrepError
    from data_prep.tokenizer import load_tokenizer
    from pipeline.model import load_pretrained
    from pipeline.model.hf_export import export_hf

    model = load_pretrained(model_dir)
    tokenizer, dataset = model_dir / "tokenizer.json", model_dir / "dataset.json"
    try:
        tokenizer = load_tokenizer(str(tokenizer)).as_transformers() if tokenizer.is_file() else None
    except DataPrepError:  # no special-token roles found: the file as it is
        pass
    facts = {"source": "the run's final weights", "metrics_from": "the MLflow run that logged this model"}
    if dataset.is_file():
        facts["dataset"] = json.loads(dataset.read_text())
    return f"hf/ ({export_hf(model, model_dir / 'hf', tokenizer=tokenizer, facts=facts)})"


def log_final_model(
    tracking_uri: str, run_id: str, config, state: dict, manifest=None, step: int = 0
) -> dict[str, Any] | None:
    """Log the weights as the run's one model unless it has one of ``step``: {model_id, seconds, megabytes}, or None."""
    from mlflow.entities import LoggedModelOutput, Metric
    from mlflow.tracking import MlflowClient
    from mlflow.utils import get_results_from_paginated_fn

    client = MlflowClient(tracking_uri)
    run = client.get_run(run_id)
    models = get_results_from_paginated_fn(
        lambda n, token: client.search_logged_models(
            experiment_ids=[run.info.experiment_id],
            filter_string=f"name = '{MODEL_NAME}'",
            max_results=n,
            page_token=token,
        ),
        100,
    )
    previous = next((m for m in models if m.source_run_id == run_id and str(m.status).endswith("READY")), None)
    if previous is not None and previous.tags.get("sinklab.step") == str(step):
        return None  # this run's model at this step is logged already (a repeated or resumed start)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sinklab-model-") as tmp:
        local = write_model_dir(Path(tmp) / MODEL_NAME, config, state, manifest)
        hf = add_hf_export(local)
        size = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
        model = client.create_logged_model(
            run.info.experiment_id,
            name=MODEL_NAME,
            source_run_id=run_id,
            tags={"sinklab.format": "sinklab-safetensors", "sinklab.hf_export": hf, "sinklab.step": str(step)},
            model_type="sinklab-transformer",
        )
        try:
            client.log_model_artifacts(model.model_id, str(local))
            client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
        except BaseException:
            client.finalize_logged_model(model.model_id, "FAILED")
            raise
        client.finalize_logged_model(model.model_id, "READY")
    # the run's final headline values on its logged model, measured on its dataset (the Models tab)
    histories = [client.get_metric_history(run_id, key) for key in HEADLINE]
    final = [max(history, key=lambda m: (m.step, m.timestamp)) for history in histories if history]
    data = (
        {}
        if manifest is None
        else {"dataset_name": dataset_name(manifest), "dataset_digest": manifest.hash[:DIGEST_LIMIT]}
    )
    if final:
        client.log_batch(
            run_id,
            metrics=[Metric(m.key, m.value, m.timestamp, m.step, model_id=model.model_id, **data) for m in final],
        )
    if previous is not None:  # a finished run trained further: its model is the newest weights, one per run
        client.delete_logged_model(previous.model_id)
    seconds = time.perf_counter() - started
    client.set_tag(run_id, TAG_MODEL_ID, model.model_id)
    return {"model_id": model.model_id, "seconds": seconds, "megabytes": size / 2**20}
