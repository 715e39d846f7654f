"""Render SLURM batch scripts for training jobs and job arrays from `cluster/train.sbatch` (docs/cluster.md)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sinklab_io.atomic import atomic_write

TEMPLATE = Path(__file__).with_name("train.sbatch")

# set by the job script to match the allocation, so never passed as extra fit arguments
RESERVED_FIT_ARGS = ("--trainer.num_nodes", "--trainer.devices", "--run-dir", "--resume", "--config")

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


class JobError(ValueError):
    """A job description that cannot be turned into a valid batch script."""


class _Template(string.Template):
    delimiter = "@"


def sinklab_argv() -> list[str]:
    """The `sinklab` of the Python that renders the job (the same environment runs the job)."""
    beside = Path(sys.executable).with_name("sinklab")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("sinklab")
    return [found] if found else [sys.executable, "-m", "pipeline.cli"]


def sinklab_command() -> str:
    """The command a job runs sinklab with: SINKLAB_COMMAND, else `sinklab_argv`."""
    return os.environ.get("SINKLAB_COMMAND") or shlex.join(sinklab_argv())


def time_limit_seconds(text: str) -> int:
    """Seconds in a SLURM time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    match = _TIME.match(text.strip())
    if not match:
        raise JobError(f"--time {text!r}: expected minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]")
    days, *parts = match.groups()
    numbers = [int(p) for p in parts if p is not None]
    units = (3600, 60, 1) if days is not None or len(numbers) == 3 else (60, 1)  # hours lead after a day
    return int(days or 0) * 86400 + sum(n * u for n, u in zip(numbers, units))


@dataclass
class JobSpec:
    """Resources and site settings of one job (or of every task of an array)."""

    nodes: int = 1
    gpus_per_node: int = 1
    tasks_per_node: int = 1  # used only when gpus_per_node == 0 (CPU jobs)
    cpus_per_task: int = 8
    time: str | None = field(default_factory=lambda: os.environ.get("SINKLAB_TIME"))
    partition: str | None = field(default_factory=lambda: os.environ.get("SINKLAB_PARTITION"))
    account: str | None = field(default_factory=lambda: os.environ.get("SINKLAB_ACCOUNT"))
    qos: str | None = field(default_factory=lambda: os.environ.get("SINKLAB_QOS"))
    mem: str | None = None
    signal_seconds: int = 180
    setup: str = field(default_factory=lambda: os.environ.get("SINKLAB_SETUP", ""))
    job_name: str = "sinklab"
    sbatch_options: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    sinklab: str | None = None  # None: `sinklab_command()` when rendered
    fit_args: list[str] = field(default_factory=list)

    @property
    def devices(self) -> int:
        return self.gpus_per_node if self.gpus_per_node > 0 else self.tasks_per_node

    def validate(self) -> None:
        for name in ("nodes", "cpus_per_task", "signal_seconds"):
            if getattr(self, name) < 1:
                raise JobError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.gpus_per_node < 0:
            raise JobError(f"--gpus-per-node must be 0 (CPU job) or more, got {self.gpus_per_node}")
        if self.gpus_per_node == 0 and self.tasks_per_node < 1:
            raise JobError(f"--tasks-per-node must be at least 1, got {self.tasks_per_node}")
        if self.time is not None and time_limit_seconds(self.time) <= self.signal_seconds:
            raise JobError(f"--signal-seconds {self.signal_seconds} must be shorter than --time {self.time}")
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", self.job_name):
            raise JobError(f"job name {self.job_name!r}: use letters, digits and _.+- only")
        for arg in self.fit_args:
            if arg.split("=", 1)[0] in RESERVED_FIT_ARGS:
                raise JobError(
                    f"fit argument {arg!r} is set by the job script; use the submit "
                    "options (--nodes, --gpus-per-node, --tasks-per-node, --run-dir)"
                )
        for option in self.sbatch_options:
            if not option.startswith("--"):
                raise JobError(f"sbatch option {option!r} must look like --name=value")

    def fit_overrides(self) -> list[str]:
        overrides = ["--trainer.num_nodes", str(self.nodes), "--trainer.devices", str(self.devices)]
        if self.gpus_per_node == 0:
            overrides += ["--trainer.accelerator", "cpu"]
        return overrides + list(self.fit_args)

    def resource_lines(self) -> list[str]:
        options = [f"--gpus-per-node={self.gpus_per_node}"] if self.gpus_per_node > 0 else []
        settings = {name: getattr(self, name) for name in ("time", "partition", "account", "qos", "mem")}
        options += [f"--{name}={value}" for name, value in settings.items() if value]
        return [f"#SBATCH {option}" for option in options + self.sbatch_options]


def check_path(path: Path, what: str) -> Path:
    """Absolute form of a path that will appear in #SBATCH lines (which cannot quote spaces)."""
    path = Path(path).expanduser().absolute()
    if re.search(r"\s", str(path)):
        raise JobError(f"{what} {str(path)!r} contains whitespace, which #SBATCH lines cannot hold")
    return path


def _render(spec: JobSpec, *, log_file: str, select_run: list[str], array_line: str = "") -> str:
    spec.validate()
    values = {
        **{name: getattr(spec, name) for name in ("job_name", "nodes", "cpus_per_task")},
        "tasks_per_node": spec.devices,
        "resource_lines": "\n".join(spec.resource_lines()),
        "log_file": log_file,
        "signal": f"USR1@{spec.signal_seconds}",
        "array_line": array_line,
        "setup": spec.setup.strip(),
        "select_run": "\n".join(select_run),
        "environment": "\n".join(f"export {key}={shlex.quote(value)}" for key, value in spec.environment.items()),
        "sinklab": spec.sinklab or sinklab_command(),
        "fit_overrides": shlex.join(spec.fit_overrides()),
    }
    rendered = [(line, _Template(line).substitute(values)) for line in TEMPLATE.read_text().splitlines()]
    return "".join(f"{text}\n" for line, text in rendered if text.strip() or not line.strip().startswith("@{"))


def render_job(config: str | Path, run_dir: str | Path, spec: JobSpec) -> str:
    """The batch script of one training run; its log goes to `<run_dir>/slurm/<jobid>.out`."""
    config, run_dir = check_path(config, "config"), check_path(run_dir, "run directory")
    select = [f"CONFIG={shlex.quote(str(config))}", f"RUN_DIR={shlex.quote(str(run_dir))}"]
    return _render(spec, log_file=f"{run_dir}/slurm/%j.out", select_run=select)


def render_array(
    list_file: str | Path, n_tasks: int, log_dir: str | Path, spec: JobSpec, max_parallel: int | None = None
) -> str:
    """The batch script of a job array: task i trains line i+1 (`CONFIG<TAB>RUN_DIR`) of `list_file`."""
    if n_tasks < 1:
        raise JobError("a job array needs at least one config")
    list_file, log_dir = check_path(list_file, "run list"), check_path(log_dir, "log directory")
    select = [
        f"RUN_LIST={shlex.quote(str(list_file))}",
        'IFS=$\'\\t\' read -r CONFIG RUN_DIR < <(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$RUN_LIST")',
    ]
    array_line = f"#SBATCH --array=0-{n_tasks - 1}" + (f"%{max_parallel}" if max_parallel else "")
    return _render(spec, log_file=f"{log_dir}/%A_%a.out", select_run=select, array_line=array_line)


def write_run_list(runs: list[tuple[str | Path, str | Path]], list_file: str | Path) -> Path:
    """Write `CONFIG<TAB>RUN_DIR` lines (absolute paths) for `render_array`; the caller checks the configs."""
    lines = [f"{check_path(config, 'config')}\t{check_path(run_dir, 'run directory')}" for config, run_dir in runs]
    return atomic_write(list_file, "\n".join(lines) + "\n")
