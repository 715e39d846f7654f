"""A user's mistake or Ctrl-C gives one clear line, leaves no MLflow run RUNNING and
nothing half-written in the run directory."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from fit_runs import fit_command, fit_in_process, paths
from mlflow.tracking import MlflowClient

from pipeline import probe as probe_mod


def _runs(uri: str, experiment: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp is not None else []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data.global_batch_tokens", "100"], "use 64 or 128"),
        (["--data.global_batch_tokens", "0"], "data.global_batch_tokens=0: must be positive"),
        (["--trainer.accumulate_grad_batches", "2"], "trainer.accumulate_grad_batches is derived"),
        (["--trainer.max_steps=-1"], "trainer.max_steps must be set"),
        (["--optim.lr=-1e-3"], "optim.lr=-0.001: must be positive"),
        (["--data.path", "no-such-dataset"], "data.path=no-such-dataset: no manifest.json"),
        (["--optim.lrr", "1"], "unrecognized arguments: --optim.lrr 1"),
        (["--arch.attention.op", "sigmod"], "arch.attention.op: Expected a typing.Literal"),
        (["--arch.max_seq_len", "8"], "arch.max_seq_len=8 is below the dataset's context length 16"),
        (["--model.init", "no-such.ckpt"], "model.init=no-such.ckpt: no such checkpoint"),
        # a value in scientific notation is a value, not an option; a negative keep_last is not "all"
        (["--optim.lr", "-1e-3"], "optim.lr=-0.001: must be positive"),
        (["--run.keep_last=-1"], "run.keep_last=-1: must be >= 0"),
        (["--model.init", "GARBAGE"], "not a readable checkpoint or state dict"),
    ],
)
def test_refused_start_is_one_line_and_leaves_nothing(
    args, message, tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys
):
    run_dir = tmp_path / "refused"
    experiment = f"errors-{abs(hash(message))}"
    if "GARBAGE" in args:
        (tmp_path / "garbage.ckpt").write_bytes(b"not a checkpoint")
        args = [a.replace("GARBAGE", str(tmp_path / "garbage.ckpt")) for a in args]
    rc = fit_in_process(
        [*paths(tiny_ds, run_dir), "--run.experiment", experiment, *args],
        monkeypatch,
        mlflow_server,
    )
    out, err = capsys.readouterr()
    assert rc == 2
    lines = [line for line in err.splitlines() if line.startswith("sinklab fit:")]
    assert len(lines) == 1 and message in lines[0], err
    assert out == ""  # only the refusal: no "sinklab: run dir ...; batch: ..." banner before it
    assert not err.lstrip().startswith("usage:")  # no 60-line usage dump before it
    assert not run_dir.exists()  # no config.yaml (a fixed start would write config.1.yaml), no lock
    assert _runs(mlflow_server, experiment) == []  # no MLflow run left RUNNING


def test_fixed_start_after_a_refused_one_writes_config_yaml(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    run_dir = tmp_path / "fixed"
    assert fit_in_process(paths(tmp_path / "missing", run_dir), monkeypatch, mlflow_server) == 2
    assert (
        fit_in_process(
            [*paths(tiny_ds, run_dir), "--trainer.max_steps", "3", "--run.sink_every", "0"],
            monkeypatch,
            mlflow_server,
        )
        == 0
    )
    assert sorted(p.name for p in run_dir.glob("config*.yaml")) == ["config.yaml"]


def test_sink_share_of_the_summary_stays_within_the_run(tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    """The step-0 probe ran before the training clock started: a slow probe made the share > 100%."""
    original = probe_mod.run_probe

    def slow(*args, **kwargs):
        time.sleep(0.5)
        return original(*args, **kwargs)

    monkeypatch.setattr(probe_mod, "run_probe", slow)
    rc = fit_in_process(
        [*paths(tiny_ds, tmp_path / "share"), "--trainer.max_steps", "3", "--run.sink_every", "3"],
        monkeypatch,
        mlflow_server,
    )
    assert rc == 0
    share = re.search(
        r"sink metrics [\d.]+ s \(([\d.]+)% of it\), their figures [\d.]+ s \(([\d.]+)%\)", capsys.readouterr().out
    )
    assert share and 0 < float(share.group(1)) <= 100 and 0 <= float(share.group(2)) < 100


def test_ctrl_c_exits_130_and_marks_the_run_interrupted(tiny_ds, tmp_path, mlflow_server):
    run_dir = tmp_path / "ctrl-c"
    env = dict(os.environ, MLFLOW_TRACKING_URI=mlflow_server, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        fit_command([*paths(tiny_ds, run_dir), "--trainer.max_steps", "100000", "--run.sink_every", "0"]),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # as in a terminal
    deadline = time.time() + 120
    while not (run_dir / "metrics.jsonl").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-2000:]
    assert re.search(r"sinklab fit: interrupted at step \d+; continue it with --resume auto", out)
    run = MlflowClient(mlflow_server).get_run((run_dir / "mlflow_run_id").read_text().strip())
    assert run.data.tags["sinklab.status"] == "interrupted" and run.info.status == "KILLED"
    assert not (run_dir / "lock").exists()


@pytest.fixture
def damaged_ds(tiny_ds, tmp_path):
    """The tiny dataset with a token id beyond its vocabulary (64) in every row of one train shard,
    the shard's size unchanged (its sha256 no longer matches the manifest)."""
    import shutil

    import numpy as np

    root = shutil.copytree(tiny_ds, tmp_path / "damaged")
    shard = np.fromfile(root / "train" / "00000.bin", dtype=np.uint16).reshape(-1, 16)
    shard[:, 5] = 60000
    shard.tofile(root / "train" / "00000.bin")
    return root


def test_token_id_beyond_the_vocabulary_is_one_line(damaged_ds, tmp_path, monkeypatch, mlflow_server, capsys):
    run_dir = tmp_path / "ids"
    rc = fit_in_process([*paths(damaged_ds, run_dir), "--run.sink_every", "0"], monkeypatch, mlflow_server)
    assert rc == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sinklab fit:")]
    assert len(err) == 1 and "holds token id 60000, outside the vocabulary of 64" in err[0]
    run = MlflowClient(mlflow_server).get_run((run_dir / "mlflow_run_id").read_text().strip())
    assert run.info.status == "FAILED" and run.data.tags["sinklab.status"] == "failed"


def test_verify_option_checks_the_shards_before_anything_starts(
    damaged_ds, tmp_path, monkeypatch, mlflow_server, capsys
):
    run_dir = tmp_path / "verified"
    rc = fit_in_process([*paths(damaged_ds, run_dir), "--data.verify", "true"], monkeypatch, mlflow_server)
    assert rc == 2
    assert "00000.bin: sha256 differs from the manifest; the file is corrupt" in capsys.readouterr().err
    assert not run_dir.exists()


def test_a_file_size_limit_while_checkpointing_is_one_line_and_keeps_the_older_checkpoints(
    tiny_ds, tmp_path, monkeypatch, mlflow_server
):
    """EFBIG (or ENOSPC) while a step checkpoint is written: one line, exit 2, no partial file; the
    checkpoints already on disk stay and a resume continues."""
    import resource

    run_dir = tmp_path / "full"
    env = dict(os.environ, MLFLOW_TRACKING_URI=mlflow_server)
    args = [*paths(tiny_ds, run_dir), "--run.sink_every", "0", "--run.system_metrics", "false"]
    assert fit_in_process([*args, "--trainer.max_steps", "4"], monkeypatch, mlflow_server) == 0
    small = (run_dir / "checkpoints" / "step-000004.ckpt").stat().st_size // 2
    limited = subprocess.run(
        fit_command([*args, "--trainer.max_steps", "8", "--resume", "auto"]),
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (small, small)),
    )
    lines = [line for line in limited.stderr.splitlines() if line.startswith("sinklab fit:")]
    assert limited.returncode == 2 and len(lines) == 1, limited.stderr[-2000:]
    assert (
        "File too large" in lines[0] and "ulimit -f" in lines[0] and "checkpoints already written are kept" in lines[0]
    )
    # the line names the run's checkpoints folder, not a temporary file that is gone
    assert lines[0].startswith(f"sinklab fit: writing {run_dir / 'checkpoints'}: File too large"), lines[0]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000004.ckpt"]
    assert "Traceback" not in limited.stderr


def test_a_failed_sql_store_write_is_logged_without_its_traceback():
    """`ulimit -f` under a sqlite:/// store: MLflow's own ERROR record keeps SQLAlchemy's message,
    not its traceback, before sinklab's one line."""
    import io
    import logging

    import pipeline.tracking.logger  # noqa: F401 - installs the filter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    store_log = logging.getLogger("mlflow.store.db.utils")
    store_log.addHandler(handler)
    try:
        try:
            raise OSError("disk I/O error")
        except OSError:
            store_log.error("SQLAlchemy database error. The following exception is caught.", exc_info=True)
    finally:
        store_log.removeHandler(handler)
    assert "SQLAlchemy database error" in stream.getvalue() and "Traceback" not in stream.getvalue()


def test_a_sql_store_that_cannot_be_opened_is_one_line_before_anything_is_written(tiny_ds, tmp_path):
    """A sqlite:/// store that cannot be opened (one larger than `ulimit -f`; here: a path under a
    file), which fails inside MlflowClient's construction: one line naming the store, exit 2, and no
    run directory."""
    (tmp_path / "a-file").write_text("not a folder")
    uri = f"sqlite:///{tmp_path}/a-file/mlflow.db"
    run_dir = tmp_path / "run"
    done = subprocess.run(
        fit_command(paths(tiny_ds, run_dir)),
        env=dict(os.environ, MLFLOW_TRACKING_URI=uri),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == "", done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()  # Lightning's start-up notes wait for an accepted config
    assert len(lines) == 1 and lines[0].startswith(
        f"sinklab fit: MLFLOW_TRACKING_URI={uri}: the store cannot be opened"
    )
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--optim.lr", "0"], "optim.lr=0.0: must be positive"),
        (["--optim.warmup_steps", "12"], "optim.warmup_steps=12: must be in [0, trainer.max_steps=12)"),
        (["--data.global_batch_tokens", "24"], "data.global_batch_tokens=24"),
        (["--arch.max_seq_len", "8"], "arch.max_seq_len=8 is below the dataset's context length 16"),
        (["--trainer.max_steps", "0"], "trainer.max_steps=0: must be >= 1"),
        (["--run.skip_spikes", "true", "--run.spike_window", "1000"], "run.spike_window=1000: the spike guard"),
        (
            ["--optim.name", "orthoadam", "--optim.rotation_seed", "10000000000000"],
            "optim.rotation_seed=10000000000000: must be in 0..4294967295",
        ),
        (["--run-dir", "{file}"], "--run-dir {file}: is a file; name a directory"),
        (["--data.path", "{garbage}"], "manifest.json: not valid JSON"),
        (["--data.path", "{list}"], "manifest.json: holds no JSON object (a list)"),
        (
            ["--data.path", "{long_probe}"],
            "its probe set has sequences of 80 tokens, more than the model's 64 positions",
        ),
    ],
)
def test_a_refused_start_creates_no_mlflow_store(args, message, tiny_ds, tmp_path, monkeypatch, capsys):
    """A refused start creates no sqlite MLflow store, and each refusal (a garbage manifest.json,
    max_steps 0, a run dir that is a file) is one line that names what is wrong."""
    import json
    import shutil

    from data_prep.dataset import content_hash

    (tmp_path / "file").write_text("mine")
    for name, text in (("garbage", "\x00\xff garbage"), ("list", "[1, 2]")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_bytes(text.encode("latin-1"))
    long_probe = shutil.copytree(tiny_ds, tmp_path / "long_probe")
    raw = json.loads((long_probe / "manifest.json").read_text())
    raw["probe"]["length"] = 80
    raw["hash"] = content_hash(raw)
    (long_probe / "manifest.json").write_text(json.dumps(raw))
    names = {f"{{{k}}}": str(tmp_path / k) for k in ("file", "garbage", "list", "long_probe")}
    args = [names.get(a, a) for a in args]
    message = message.format(file=tmp_path / "file")
    store = tmp_path / "store"
    rc = fit_in_process([*paths(tiny_ds, tmp_path / "run"), *args], monkeypatch, f"sqlite:///{store}/m.db")
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("sinklab fit:")]
    assert rc == 2 and len(lines) == 1 and message in lines[0] and out == "", err
    assert "Traceback" not in err and "checkpoints already written" not in err
    assert not store.exists() and not (tmp_path / "run").exists() and (tmp_path / "file").read_text() == "mine"
