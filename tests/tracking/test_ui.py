"""`sinklab ui`: SinkLab's view written on the named experiments (created) and on those holding training
runs, their links printed; a store it cannot use refused in one line."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from pipeline.cli import main as sinklab
from pipeline.tracking.contract import TAG_RUN_DIR
from pipeline.tracking.views import VIEW_TAG


def test_ui_installs_the_view_on_training_experiments_and_named_ones(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    trained = client.create_experiment("trained", artifact_location=str(tmp_path / "a1"))
    client.create_run(trained, tags={TAG_RUN_DIR: str(tmp_path / "runs" / "r1")})
    other = client.create_experiment("someone-elses", artifact_location=str(tmp_path / "a2"))
    client.create_run(other)

    assert sinklab(["ui", "--tracking-uri", uri, "--experiment", "sweep-to-come"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"SinkLab's chart view on 2 experiments of {uri}"
    assert out[1] == "  home: http://127.0.0.1:5000/#/?workflowType=machine_learning"
    named = client.get_experiment_by_name("sweep-to-come")
    assert sorted(line.split(":")[0].strip() for line in out[2:]) == ["sweep-to-come", "trained"]
    assert all(line.endswith("viewStateShareKey=sinklab-view-v4") for line in out[2:])
    assert VIEW_TAG in named.tags and VIEW_TAG in client.get_experiment(trained).tags
    assert VIEW_TAG not in client.get_experiment(other).tags


def test_ui_refuses_a_store_it_cannot_use_in_one_line(capsys):
    assert sinklab(["ui", "--tracking-uri", "bogus://store"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sinklab ui: bogus://store: ") and "\n" not in err


@pytest.mark.parametrize("argv", [["--help"]])
def test_ui_help_names_the_credentials(argv, capsys):
    with pytest.raises(SystemExit):
        sinklab(["ui", *argv])
    assert "MLFLOW_TRACKING_PASSWORD" in capsys.readouterr().out
