"""Results of an analysis go back to the subject's own MLflow run, under one tag name for every command."""

from __future__ import annotations

import json
from types import SimpleNamespace

import mlflow

from pipeline.analysis.subject import Destination, log_results_of
from sinklab_io.outputs import write_output


def test_results_go_back_to_the_subject_run(mlflow_server, tmp_path):
    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    experiment = client.create_experiment(f"subject-{tmp_path.name}")
    run_id = client.create_run(experiment).info.run_id
    subject = SimpleNamespace(tracking_uri=mlflow_server, run_id=run_id, command="kv-eval")
    out = tmp_path / "out"
    write_output(out / "kv.md", "| table |\n", by="sinklab kv-eval")
    (out / "notes.txt").write_text("the user's own file, not uploaded\n")
    result = SimpleNamespace(metrics=lambda: {"kv/loss": 2.5}, budget=64)
    d = Destination(["m"], out, {}, mlflow_uri=None, experiment="unused")

    log_results_of({"m": subject}, "kv", {"m": result}, lambda r: {"budget": r.budget}, out, d)

    run = client.get_run(run_id)
    assert run.data.metrics == {"kv/loss": 2.5}
    assert json.loads(run.data.tags["sinklab.kv.settings"]) == {"budget": 64}
    assert [a.path for a in client.list_artifacts(run_id, "kv")] == ["kv/kv.md"]
