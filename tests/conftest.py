"""Fixtures shared by every part's tests. Each part keeps its own in tests/<part>/conftest.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from filelock import FileLock
from packed_datasets import make_dataset

# Two xdist workers share two cores: one thread each, and in every process a test starts
# (Lightning gives each rank of a multi-process run one thread already).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Without a GPU, pipeline.kernels.triton_tiles runs its kernels under Triton's interpreter (on
# CPU tensors); the variable must be set before the module is first imported.
if not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SHARED = "SINKLAB_TEST_SHARED"  # a folder every xdist worker of this run sees


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        os.environ[SHARED] = tempfile.mkdtemp(prefix="sinklab-tests-")


# The longest files start first, so the two xdist workers end together; `make test` keeps this
# order (--no-loadscope-reorder: xdist would otherwise order files by their number of tests).
LONGEST_FIRST = [
    "train/test_deepspeed.py",
    "train/test_fsdp2.py",
    "train/test_exact_resume.py",
    "analysis/test_analyze.py",
    "cluster/test_cluster_slurm.py",
    "guides/test_cluster_guide.py",
    "guides/test_pretrained_guide.py",
    "train/test_gpu_check.py",
    "analysis/test_survey.py",
    "train/test_errors.py",
    "train/test_fit.py",
    "tracking/test_mlflow_ui.py",
    "guides/test_compare_guide.py",
    "experiments/test_end_to_end.py",
]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(REPO / "tests").as_posix(), len(rank)))


def pytest_unconfigure(config):
    if hasattr(config, "workerinput") or SHARED not in os.environ:
        return
    shared = Path(os.environ.pop(SHARED))
    server = shared / "mlflow-server.json"
    if server.exists():
        _stop_group(json.loads(server.read_text())["pgid"])
    shutil.rmtree(shared, ignore_errors=True)


def _stop_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.time() + 20
        while time.time() < deadline:
            os.killpg(pgid, 0)
            time.sleep(0.2)
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _start_mlflow_server(root: Path) -> tuple[int, str]:
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += ["--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--artifacts-destination", str(root / "artifacts")]
    root.mkdir()
    log_path = root / "server.log"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job workers: tests run no jobs
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True, env=env)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                if r.status == 200:
                    return proc.pid, uri
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            _stop_group(proc.pid)
            raise RuntimeError(f"MLflow server did not start; see {log_path}:\n" + log_path.read_text()[-3000:])
        time.sleep(0.5)


@pytest.fixture(scope="session")
def mlflow_server():
    """A real MLflow tracking server over HTTP on loopback, started once per test run and shared by
    its xdist workers; stopped when the run ends."""
    shared = Path(os.environ[SHARED])
    with FileLock(shared / "mlflow-server.lock"):
        info = shared / "mlflow-server.json"
        if not info.exists():
            pgid, uri = _start_mlflow_server(shared / "mlflow-server")
            info.write_text(json.dumps({"pgid": pgid, "uri": uri}))
        return json.loads(info.read_text())["uri"]


@pytest.fixture(scope="session")
def slurm():
    """A running two-node SLURM on this machine (tests/cluster/slurm_cluster.py), shared by the cluster
    and guide tests of a worker; skipped (with the reason) where it cannot run."""
    sys.path.insert(0, str(REPO / "tests" / "cluster"))
    from slurm_cluster import ensure_installed, running_cluster

    if os.geteuid() != 0:
        pytest.skip("starting SLURM daemons (slurmctld, slurmd, munged) needs root")
    why_not = ensure_installed()
    if why_not:
        pytest.skip(why_not)
    with pytest.MonkeyPatch.context() as patch, running_cluster(patch) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def tiny_ds(tmp_path_factory) -> Path:
    """The packed dataset `sinklab fit`'s tests train on (tests/fit_runs.py)."""
    return make_dataset(tmp_path_factory.mktemp("ds") / "tiny")


@pytest.fixture(scope="session")
def load_benchmark():
    """``load_benchmark("bench_gpu")``: a script of benchmarks/ as a module (they are not a package), with
    benchmarks/ on sys.path as when the script runs, for its ``side_by_side`` import."""
    import importlib.util

    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def hf_tokenizer():
    """A 300-token BPE trained on Hamlet, as a transformers fast tokenizer."""
    from analysis_helpers import HAMLET
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pipeline.analysis.inputs import read_text

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([read_text(HAMLET)[:60000]], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>")


def _save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, hf_tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(hf_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return _save(LlamaForCausalLM(cfg), hf_tokenizer, tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory, hf_tokenizer):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(hf_tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # a distinctive p_1 so that position edits visibly move attention
        model.transformer.wpe.weight[0] *= 20.0
    return _save(model, hf_tokenizer, tmp_path_factory.mktemp("tiny_gpt2"))
