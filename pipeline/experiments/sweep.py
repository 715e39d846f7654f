"""`sinklab sweep EXPERIMENT`: train every variant of a paper experiment under N seeds (docs/experiments.md, Sweeps).

A finished run (tag sinklab.status=finished) is skipped, so a repeat runs only what is missing, failed or unfinished.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cluster.jobs import JobError
from cluster.submit import JobSpec, submit_array
from pipeline import tracking
from pipeline.experiments.configs import check_variant, seeds, variant_config
from pipeline.experiments.pool import ForkServer, WorkerError, subprocess_runner
from pipeline.experiments.spec import MAX_SEEDS, SCALES, Experiment, ExperimentError, load_experiment
from pipeline.tracking import PARENT_ENV
from sinklab_io.atomic import atomic_write

RESERVED_NAMES = {"slurm", "runs.tsv", "array.sbatch"}
DATA_ENV = "SINKLAB_DATA_PATH"
EMBEDDED_AT_GPU_SCALE = (
    "note: the gpu scale trains on the embedded corpus (about 3.3M tokens; 2,000 steps of 32K tokens "
    "are about 20 epochs), which the model memorises (docs/experiments.md, the gpu scale), so its sink "
    "figures are the paper's insufficient-data regime (Figure 28 left). Give a prepared Pile dataset with "
    f"--data-path DIR or ${DATA_ENV}."
)


@dataclass
class PlannedRun:
    variant: str
    seed: int
    run_dir: Path
    config_path: Path
    state: str  # "pending", "finished", "failed" or "incomplete"
    previous_run_id: str | None = None

    @property
    def name(self) -> str:
        return f"{self.variant} s{self.seed}"

    @property
    def to_run(self) -> bool:
        return self.state != "finished"

    @property
    def log(self) -> Path:
        return self.run_dir / "sweep.log"


def plan(
    experiment: Experiment, scale: str, runs_root: Path, mlflow: Any | None, n_seeds: int | None = None
) -> list[PlannedRun]:
    """One PlannedRun per (variant, seed), its state from MLflow (None: all pending); `n_seeds` overrides the file's."""
    known = tracking.variant_runs(mlflow, experiment.mlflow_experiment, scale) if mlflow else {}
    root = runs_root / experiment.name / scale
    planned = []
    for variant in experiment.variants:
        if variant.name in RESERVED_NAMES:
            raise ExperimentError(f"{experiment.path}: variant name {variant.name!r} is reserved")
        done = tracking.best_runs(known.get(variant.name, []))
        for seed in seeds(experiment, scale, n_seeds):
            best = done.get(seed)
            failed = best is not None and best.status in ("failed", "nonfinite", "killed")
            state = "pending" if best is None else "finished" if best.finished else "failed" if failed else "incomplete"
            run_dir = root / variant.name / f"s{seed}"
            previous = best.run_id if best else None
            planned.append(PlannedRun(variant.name, seed, run_dir, run_dir.with_suffix(".yaml"), state, previous))
    return planned


def fit_command(run: PlannedRun, extra: list[str] = ()) -> list[str]:
    """`sinklab fit` of ``run``, by the `sinklab` entry point of this Python (the same one a user types)."""
    beside = Path(sys.executable).with_name("sinklab")
    sinklab = [str(beside)] if beside.exists() else [sys.executable, "-m", "pipeline.cli"]
    fit = ["fit", "--config", str(run.config_path), "--run-dir", str(run.run_dir), "--resume", "auto"]
    return [*sinklab, *fit, *extra]


def write_configs(experiment: Experiment, scale: str, planned: list[PlannedRun]) -> None:
    for run in planned:
        if run.to_run:
            config = variant_config(experiment, experiment.variant(run.variant), scale, run.seed)
            atomic_write(run.config_path, yaml.safe_dump(config, sort_keys=False))


Runner = Callable[[PlannedRun, list[str]], int]


def run_local(planned: list[PlannedRun], runner: Runner = subprocess_runner, extra: list[str] = ()) -> dict[str, int]:
    """Run every (variant, seed) that has not finished, one after another; exit codes by run name."""
    todo = [r for r in planned if r.to_run]
    codes = {}
    for i, run in enumerate(todo, 1):
        command = fit_command(run, list(extra))
        print(f"[{i}/{len(todo)}] {run.name}: {' '.join(command)}", flush=True)
        start = time.monotonic()
        codes[run.name] = code = runner(run, command)
        verdict = "done" if code == 0 else f"FAILED (exit {code}; see {run.log})"
        print(f"[{i}/{len(todo)}] {run.name}: {verdict} in {time.monotonic() - start:.0f} s", flush=True)
        if code != 0 and run.log.exists():
            with open(run.log, errors="replace") as f:
                print("".join("    | " + line for line in deque(f, maxlen=6)), end="")
    return codes


def submit(
    experiment: Experiment, todo: list[PlannedRun], args: argparse.Namespace, extra: list[str], parent: str
) -> str:
    """Submit the runs ``todo`` as one SLURM job array, one task each, into the sweep's directory; return its id."""
    spec = JobSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        time=args.time or os.environ.get("SINKLAB_TIME"),
        job_name=f"sweep-{experiment.name}-{args.scale}",
        fit_args=list(extra),
    )
    if os.environ.get("MLFLOW_TRACKING_URI"):
        spec.environment["MLFLOW_TRACKING_URI"] = os.environ["MLFLOW_TRACKING_URI"]
    spec.environment[PARENT_ENV] = parent
    tasks = [(r.config_path, r.run_dir) for r in todo]
    return submit_array(tasks, args.runs_root / experiment.name / args.scale, spec, max_parallel=args.max_parallel)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def format_plan(experiment: Experiment, scale: str, planned: list[PlannedRun]) -> str:
    lines = [
        f"{experiment.name} ({experiment.paper_ref}), scale {scale}: {plural(len(experiment.variants), 'variant')} x "
        f"{plural(len({r.seed for r in planned}), 'seed')} -> MLflow experiment {experiment.mlflow_experiment}"
    ]
    for run in planned:
        action = {
            "finished": "skip (finished)",
            "pending": "run",
            "failed": "run again (failed before)",
            "incomplete": "resume (unfinished before)",
        }[run.state]
        previous = f"  [mlflow run {run.previous_run_id}]" if run.previous_run_id else ""
        lines.append(f"  {run.name:<30} {action:<28} {run.run_dir}{previous}")
    failed = [r.name for r in planned if r.state == "failed"]
    if failed:
        lines.append(f"failed before: {', '.join(failed)}")
    return "\n".join(lines)


def seed_count(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"{text!r}: give how many seeds per variant, a whole number in 1..{MAX_SEEDS}")
    return int(text)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    cut = argv.index("--") if "--" in argv else len(argv)
    argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="sinklab sweep",
        description="Train every variant of a paper experiment (configs/experiments/**/<EXPERIMENT>.yaml) "
        "under N seeds.",
        epilog="Arguments after `--` go to every `sinklab fit` (e.g. -- --trainer.max_steps 5).",
    )
    parser.add_argument("experiment", help="experiment name (file stem) or path to its YAML")
    parser.add_argument("--scale", choices=SCALES, default="cpu")
    parser.add_argument(
        "--seeds",
        type=seed_count,
        help="seeds per variant (default: the file's scale.<scale>.seeds, else 1): the recipe's "
        "seed_everything and the next N-1, for the initialisation and the data order",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--local", action="store_true", help="run here, one after another, forked from one warm worker (default)"
    )
    mode.add_argument("--submit", action="store_true", help="submit one SLURM job array")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and commands, run nothing")
    parser.add_argument("--variants", help="comma-separated subset of variants to consider")
    parser.add_argument("--runs-root", type=Path, default=Path("runs"))
    parser.add_argument(
        "--data-path",
        type=Path,
        default=os.environ.get(DATA_ENV) or None,
        help=f"a prepared dataset for every variant instead of the recipe's (default ${DATA_ENV}); "
        "at the gpu scale, a Pile subset packed at C = 512",
    )
    parser.add_argument(
        "--no-check", action="store_true", help="skip parsing each variant's config with `sinklab fit`'s parser first"
    )
    parser.add_argument("--nodes", type=int, default=1, help="(--submit) nodes per variant")
    parser.add_argument("--gpus-per-node", type=int, default=1, help="(--submit) GPUs per node")
    parser.add_argument("--time", help="(--submit) time limit per array task")
    parser.add_argument("--max-parallel", type=int, help="(--submit) array tasks running at once")
    return parser.parse_args(argv), extra


def main(argv: list[str] | None = None, runner: Runner | None = None) -> int:
    args, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        experiment = load_experiment(args.experiment)
        if args.variants is not None:
            wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
            if not wanted:  # an empty list planned every variant
                raise ExperimentError(
                    f"--variants {args.variants!r}: names no variant; give some of "
                    f"{', '.join(v.name for v in experiment.variants)}, or leave --variants out for all"
                )
            kept = {experiment.variant(name).name for name in wanted}  # raises with the list of known variants
            experiment = dataclasses.replace(experiment, variants=[v for v in experiment.variants if v.name in kept])
        experiment.setup(args.scale)  # refuses a scale the file does not have
        if args.data_path is None and args.scale == "gpu":
            print(EMBEDDED_AT_GPU_SCALE, file=sys.stderr)
        if args.data_path is not None and not (args.data_path / "manifest.json").is_file():
            raise ExperimentError(
                f"--data-path {args.data_path}: no manifest.json there; prepare it with `sinklab prep`"
            )
        extra = (["--data.path", str(args.data_path)] if args.data_path else []) + extra  # for every `sinklab fit`
        mlflow = tracking.client()
        planned = plan(experiment, args.scale, args.runs_root, mlflow, args.seeds)
        todo = [r for r in planned if r.to_run]
        if todo and not args.no_check:  # with `sinklab fit`'s parser, before the plan: a refusal is one line
            for run in todo:
                check_variant(experiment, experiment.variant(run.variant), args.scale, run.seed, extra)
        print(format_plan(experiment, args.scale, planned))
        if todo and not args.no_check:
            print(f"checked {len(todo)} configs with the `sinklab fit` parser")
        if args.dry_run:
            for run in todo:
                print("  $ " + " ".join(fit_command(run, extra)))
            return 0
        if not todo:
            print("nothing to run: every variant and seed has finished")
            return 0
        write_configs(experiment, args.scale, planned)
        parent = tracking.parent_run(mlflow, experiment, args.scale)
        print(f"MLflow parent run {parent} ({experiment.name}/{args.scale})")
        if args.submit:
            job_id = submit(experiment, todo, args, extra, parent)
            print(
                f"submitted job array {job_id} with {len(todo)} tasks; logs in "
                f"{args.runs_root / experiment.name / args.scale / 'slurm'}"
            )
            return 0
        os.environ[PARENT_ENV] = parent  # each `sinklab fit` tags its run as a child of it, until the sweep ends
        pool = ForkServer()  # started on its first run only
        try:
            codes = run_local(planned, runner=runner or pool, extra=extra)
        finally:
            pool.close()
            os.environ.pop(PARENT_ENV, None)
        mlflow.set_terminated(parent, "FINISHED" if all(c == 0 for c in codes.values()) else "FAILED")
    except (WorkerError, ExperimentError, JobError) as error:
        print(f"sinklab sweep: {error}", file=sys.stderr)
        return 1 if isinstance(error, WorkerError) else 2
    failed = [name for name, code in codes.items() if code != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
