"""Jobs on a real SLURM: a two-node DeepSpeed job requeued on SIGUSR1 with an exact resume.

The jobs are rendered and submitted by `cluster.submit` exactly as `sinklab submit` does it and
run the real `sinklab fit` on the tiny CPU recipe (configs/recipes/cpu-tiny.yaml) under
DeepSpeed ZeRO-2 (selected as paper-60m.yaml selects it) over the training tests' synthetic
packed dataset, two gloo processes per job: the path of a multi-node GPU job, on CPUs.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient
from packed_datasets import make_dataset

from cluster.submit import JobSpec, submit_array, submit_job

REPO = Path(__file__).resolve().parents[2]
CPU_RECIPE = REPO / "configs" / "recipes" / "cpu-tiny.yaml"
EXPERIMENT = "sinklab-tests"  # run.experiment of the CPU recipe
ZERO2 = [
    "--trainer.strategy",
    "pipeline.train.sharding.DeepSpeedStrategy",
    "--trainer.strategy.config",
    str(REPO / "configs" / "deepspeed" / "zero2.json"),
]


def fit_args(tmp_path: Path, max_steps: int, strategy: list[str]) -> list[str]:
    data = tmp_path / "data"
    if not (data / "manifest.json").exists():
        make_dataset(data)
    return ["--trainer.max_steps", str(max_steps), "--data.path", str(data), *strategy]


def cpu_job(mlflow_server, tmp_path, *, nodes: int, tasks: int, max_steps: int, strategy: list[str] = ()) -> JobSpec:
    # Jobs starting together would race to create the experiment; here it exists beforehand.
    client = MlflowClient(mlflow_server)
    if client.get_experiment_by_name(EXPERIMENT) is None:
        client.create_experiment(EXPERIMENT)
    return JobSpec(
        nodes=nodes,
        gpus_per_node=0,
        tasks_per_node=tasks,
        cpus_per_task=1,
        partition=None,
        account=None,
        qos=None,
        setup="",
        sinklab=f"{shlex.quote(sys.executable)} -m pipeline.cli",
        fit_args=fit_args(tmp_path, max_steps, list(strategy)),
        environment={"MLFLOW_TRACKING_URI": mlflow_server, "OMP_NUM_THREADS": "1"},
    )


def loss_history(mlflow_server: str, run_dir: Path) -> list[tuple[int, float]]:
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    history = MlflowClient(mlflow_server).get_metric_history(run_id, "train/loss")
    return sorted((m.step, m.value) for m in history)


def log_path(run_dir: Path, job_id: str) -> Path:
    return run_dir / "slurm" / f"{job_id}.out"


def job_log(run_dir: Path, job_id: str) -> str:
    path = log_path(run_dir, job_id)
    return path.read_text() if path.exists() else "(no log)"


def finished(slurm, job_id: str, run_dir: Path) -> str:
    """The job's final state; on a timeout, fail with the tail of its log."""
    try:
        return slurm.wait_for(job_id, {"COMPLETED", "FAILED", "CANCELLED"})
    except TimeoutError as error:
        raise AssertionError(f"{error}; log:\n{job_log(run_dir, job_id)[-4000:]}") from None


def wait_for_checkpoint(run_dir: Path, slurm, job_id: str, timeout: float = 300) -> None:
    """Wait until training is under way: its first periodic checkpoint exists."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if list((run_dir / "checkpoints").glob("*.ckpt")):
            return
        state, _ = slurm.job_state(job_id)
        if state not in ("PENDING", "RUNNING", "CONFIGURING"):
            break
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} wrote no checkpoint:\n{job_log(run_dir, job_id)[-4000:]}")


def test_two_node_deepspeed_job_requeues_on_usr1_and_resumes_exactly(slurm, mlflow_server, tmp_path):
    """Job A, DeepSpeed ZeRO-2 on 2 nodes x 1 process, gets SIGUSR1 mid-run, requeues, resumes
    and finishes. Job B, the uninterrupted reference, runs the same on 1 node x 2 processes:
    the same world size, so the same losses."""
    max_steps = 24
    two_nodes = cpu_job(mlflow_server, tmp_path, nodes=2, tasks=1, max_steps=max_steps, strategy=ZERO2)
    one_node = cpu_job(mlflow_server, tmp_path, nodes=1, tasks=2, max_steps=max_steps, strategy=ZERO2)
    run_dir, ref_dir = tmp_path / "two-nodes", tmp_path / "reference"
    job = submit_job(CPU_RECIPE, run_dir, two_nodes)
    ref_job = submit_job(CPU_RECIPE, ref_dir, one_node)

    wait_for_checkpoint(run_dir, slurm, job)
    slurm.run("scancel", "--signal=USR1", job)  # what SLURM sends at --signal=USR1@<s>
    # The rerun has started (waiting starts the requeued job at once instead of after its ~2 min
    # BeginTime hold); only then can a final state be the rerun's.
    try:
        slurm.wait_for_output(job, "restart 1 on", log_path(run_dir, job))
    except TimeoutError as error:
        raise AssertionError(f"{error}; log:\n{job_log(run_dir, job)[-4000:]}") from None
    assert finished(slurm, job, run_dir) == "COMPLETED", job_log(run_dir, job)
    assert finished(slurm, ref_job, ref_dir) == "COMPLETED", job_log(ref_dir, ref_job)

    # The two-node job: one DeepSpeed process group across both nodes; its checkpoints are
    # DeepSpeed directories with a ZeRO partition per rank.
    log = job_log(run_dir, job)
    for rank in (0, 1):
        assert f"initializing deepspeed distributed: GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2" in log, log[-4000:]
    # every rank leaves the process group before it exits: none aborts at the interpreter's shutdown
    assert "terminate called" not in log and "Aborted" not in log, log[-4000:]
    shown = slurm.run("scontrol", "show", "job", job).stdout
    assert "NumNodes=2" in shown and "NodeList=n[1-2]" in shown, shown
    final = run_dir / "checkpoints" / f"step-{max_steps:06d}.ckpt" / "checkpoint"
    assert len(list(final.glob("zero_pp_rank_*_optim_states.pt"))) == 2

    # The interrupted job ran twice under one job id and the rerun restored a checkpoint.
    assert re.search(r"Restarts=1\b", slurm.run("scontrol", "show", "job", job).stdout), log[-4000:]
    first, rerun = log.split("restart 1 on", 1)  # one log per job id, appended across restarts
    assert "restart 0 on" in first and "Restored all states from the checkpoint" in rerun, log[-4000:]

    # One MLflow run, every step once, and the uninterrupted run's losses bit for bit.
    reference, resumed = loss_history(mlflow_server, ref_dir), loss_history(mlflow_server, run_dir)
    steps = [step for step, _ in resumed]
    assert steps == list(range(steps[0], steps[0] + len(steps))), f"gaps or repeated steps: {steps}"
    assert steps == [step for step, _ in reference] and len(steps) >= max_steps - 1, steps
    assert [v for _, v in resumed] == [v for _, v in reference]


def test_array_job_runs_one_config_per_task(slurm, tmp_path):
    """SLURM accepts the array script; task i runs the i-th config in its own run directory."""
    configs = []
    for name in ("lr-a", "lr-b"):
        configs.append(tmp_path / f"{name}.yaml")
        configs[-1].write_text("trainer: {}\n")
    runs = [(c, tmp_path / "runs" / c.stem) for c in configs]
    spec = JobSpec(
        gpus_per_node=0,
        tasks_per_node=1,
        cpus_per_task=1,
        partition=None,
        account=None,
        qos=None,
        setup="",
        sinklab="echo sinklab",
    )  # print the command instead of training
    job = submit_array(runs, tmp_path / "sweep", spec)
    for task, (config, run_dir) in enumerate(runs):
        assert slurm.wait_for(f"{job}_{task}", {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
        log = (tmp_path / "sweep" / "slurm" / f"{job}_{task}.out").read_text()
        assert f"sinklab fit --config {config} --run-dir {run_dir} --resume auto" in log, log
