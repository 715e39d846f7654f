"""`sinklab submit`: render a SLURM batch script for a training config and submit it (docs/cluster.md)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from cluster.jobs import JobError, JobSpec, check_path, render_array, render_job, sinklab_argv, write_run_list
from sinklab_io.atomic import atomic_write
from sinklab_io.mappings import settings_of

_LIGHTNING_CKPT_SCAN = re.compile(r"^hpc_ckpt_\d+\.ckpt$")


def load_config(config: str | Path) -> tuple[Path, dict]:
    """The config as an absolute path and its settings, after checking that it is a readable YAML mapping."""
    path = check_path(config, "config")
    if not path.is_file():
        raise JobError(f"config {config}: no such file")
    try:
        content = yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        raise JobError(f"config {config}, line {mark.line + 1}: not valid YAML ({error.problem})") from None
    if not isinstance(content, dict):
        raise JobError(f"config {config}: expected a YAML mapping of settings, got {type(content).__name__}")
    return path, content


def check_with_fit(config: Path, fit_args: list[str]) -> None:
    """`sinklab fit --check-only` on the config and the arguments after `--`, as a command (docs/contracts.md)."""
    command = [*sinklab_argv(), "fit", "--check-only", "--config", str(config), *fit_args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:  # fit's refusal is its last line that starts "sinklab fit: "
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        said = [line for line in lines if line.startswith("sinklab fit: ")] or lines
        raise JobError(f"config {config}: `sinklab fit` rejects it: {said[-1].removeprefix('sinklab fit: ')}")


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run directory that would break Lightning's requeue scan of ``ckpt_`` names (docs/cluster.md)."""
    names = [p.name for p in run_dir.iterdir()] if run_dir.is_dir() else []
    stray = sorted(name for name in names if "ckpt_" in name and not _LIGHTNING_CKPT_SCAN.match(name))
    if stray:
        raise JobError(
            f"run directory {run_dir} holds {', '.join(stray)}: Lightning numbers its "
            "requeue checkpoints by every name containing 'ckpt_' there; move these away"
        )


def sbatch(script: Path) -> str:
    try:
        done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    except FileNotFoundError:
        raise JobError(
            "sbatch not found: run `sinklab submit` on a SLURM login node (or use --dry-run to only print the script)"
        ) from None
    if done.returncode != 0:
        raise JobError(f"sbatch {script} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def submit_job(config: str | Path, run_dir: str | Path, spec: JobSpec) -> str:
    """Write `<run_dir>/slurm/train.sbatch`, submit it and return the SLURM job id."""
    config, run_dir = load_config(config)[0], check_path(run_dir, "run directory")
    check_run_dir(run_dir)
    script = render_job(config, run_dir, spec)
    return sbatch(atomic_write(run_dir / "slurm" / "train.sbatch", script))


def submit_array(
    runs: list[tuple[str | Path, str | Path]], sweep_dir: str | Path, spec: JobSpec, max_parallel: int | None = None
) -> str:
    """Submit one array job whose task i trains `runs[i] = (config, run_dir)`; return its id."""
    sweep_dir = check_path(sweep_dir, "sweep directory")
    for config, run_dir in runs:
        load_config(config)
        check_run_dir(check_path(run_dir, "run directory"))
    list_file = write_run_list(runs, sweep_dir / "runs.tsv")
    (sweep_dir / "slurm").mkdir(parents=True, exist_ok=True)
    script = render_array(list_file, len(runs), sweep_dir / "slurm", spec, max_parallel)
    return sbatch(atomic_write(sweep_dir / "array.sbatch", script))


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    fit_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, fit_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="sinklab submit",
        description="Render and submit a SLURM job that runs `sinklab fit`.",
        epilog="Arguments after `--` are passed to `sinklab fit` (e.g. -- --trainer.max_steps 1000). "
        "Defaults for --partition/--account/--qos/--time/--setup come from SINKLAB_PARTITION, "
        "SINKLAB_ACCOUNT, SINKLAB_QOS, SINKLAB_TIME and SINKLAB_SETUP.",
    )
    parser.add_argument("config", nargs="?", help="training recipe YAML (as for `sinklab fit --config`)")
    parser.add_argument(
        "--check-run-dir",
        metavar="DIR",
        help="only check that Lightning's requeue scan can "
        "read DIR (the job script runs this at every start); submits nothing",
    )
    parser.add_argument("--run-dir", help="run directory (default: runs/<run.name of the config>)")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--gpus-per-node", type=int, help="0 for a CPU job")
    parser.add_argument("--tasks-per-node", type=int, help="processes per node of a CPU job")
    parser.add_argument("--cpus-per-task", type=int)
    parser.add_argument("--mem", help="memory per node, e.g. 200G")
    parser.add_argument("--time", help="time limit, e.g. 2-00:00:00")
    for site in ("--partition", "--account", "--qos"):
        parser.add_argument(site)
    parser.add_argument(
        "--setup", help="shell lines run before training, e.g. 'module load cuda; source venv/bin/activate'"
    )
    parser.add_argument(
        "--signal-seconds", type=int, help="send SIGUSR1 this many seconds before the time limit (checkpoint + requeue)"
    )
    parser.add_argument("--job-name", help="default: the run name")
    parser.add_argument(
        "--sbatch-option",
        action="append",
        default=[],
        metavar="--NAME=VALUE",
        help="extra #SBATCH line, e.g. --sbatch-option=--constraint=a100 (repeatable)",
    )
    parser.add_argument(
        "--sinklab",
        help="command that runs sinklab inside the job (default: SINKLAB_COMMAND or the sinklab of this Python)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    parser.set_defaults(**vars(JobSpec(job_name=None)))  # the job's defaults, site settings included, are JobSpec's
    return parser.parse_args(argv), fit_args


def main(argv: list[str] | None = None) -> int:
    args, fit_args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.check_run_dir:
            check_run_dir(Path(args.check_run_dir))
            return 0
        if not args.config:
            raise JobError("give the training recipe YAML to submit (or --check-run-dir DIR)")
        config, settings = load_config(args.config)
        run = settings.get("run")  # the run's name as `sinklab fit` derives it: run.name, else the file name
        name = str(run["name"]) if isinstance(run, dict) and run.get("name") else config.stem
        run_dir = check_path(args.run_dir or Path("runs") / name, "run directory")
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        spec = settings_of(
            JobSpec,
            args,
            job_name=args.job_name or re.sub(r"[^\w.+-]", "_", name),
            sbatch_options=args.sbatch_option,
            fit_args=fit_args,
            environment={"MLFLOW_TRACKING_URI": uri} if uri else {},
        )
        spec.validate()
        check_with_fit(config, spec.fit_overrides())  # the exact arguments the job passes to fit
        check_run_dir(run_dir)  # --dry-run refuses what the real submit refuses
        if args.dry_run:
            print(render_job(config, run_dir, spec), end="")
            return 0
        job_id = submit_job(config, run_dir, spec)
    except JobError as error:
        print(f"sinklab submit: {error}", file=sys.stderr)
        return 2
    print(f"Submitted job {job_id}: {run_dir}/slurm/train.sbatch, log {run_dir}/slurm/{job_id}.out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
