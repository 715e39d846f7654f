"""What a run leaves in MLflow beyond metrics, against the real tracking server: the
final model (loads back to the same logits; `analyze`, `stream-ppl` and `export-hf` take
runs:/<id>), the dataset input, the experiment's training-view marks, system metrics, and one
model per run across resumed starts. One tiny fit is shared by the tests of this module."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fit_runs import fit_in_process, paths
from mlflow.tracking import MlflowClient
from packed_datasets import make_dataset

from data_prep.dataset import load_manifest
from pipeline.analysis import analyze
from pipeline.model import load_pretrained
from pipeline.tracking import RunModelError, resolve_model, run_assets, views

EXPERIMENT = "train-mlflow-run-assets"
WORDS = [f"w{i}" for i in range(4, 64)]


def write_tokenizer(ds: Path) -> None:
    """A word-level tokenizer.json matching the tiny dataset's ids (pad 0, bos 1, eos 2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<|pad|>", "<|bos|>", "<|eos|>", "[UNK]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(ds / "tokenizer.json"))


@pytest.fixture(scope="module")
def fitted(mlflow_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("run_assets")
    ds = make_dataset(root / "ds")
    write_tokenizer(ds)
    run_dir = root / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SINKLAB_CACHE", str(root / "cache"))
        mp.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.02")  # samples within the sub-second fit
        mp.setenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", "1")
        args = [
            *paths(ds, run_dir),
            "--trainer.max_steps",
            "4",
            "--run.experiment",
            EXPERIMENT,
            "--run.sink_every",
            "0",
        ]
        assert fit_in_process(args, mp, mlflow_server) == 0
        mp.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL")
        yield SimpleNamespace(
            root=root,
            ds=ds,
            run_dir=run_dir,
            args=args,
            mp=mp,
            uri=mlflow_server,
            run_id=(run_dir / "mlflow_run_id").read_text().strip(),
            client=MlflowClient(mlflow_server),
        )


def ready_models(f):
    exp_id = f.client.get_run(f.run_id).info.experiment_id
    return [
        m
        for m in f.client.search_logged_models([exp_id], filter_string="name = 'model'")
        if m.source_run_id == f.run_id and str(m.status).endswith("READY")
    ]


def test_logged_model_loads_back_to_the_checkpoints_logits(fitted):
    (model,) = ready_models(fitted)
    run = fitted.client.get_run(fitted.run_id)
    assert run.data.tags["sinklab.model_id"] == model.model_id and model.tags["sinklab.step"] == "4"
    assert [o.model_id for o in run.outputs.model_outputs] == [model.model_id]  # the run's Model column
    manifest = load_manifest(fitted.ds)
    on_model = {m.key: m for m in model.metrics}  # the final values, measured on the run's dataset
    assert set(on_model) == {"train/loss", "val/loss"}  # this fit probes no sink (--run.sink_every 0)
    for key, metric in on_model.items():
        last = max(m.step for m in fitted.client.get_metric_history(fitted.run_id, key))
        assert metric.value == run.data.metrics[key] and metric.step == last
        assert (metric.dataset_name, metric.dataset_digest) == (views.dataset_name(manifest), manifest.hash[:36])
    resolved = resolve_model(f"runs:/{fitted.run_id}")
    assert resolved.run_id == fitted.run_id
    assert {p.name for p in resolved.path.iterdir()} == {
        "model.safetensors",
        "sinklab_config.json",
        "tokenizer.json",
        "dataset.json",
        "hf",
    }
    assert model.tags["sinklab.hf_export"] == "hf/ (LlamaForCausalLM)"  # the default variant
    assert json.loads((resolved.path / "dataset.json").read_text())["manifest_hash"] == load_manifest(fitted.ds).hash
    logged = load_pretrained(resolved.path).eval()
    trained = load_pretrained(fitted.run_dir / "checkpoints" / "step-000004.ckpt").eval()
    assert all(t.dtype == torch.float32 for t in logged.state_dict().values())
    tokens = torch.randint(8, 64, (3, 16), generator=torch.Generator().manual_seed(0))
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(resolved.path / "hf").eval()
    with torch.no_grad():
        assert torch.equal(logged(tokens).logits, trained(tokens).logits)
        torch.testing.assert_close(hf(tokens).logits, trained(tokens).logits, atol=1e-4, rtol=0)
    assert (resolved.path / "hf" / "tokenizer.json").is_file()
    by_id = resolve_model(f"models:/{model.model_id}")  # the logged model's own URI
    assert (
        by_id.run_id == fitted.run_id
        and (by_id.path / "model.safetensors").read_bytes() == (resolved.path / "model.safetensors").read_bytes()
    )
    with pytest.raises(RunModelError, match="not found"):
        resolve_model("runs:/0123456789abcdef0123456789abcdef")


def test_a_variant_llama_cannot_express_is_logged_with_a_remote_code_export(tmp_path):
    from pipeline.model import ModelConfig, Transformer
    from pipeline.tracking import add_hf_export, write_model_dir

    config = ModelConfig.from_preset("micro", vocab_size=64, positional="alibi")
    out = write_model_dir(tmp_path / "model", config, Transformer(config).state_dict())
    assert add_hf_export(out) == "hf/ (remote code)" and (out / "hf" / "hf_modeling.py").is_file()
    assert json.loads((out / "hf" / "config.json").read_text())["sinklab"]["positional"] == "alibi"


def test_an_explicit_tracking_uri_wins_over_the_environment(fitted, tmp_path):
    # MLflow's own runs:/ resolution asks the global URI; resolve_model must not
    import mlflow

    other = f"sqlite:///{tmp_path / 'other.db'}"
    fitted.mp.setenv("MLFLOW_TRACKING_URI", other)
    mlflow.set_tracking_uri(other)
    fitted.mp.setenv("SINKLAB_CACHE", str(tmp_path / "cache"))  # nothing cached: really downloads
    try:
        resolved = resolve_model(f"runs:/{fitted.run_id}", fitted.uri)
        assert resolved.tracking_uri == fitted.uri and (resolved.path / "model.safetensors").is_file()
        model_id = fitted.client.get_run(fitted.run_id).data.tags["sinklab.model_id"]
        assert (resolve_model(f"models:/{model_id}", fitted.uri).path / "sinklab_config.json").is_file()
    finally:
        mlflow.set_tracking_uri(fitted.uri)
        fitted.mp.setenv("MLFLOW_TRACKING_URI", fitted.uri)
        fitted.mp.setenv("SINKLAB_CACHE", str(fitted.root / "cache"))


def test_dataset_input_experiment_marks_and_system_metrics(fitted):
    manifest = load_manifest(fitted.ds)
    run = fitted.client.get_run(fitted.run_id)
    (dataset_input,) = run.inputs.dataset_inputs
    dataset = dataset_input.dataset
    assert dataset.digest == manifest.hash[:36] and dataset.name == f"synthetic · C16 · {manifest.hash[:8]}"
    assert json.loads(dataset.source)["uri"] == str(fitted.ds.resolve())
    profile = json.loads(dataset.profile)
    assert profile["manifest_hash"] == manifest.hash
    assert profile["train_tokens"] == 64 * 16 and profile["domains"]["train"] == {"synthetic": {"documents": 64}}
    assert {t.key: t.value for t in dataset_input.tags} == {"mlflow.data.context": "training"}
    tags = fitted.client.get_experiment(run.info.experiment_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    envelope = json.loads(tags["mlflow.sharedViewState.sinklab-view-v4"])  # a saved view: listed under "Views"
    view = json.loads(envelope["state"])
    assert envelope["name"] == views.VIEW_NAME and isinstance(envelope["createdAt"], int)
    assert view["isAccordionReordered"] and [s["name"] for s in view["compareRunSections"]][:4] == [
        views.HEADLINE_SECTION,
        views.STABILITY_SECTION,
        views.HEADS_SECTION,
        "sink",
    ]
    assert view["orderByKey"] == "tags.`mlflow.runName`"  # a sweep's variants listed flat, with their curves
    url = views.experiment_url(fitted.uri, run.info.experiment_id)
    assert url.startswith(f"{fitted.uri}/#/experiments/{run.info.experiment_id}/runs?workflowType=machine_learning")
    assert "compareRunsMode=CHART" in url and "viewStateShareKey=sinklab-view-v4" in url
    assert any(k.startswith("system/cpu_utilization") for k in run.data.metrics), sorted(run.data.metrics)


def test_analyze_of_the_run_equals_analyze_of_its_checkpoint(fitted, tmp_path):
    common = ["--dataset", str(fitted.ds), "-n", "8", "-T", "12", "--positions", "4", "--no-plots"]
    ckpt = fitted.run_dir / "checkpoints" / "step-000004.ckpt"
    fitted.mp.delenv("MLFLOW_TRACKING_URI")  # the checkpoint's analysis logs nowhere
    assert analyze.main([str(ckpt), *common, "--out", str(tmp_path / "ckpt")]) == 0
    fitted.mp.setenv("MLFLOW_TRACKING_URI", fitted.uri)
    assert analyze.main([f"runs:/{fitted.run_id}", *common, "--out", str(tmp_path / "run")]) == 0
    by_ckpt = json.loads((tmp_path / "ckpt" / "measures.json").read_text())
    by_run = json.loads((tmp_path / "run" / "measures.json").read_text())
    assert by_run["table1"] == by_ckpt["table1"] and set(by_run["table1"]) == {"natural", "random", "repeat"}
    assert by_run["measures"] == by_ckpt["measures"]
    assert by_run["source"] == f"runs:/{fitted.run_id}" and by_run["mlflow_run_id"] == fitted.run_id
    run = fitted.client.get_run(fitted.run_id)  # logged back to the training run, under analysis/
    assert run.data.metrics["analysis/table1/natural"] == by_ckpt["table1"]["natural"]
    assert run.data.metrics["analysis/random/sink_k4"] == by_ckpt["measures"]["random"]["profile"][3]
    assert "analysis/measures.json" in {a.path for a in fitted.client.list_artifacts(fitted.run_id, "analysis")}


def test_stream_ppl_and_export_hf_take_the_run(fitted, tmp_path, capsys):
    from pipeline.analysis import stream_ppl
    from pipeline.cli import main as sinklab

    text = tmp_path / "words.txt"
    text.write_text(" ".join(WORDS * 3))
    assert (
        stream_ppl.main(
            [
                f"runs:/{fitted.run_id}",
                "--text",
                str(text),
                "--max-tokens",
                "24",
                "--cache",
                "1+7",
                "--out",
                str(tmp_path / "ppl.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "ppl.json").read_text())["tokens"] == 24
    # the held-out split of the run's dataset, and the result logged back to the run
    assert (
        stream_ppl.main(
            [
                f"runs:/{fitted.run_id}",
                "--dataset",
                str(fitted.ds),
                "--max-tokens",
                "24",
                "--cache",
                "0+8",
                "--cache",
                "1+7",
                "--out",
                str(tmp_path / "val.json"),
            ]
        )
        == 0
    )
    logged = fitted.client.get_run(fitted.run_id).data.metrics
    ppl = json.loads((tmp_path / "val.json").read_text())["perplexity"]
    assert logged["stream/ppl_1_7"] == pytest.approx(ppl["1+7"]) and logged["stream/ppl_0_8"] == pytest.approx(
        ppl["0+8"]
    )
    from pipeline.analysis import passkey  # words outside the vocabulary are [UNK]: the mechanics only

    assert (
        passkey.main(
            [
                f"runs:/{fitted.run_id}",
                "--length",
                "64",
                "--digits",
                "2",
                "--depths",
                "0,1",
                "--keys",
                "1",
                "--cache",
                "2+30",
                "--full",
                "--out",
                str(tmp_path / "pk"),
            ]
        )
        == 0
    )
    accuracy = json.loads((tmp_path / "pk" / "passkey.json").read_text())["accuracy"]
    logged = fitted.client.get_run(fitted.run_id).data.metrics
    assert logged["passkey/acc_2_30"] == pytest.approx(sum(c["accuracy"] for c in accuracy["2+30"].values()) / 2)
    assert "passkey/acc_full" in logged
    assert "passkey/passkey.png" in {a.path for a in fitted.client.list_artifacts(fitted.run_id, "passkey")}
    assert sinklab(["export-hf", f"runs:/{fitted.run_id}", "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "tokenizer.json").exists() and (tmp_path / "hf" / "config.json").exists()
    card = (tmp_path / "hf" / "README.md").read_text()  # the model card: data, final metrics from the run
    val_loss = fitted.client.get_run(fitted.run_id).data.metrics["val/loss"]
    assert load_manifest(fitted.ds).hash in card and f"| val loss | {val_loss:.4g} |" in card
    assert "| Sink_1 (%, ε = 0.3) | not recorded |" in card  # this fit probes no sink (--run.sink_every 0)
    assert f"the MLflow run {fitted.run_id}" in card
    assert sinklab(["export-hf", "runs:/0123456789abcdef0123456789abcdef", "--out", str(tmp_path / "x")]) == 2
    assert "not found in the MLflow store" in capsys.readouterr().err


def test_a_resumed_run_logs_its_final_model_once(fitted):
    (first,) = ready_models(fitted)
    assert fit_in_process([*fitted.args, "--resume", "auto"], fitted.mp, fitted.uri) == 0  # nothing left
    assert [m.model_id for m in ready_models(fitted)] == [first.model_id]
    assert (
        fit_in_process(
            [
                *paths(fitted.ds, fitted.run_dir),
                "--trainer.max_steps",
                "6",
                "--run.experiment",
                EXPERIMENT,
                "--run.sink_every",
                "0",
                "--resume",
                "auto",
            ],
            fitted.mp,
            fitted.uri,
        )
        == 0
    )
    (latest,) = ready_models(fitted)  # trained on: the newer weights replace the older, one model a run
    assert latest.model_id != first.model_id and latest.tags["sinklab.step"] == "6"
    resolved = resolve_model(f"runs:/{fitted.run_id}")
    assert torch.equal(
        load_pretrained(resolved.path).state_dict()["lm_head.weight"],
        load_pretrained(fitted.run_dir / "checkpoints" / "step-000006.ckpt").state_dict()["lm_head.weight"],
    )
    assert len(fitted.client.get_run(fitted.run_id).inputs.dataset_inputs) == 1  # logged at creation only


def test_log_model_and_system_metrics_flags_turn_them_off(fitted, tmp_path):
    run_dir = tmp_path / "off"
    args = [
        *paths(fitted.ds, run_dir),
        "--trainer.max_steps",
        "3",
        "--run.experiment",
        EXPERIMENT,
        "--run.sink_every",
        "0",
        "--run.log_model",
        "false",
        "--run.system_metrics",
        "false",
    ]
    fitted.mp.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    assert fit_in_process(args, fitted.mp, fitted.uri) == 0
    fitted.mp.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL")
    off = SimpleNamespace(client=fitted.client, run_id=(run_dir / "mlflow_run_id").read_text().strip())
    assert ready_models(off) == []
    assert not [k for k in fitted.client.get_run(off.run_id).data.metrics if k.startswith("system/")]
    with pytest.raises(RunModelError, match="no logged model"):
        resolve_model(f"runs:/{off.run_id}")


def test_final_weights_come_from_the_module_unless_sharded_or_a_checkpoint_is_preferred(fitted):
    from pipeline.checkpoint import RunDir

    ckpt = RunDir(fitted.run_dir).newest_checkpoint()
    from_ckpt = load_pretrained(ckpt)
    module = SimpleNamespace(model=load_pretrained(ckpt))
    with torch.no_grad():
        module.model.lm_head.weight.add_(1.0)  # the module's weights differ from the checkpoint's
    config, state = run_assets.final_weights(module, ckpt)
    assert config == from_ckpt.config and torch.equal(state["lm_head.weight"], module.model.lm_head.weight)
    module.model.lm_head.weight.ds_status = 0  # a ZeRO-3 partition (pipeline.model.is_sharded): not whole
    assert torch.equal(run_assets.final_weights(module, ckpt)[1]["lm_head.weight"], from_ckpt.lm_head.weight)
    assert run_assets.final_weights(module, ckpt.parent) is None  # a checkpoint directory: nothing whole
