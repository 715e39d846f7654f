"""`sinklab fit` end to end on CPU, logging to a real MLflow tracking server over HTTP."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from fit_runs import (
    TINY,
    built_fit,
    fit_command,
    fit_in_process,
    lean_tracking,
    logged_image_keys,
    losses,
    paths,
    read_metrics,
)
from mlflow.tracking import MlflowClient
from packed_datasets import make_dataset

from data_prep.dataset import PackedSplit, load_manifest
from pipeline.flops import flops_per_token
from pipeline.model import load_pretrained
from pipeline.tracking import sent_to_mlflow
from pipeline.train import module as module_mod


def test_fit_logs_one_mlflow_run_with_config_metrics_and_plots(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    run_dir = tmp_path / "run"
    monkeypatch.setenv("SINKLAB_PEAK_TFLOPS", "0.001")  # a peak for the CPU, so MFU is logged
    rc = fit_in_process(
        [
            *paths(tiny_ds, run_dir),
            "--trainer.max_steps",
            "8",
            "--run.plot_every",
            "8",
            "--run.experiment",
            "train-fit",
            "--data.interventions.fix_position",
            "2",
            "--data.interventions.fix_token",
            "bos",
        ],
        monkeypatch,
        mlflow_server,
    )
    assert rc == 0
    client = MlflowClient(mlflow_server)
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    run = client.get_run(run_id)
    exp = client.get_experiment_by_name("train-fit")
    assert len(client.search_runs([exp.experiment_id])) == 1
    assert run.info.status == "FINISHED"
    params, tags = run.data.params, run.data.tags
    assert params["optim.lr"] == "0.003" and params["arch.d_model"] == "32"
    assert params["data.interventions.fix_position"] == "2"
    assert tags["sinklab.dataset_hash"] == load_manifest(tiny_ds).hash
    assert tags["sinklab.status"] == "finished" and tags["sinklab.code_version"]
    assert "fix x2=bos" in tags["sinklab.variant"]
    hist = {m.step: m.value for m in client.get_metric_history(run_id, "train/loss")}
    assert sorted(hist) == list(range(8))
    assert hist == losses(run_dir)
    assert [m.step for m in client.get_metric_history(run_id, "sink/sink1")] == [0, 4, 8]
    assert [m.step for m in client.get_metric_history(run_id, "val/loss")] == [4, 8]
    assert client.get_metric_history(run_id, "act/massive_ratio_l1")
    # the information flow from the same probe (pipeline.flow)
    assert [m.step for m in client.get_metric_history(run_id, "flow/mixing_last")] == [0, 4, 8]
    assert 0.0 <= client.get_metric_history(run_id, "flow/entropy_l1")[0].value <= 1.0
    # active and dormant heads from the same probe pass
    assert [m.step for m in client.get_metric_history(run_id, "heads/dormant_pct")] == [0, 4, 8]
    # per-head values: in metrics.jsonl and the heat-map images, not one MLflow chart per head
    first = next(row for row in read_metrics(run_dir) if "heads/entropy_l1_h0" in row)
    assert 0.0 <= first["heads/entropy_l1_h0"] <= 1.0 and first["heads/out_norm_l0_h1"] > 0.0
    assert not client.get_metric_history(run_id, "heads/entropy_l1_h0")
    plotted = sorted(int(f.stem.split("-")[-1]) for f in (run_dir / "plots").glob("alpha1_step-*.png"))
    assert logged_image_keys(client, run_id)["heads/alpha1"] == plotted and plotted[-1] == 8
    # the largest pre-softmax logit per layer, live; per head in the jsonl and its own image
    logit = {m.step: m.value for m in client.get_metric_history(run_id, "attn/max_logit")}
    assert sorted(logit) == [0, 4, 8] and all(v > 0 for v in logit.values())
    last = next(r for r in read_metrics(run_dir) if r["step"] == 8 and "attn/max_logit_l0" in r)
    assert logit[8] == max(last["attn/max_logit_l0"], last["attn/max_logit_l1"])
    assert not client.get_metric_history(run_id, "heads/max_logit_l0_h0") and "heads/max_logit_l1_h1" in first
    assert logged_image_keys(client, run_id)["heads/max_logit"] == plotted
    speed = {m.step: m.value for m in client.get_metric_history(run_id, "perf/tokens_per_s")}
    mfu = {m.step: m.value for m in client.get_metric_history(run_id, "perf/mfu")}
    config = load_pretrained(run_dir / "checkpoints" / "step-000008.ckpt").config
    flops = flops_per_token(config, load_manifest(tiny_ds).context_length)
    assert speed and sorted(mfu) == sorted(speed)
    for step, tokens_per_s in speed.items():
        assert mfu[step] == pytest.approx(tokens_per_s * flops / 1e9, rel=1e-6)
    lrs = [m.value for m in sorted(client.get_metric_history(run_id, "train/lr"), key=lambda m: m.step)]
    assert lrs[:3] == pytest.approx([1.5e-3, 3e-3, 3e-3]) and lrs[-1] < lrs[2]
    artifacts = {a.path for a in client.list_artifacts(run_id, "config")} | {
        a.path for a in client.list_artifacts(run_id, "plots")
    }
    assert {"config/config.yaml", "plots/alpha1_step-000008.png"} <= artifacts
    # checkpoints: named step-N, last 2 kept, loadable by pipeline.model.load_pretrained
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["step-000004.ckpt", "step-000008.ckpt"]
    blob = torch.load(run_dir / "checkpoints" / "step-000008.ckpt", weights_only=False)
    assert blob["hyper_parameters"]["arch"]["vocab_size"] == 64
    assert all(k.startswith("model.") for k in blob["state_dict"])
    model = load_pretrained(run_dir / "checkpoints" / "step-000008.ckpt")
    assert torch.equal(model.embed.weight, blob["state_dict"]["model.embed.weight"])
    assert not (run_dir / "lock").exists()
    # a second start on the same directory without --resume refuses
    assert fit_in_process(paths(tiny_ds, run_dir), monkeypatch, mlflow_server) == 2


def test_the_run_config_builds_the_model_it_trained(tmp_path, monkeypatch, mlflow_server):
    """config.yaml named the preset's vocab_size (64) while the model was built with the dataset's
    (48): `sinklab export-hf sd.pt --config <run>/config.yaml`, the advice export-hf gives for a
    bare state dict, failed with a size mismatch."""
    from pipeline import export
    from pipeline.model.transformer import Transformer

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    dataset, run_dir = make_dataset(tmp_path / "v48", V=48), tmp_path / "run"
    with built_fit(
        ["--config", TINY, *paths(dataset, run_dir), "--run.experiment", "train-fit-vocab", *lean_tracking()]
    ) as cli:
        torch.save(Transformer(cli.model.arch).state_dict(), tmp_path / "sd.pt")
    args = [str(tmp_path / "sd.pt"), "--config", str(run_dir / "config.yaml"), "--out", str(tmp_path / "hf")]
    assert export.main(args) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 48


def test_batches_hold_the_global_order_with_interventions(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    seen: list[torch.Tensor] = []
    original = module_mod.SinkLabModule.lm_loss

    def spy(self, tokens):
        if self.training:
            seen.append(tokens.clone())
        return original(self, tokens)

    monkeypatch.setattr(module_mod.SinkLabModule, "lm_loss", spy)
    rc = fit_in_process(
        [
            *paths(tiny_ds, tmp_path / "r"),
            "--trainer.max_steps",
            "3",
            "--data.interventions.resample",
            "[1, 3]",
            "--data.token_budget",
            "160",
            "--run.sink_every",
            "0",
            "--run.val_every",
            "100",
        ],
        monkeypatch,
        mlflow_server,
    )
    assert rc == 0
    batches = torch.cat(seen).numpy()
    assert batches.shape == (24, 16)  # 3 steps x 8 sequences
    split = PackedSplit(tiny_ds, "train")
    from pipeline.train.data import GlobalOrder

    order = GlobalOrder(len(split), seed=1234, budget_sequences=10)  # 160 tokens / 16
    for g, row in enumerate(batches):
        epoch, index = order.lookup(g)
        expected = split[index]
        assert np.array_equal(row[[1] + list(range(3, 16))], expected[[1] + list(range(3, 16))])
    assert len({order.lookup(g)[1] for g in range(24)}) == 10  # 24 samples from a 10-sequence budget
    changed = batches[:, [0, 2]] != np.stack([split[order.lookup(g)[1]] for g in range(24)])[:, [0, 2]]
    assert changed.mean() > 0.8


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    original = module_mod.SinkLabModule.lm_loss

    def poisoned(self, tokens):
        loss = original(self, tokens)
        return loss * float("nan") if self.training and self.global_step >= 5 else loss

    monkeypatch.setattr(module_mod.SinkLabModule, "lm_loss", poisoned)
    run_dir = tmp_path / "nan"
    rc = fit_in_process([*paths(tiny_ds, run_dir), "--run.sink_every", "0"], monkeypatch, mlflow_server)
    assert rc == 3
    assert "non-finite training loss (nan) at step 5" in capsys.readouterr().err
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-000004.ckpt"]
    assert sorted(losses(run_dir)) == [0, 1, 2, 3, 4]
    client = MlflowClient(mlflow_server)
    run = client.get_run((run_dir / "mlflow_run_id").read_text().strip())
    assert run.data.tags["sinklab.status"] == "nonfinite" and run.info.status == "FAILED"
    assert not (run_dir / "lock").exists()


def test_second_job_on_a_run_dir_refuses(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    run_dir = tmp_path / "locked"
    run_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run_dir / "lock").write_text(
            json.dumps({"pid": holder.pid, "host": socket.gethostname(), "slurm_job_id": None})
        )
        rc = fit_in_process(paths(tiny_ds, run_dir), monkeypatch, mlflow_server)
    finally:
        holder.kill()
        holder.wait()
    assert rc == 2
    assert f"in use by pid {holder.pid}" in capsys.readouterr().err


def test_impossible_batch_is_a_one_line_error(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    rc = fit_in_process(
        [*paths(tiny_ds, tmp_path / "b"), "--data.micro_batch_size", "3"],
        monkeypatch,
        mlflow_server,
    )
    assert rc == 2
    assert "data.micro_batch_size=3" in capsys.readouterr().err


class _Proxy:
    """A TCP relay in front of the MLflow server that can be cut and restored."""

    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self.target = (host.replace("http://", ""), int(port))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.up = True
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if not self.up:
                conn.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                conn.close()
                continue
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a, b):
        try:
            while (data := a.recv(65536)) and self.up:  # cutting also drops kept-alive connections
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_training_survives_an_mlflow_outage(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    proxy = _Proxy(mlflow_server)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    original = module_mod.SinkLabModule._end_of_step

    def toggling(self):
        proxy.up = not (3 <= self.global_step < 7)  # the server is unreachable for steps 3..6
        return original(self)

    monkeypatch.setattr(module_mod.SinkLabModule, "_end_of_step", toggling)
    from pipeline import tracking

    monkeypatch.setattr(tracking.RunLogger, "__init__.__defaults__", (1.0,), raising=False)
    run_dir = tmp_path / "outage"
    rc = fit_in_process(
        [*paths(tiny_ds, run_dir), "--run.sink_every", "0", "--trainer.max_steps", "10"],
        monkeypatch,
        f"http://127.0.0.1:{proxy.port}",
    )
    assert rc == 0
    assert "MLflow tracking server unreachable" in capsys.readouterr().err
    client = MlflowClient(mlflow_server)
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    hist = {m.step: m.value for m in client.get_metric_history(run_id, "train/loss")}
    assert hist == losses(run_dir) and sorted(hist) == list(range(10))
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_server_lost_mid_run_gets_every_metric_from_the_next_start(
    tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys
):
    """The tracking server goes away at step 4 and stays away to the end of the run (exit
    0, the run left RUNNING, the rest queued). The next start of the run dir, with the server back,
    sends what was queued before anything else, logs the model and closes the run: MLflow then
    holds every value of metrics.jsonl, once."""
    proxy = _Proxy(mlflow_server)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    original = module_mod.SinkLabModule._end_of_step

    def losing(self):
        proxy.up = self.global_step < 4
        return original(self)

    from pipeline import tracking

    monkeypatch.setattr(module_mod.SinkLabModule, "_end_of_step", losing)
    monkeypatch.setattr(tracking.RunLogger, "__init__.__defaults__", (1.0,), raising=False)
    run_dir = tmp_path / "lost"
    args = [
        *paths(tiny_ds, run_dir),
        "--run.sink_every",
        "3",
        "--trainer.max_steps",
        "10",
        "--run.checkpoint_every",
        "5",
        "--run.system_metrics",
        "false",
    ]
    uri = f"http://127.0.0.1:{proxy.port}"
    assert fit_in_process(args, monkeypatch, uri) == 0
    assert "could not be sent before the end" in capsys.readouterr().err
    client = MlflowClient(mlflow_server)
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    assert client.get_run(run_id).info.status == "RUNNING"
    assert max(m.step for m in client.get_metric_history(run_id, "train/loss")) < 4

    monkeypatch.setattr(module_mod.SinkLabModule, "_end_of_step", original)
    assert fit_in_process([*args, "--resume", "auto"], monkeypatch, uri) == 0  # a start while it is still away
    assert "unreachable: what it lacks waits in" in capsys.readouterr().out
    proxy.up = True
    assert fit_in_process([*args, "--resume", "auto"], monkeypatch, uri) == 0
    assert "that earlier starts could not send, sent" in capsys.readouterr().err
    local: dict[str, dict[int, float]] = {}
    for row in read_metrics(run_dir):
        for key, value in row.items():
            if key not in ("step", "time") and sent_to_mlflow(key):  # per-head values stay local
                local.setdefault(key, {})[row["step"]] = value
    assert {"train/loss", "sink/sink1", "val/loss"} <= set(local)
    for key, by_step in local.items():
        history = client.get_metric_history(run_id, key)
        assert {m.step: m.value for m in history} == pytest.approx(by_step), key
        assert len(history) == len(by_step), key  # once each
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["sinklab.status"] == "finished"
    assert "sinklab.model_id" in run.data.tags


@pytest.mark.parametrize("op,proxy", [("softmax", False), ("kernel", True)])
def test_summary_says_when_sink_scores_are_proxies(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys, op, proxy):
    args = [
        *paths(tiny_ds, tmp_path / op),
        "--trainer.max_steps",
        "4",
        "--arch.attention.op",
        op,
        "--arch.attention.feature_map",
        "elu1",
    ]
    assert fit_in_process(args, monkeypatch, mlflow_server) == 0
    first = capsys.readouterr().out
    # started again on the finished run (what a second `make run` does): nothing trains, and the
    # summary still shows the whole run, read back from the run dir
    assert fit_in_process([*args, "--resume", "auto"], monkeypatch, mlflow_server) == 0
    again = capsys.readouterr().out

    def sink_lines(out: str) -> tuple[str, str]:
        lines = out.splitlines()
        i = next(i for i, line in enumerate(lines) if line.startswith("Sink_1 (ε=0.3"))
        return lines[i], lines[i + 1]

    for out in (first, again):
        header, values = sink_lines(out)
        assert ("proxy scores" in header) == proxy
        assert values.split() == sink_lines(first)[1].split()
        assert [p.split(":")[0] for p in values.split()] == ["0", "4"]


@pytest.mark.parametrize("position", [1, 2])
def test_probe_carries_the_fixed_token_where_training_fixed_it(tiny_ds, position):
    from data_prep.dataset import load_probe
    from pipeline.train.data import SinkDataModule
    from pipeline.train.interventions import Interventions

    raw = torch.as_tensor(load_probe(tiny_ds), dtype=torch.long)
    dm = SinkDataModule(str(tiny_ds), interventions=Interventions(fix_position=position, fix_token="eos"))
    probe = dm.probe_tokens()
    eos = dm.special_ids["eos"]
    assert (probe[:, position - 1] == eos).all()
    keep = [c for c in range(raw.shape[1]) if c != position - 1]
    assert torch.equal(probe[:, keep], raw[:, keep])
    assert torch.equal(SinkDataModule(str(tiny_ds)).probe_tokens(), raw)  # no intervention: the probe as prepared


def test_validation_sees_the_training_interventions(tiny_ds):
    """Held-out rows get the fixed token and the resampled positions too (their own draws,
    the same at every evaluation); the rest of each row is the prepared sequence."""
    from data_prep.dataset import PackedSplit, load_manifest
    from pipeline.train.data import SinkDataModule
    from pipeline.train.interventions import Interventions

    dm = SinkDataModule(
        str(tiny_ds),
        micro_batch_size=4,
        val_batches=2,
        interventions=Interventions(resample=[2, 3], fix_position=1, fix_token="bos"),
    )
    rows = torch.cat(list(dm.val_dataloader()))
    again = torch.cat(list(dm.val_dataloader()))
    raw = torch.as_tensor(
        np.stack([PackedSplit(str(tiny_ds), "val", load_manifest(tiny_ds))[i] for i in range(len(rows))]).astype(
            np.int64
        )
    )
    assert torch.equal(rows, again)
    assert (rows[:, 0] == dm.special_ids["bos"]).all()
    assert (rows[:, 1:3] != raw[:, 1:3]).any()
    assert torch.equal(rows[:, 3:], raw[:, 3:])
    plain = torch.cat(list(SinkDataModule(str(tiny_ds), micro_batch_size=4, val_batches=2).val_dataloader()))
    assert torch.equal(plain, raw)


def test_metrics_of_an_offline_first_start_reach_mlflow_on_resume(
    tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys
):
    with socket.socket() as s:  # a port nothing listens on: MLflow is down for the first start
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    run_dir = tmp_path / "offline"
    args = [
        *paths(tiny_ds, run_dir),
        "--trainer.max_steps",
        "6",
        "--run.checkpoint_every",
        "3",
        "--run.sink_every",
        "3",
    ]
    assert fit_in_process(args, monkeypatch, dead) == 0
    assert "unreachable" in capsys.readouterr().err and not (run_dir / "mlflow_run_id").exists()
    assert fit_in_process([*args, "--resume", "auto"], monkeypatch, mlflow_server) == 0  # nothing left to train
    client = MlflowClient(mlflow_server)
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    assert {m.step: m.value for m in client.get_metric_history(run_id, "train/loss")} == losses(run_dir)
    assert [m.step for m in client.get_metric_history(run_id, "sink/sink1")] == [0, 3, 6]


def test_init_starts_a_new_run_from_another_runs_weights(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    """--model.init runs:/<id>: step 0 of the new run probes the source run's final weights (the
    same Sink_1 and α₁ as the source's last probe); fresh optimizer and schedule; linked by tags.
    A source of another shape is refused in one line naming the fields."""
    from mlflow.tracking import MlflowClient

    data = ["--data.path", str(tiny_ds), "--run.sink_every", "4"]
    source = tmp_path / "source"
    assert (
        fit_in_process([*data, "--run-dir", str(source), "--trainer.max_steps", "8"], monkeypatch, mlflow_server) == 0
    )
    source_id = (source / "mlflow_run_id").read_text().strip()
    probe = {r["step"]: r for r in read_metrics(source) if "sink/alpha1_mean" in r}[8]

    child = tmp_path / "child"
    assert (
        fit_in_process(
            [*data, "--run-dir", str(child), "--trainer.max_steps", "4", "--model.init", f"runs:/{source_id}"]
            + ["--run.flow", "false"],  # the information-flow metrics off: Sink_1 and the rest only
            monkeypatch,
            mlflow_server,
        )
        == 0
    )
    first = {r["step"]: r for r in read_metrics(child) if "sink/alpha1_mean" in r}[0]
    assert first["sink/alpha1_mean"] == pytest.approx(probe["sink/alpha1_mean"], abs=1e-6)
    assert first["sink/sink1"] == probe["sink/sink1"]
    assert "flow/mixing_last" in probe and "flow/entropy_l0" in probe  # run.flow on (the default)
    assert not any(k.startswith("flow/") for r in read_metrics(child) for k in r)  # run.flow false
    tags = MlflowClient(mlflow_server).get_run((child / "mlflow_run_id").read_text().strip()).data.tags
    assert tags["sinklab.init_run_id"] == source_id and tags["sinklab.init_from"] == f"runs:/{source_id}"
    ckpt = torch.load(child / "checkpoints" / "step-000004.ckpt", weights_only=False)
    assert ckpt["global_step"] == 4  # its own schedule from step 0, not the source's step 8

    capsys.readouterr()
    assert (
        fit_in_process(
            [
                *data,
                "--run-dir",
                str(tmp_path / "wide"),
                "--trainer.max_steps",
                "4",
                "--arch.d_ffn",
                "96",
                "--model.init",
                f"runs:/{source_id}",
            ],
            monkeypatch,
            mlflow_server,
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"sinklab fit: model.init=runs:/{source_id}: its model differs in d_ffn (d_ffn=64); set arch to match"
    ), err[-3:]
    assert not (tmp_path / "wide" / "config.yaml").exists()


def test_nothing_is_written_where_the_command_runs(tiny_ds, tmp_path, monkeypatch):
    """With MLFLOW_TRACKING_URI=sqlite:///<dir>/mlflow.db, every experiment SinkLab creates keeps a
    run's artifacts and its logged model beside the store, never in ./mlruns of whatever directory
    the command runs in."""
    from pipeline.tracking import experiment_id

    cwd, store = tmp_path / "somewhere", tmp_path / "store"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    uri = f"sqlite:///{store}/mlflow.db"
    args = [
        *paths(tiny_ds, tmp_path / "run"),
        "--trainer.max_steps",
        "4",
        "--run.system_metrics",
        "false",
        "--run.plot_every",
        "4",
    ]  # heat maps: artifacts and MLflow images
    assert fit_in_process(args, monkeypatch, uri) == 0
    client = MlflowClient(uri)
    assert experiment_id(client, "another") != experiment_id(client, "sinklab-tests")  # an analysis's, say
    run = client.create_run(experiment_id(client, "another"))
    client.log_text(run.info.run_id, "x", "note.txt")
    assert not any(cwd.iterdir())
    run_id = (tmp_path / "run" / "mlflow_run_id").read_text().strip()
    for artifacts in (client.get_run(run_id).info.artifact_uri, run.info.artifact_uri):
        assert artifacts.startswith((store / "artifacts").as_uri())
    assert (store / "artifacts").is_dir() and any((store / "artifacts").rglob("model.safetensors"))
    assert any((store / "artifacts").rglob("images/heads~alpha1+step+4+*.png"))


# what other libraries print when they warn or advertise: a Python warning's "file.py:N: " (Lightning's
# format) or "SomeWarning:", a logger's level tag, MLflow's run address, Lightning's tips
THIRD_PARTY = re.compile(r"\.py:\d+: |\w+Warning: |\[WARNING\]|\bINFO\b|View run|Tip:|litlogger")


def test_a_cpu_fit_and_its_export_print_nothing_of_other_libraries(tiny_ds, tmp_path):
    """`sinklab fit` on the tiny recipe with a new sqlite store (as `make run` logs), then `sinklab export-hf`
    of its checkpoint, each a process of its own: what they print is SinkLab's and Lightning's progress."""
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/store/mlflow.db", CUDA_VISIBLE_DEVICES="")
    run_dir = tmp_path / "run"
    fit = [*paths(tiny_ds, run_dir), "--trainer.max_steps", "4", "--run.plot_every", "4"]
    checkpoint = run_dir / "checkpoints" / "step-000004.ckpt"
    export = [sys.executable, "-m", "pipeline.cli", "export-hf", str(checkpoint), "--out", str(tmp_path / "hf")]
    for command, said in ((fit_command(fit), "sinklab fit: summary"), (export, "wrote ")):
        done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and said in done.stdout, done.stderr[-3000:]
        noise = [line for line in (done.stdout + done.stderr).splitlines() if THIRD_PARTY.search(line)]
        assert not noise, noise


def test_fit_help_names_only_todays_options(capsys):
    from pipeline.train.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "--arch.attention.op" in out and "--optim.lr" in out
    assert "--model.arch" not in out and "--model.optim" not in out and "lacks type and help" not in out
