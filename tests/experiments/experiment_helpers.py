"""Helpers for the experiment tests: small experiment files and runs logged like `sinklab fit`'s."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from pipeline.experiments.configs import check_variant
from pipeline.experiments.spec import Experiment, ExperimentError, experiment_files, load_experiment


def write_experiment(
    directory: Path,
    name: str,
    recipe: Path | str = "configs/recipes/cpu-tiny.yaml",
    variants: str | None = None,
    plot: str = "",
) -> Path:
    """A two-column experiment file (Sink_1 and valid loss) with variants a, b, c."""
    variants = (
        variants
        or """\
      - {name: a, label: "variant a", overrides: {optim.weight_decay: 0.0}, paper: {sink1: 15.2, val_loss: 3.72}}
      - {name: b, label: "variant b", overrides: {optim.weight_decay: 0.5}, paper: {sink1: 41.08}}
      - {name: c, label: "variant c", overrides: {optim.weight_decay: 5.0}, paper_status: training failure}
    """
    )
    text = textwrap.dedent(f"""\
    name: {name}
    title: Test experiment {name}
    paper_ref: "Gu et al. 2025, Table 2"
    scale:
      paper: {{recipe: {recipe}}}
      cpu: {{recipe: {recipe}}}
    cpu_notes: tiny test setup
    columns:
      - {{key: sink1, metric: sink/sink1, label: "Sink_1 (%)"}}
      - {{key: val_loss, metric: val/loss, label: valid loss}}
    {plot}
    variants:
    """) + textwrap.indent(textwrap.dedent(variants), "  ")
    path = directory / f"{name}.yaml"
    path.write_text(text)
    return path


def log_training_run(
    client: MlflowClient,
    experiment: str,
    variant: str,
    scale: str,
    *,
    status: str | None,
    metrics: dict[str, float | list[tuple[int, float]]],
    seed: int = 1234,
) -> str:
    """Log a run as `sinklab fit` does for a sweep: its tags, run name and metric names."""
    exp = client.get_experiment_by_name(f"sinklab/{experiment}")
    exp_id = exp.experiment_id if exp else client.create_experiment(f"sinklab/{experiment}")
    tags = {"sinklab.experiment": f"sinklab/{experiment}", "sinklab.variant": variant, "sinklab.seed": str(seed)}
    if status:
        tags["sinklab.status"] = status
    run = client.create_run(exp_id, run_name=f"{variant} s{seed} ({experiment}/{scale})", tags=tags)
    now = int(time.time() * 1000)
    batch = [
        Metric(name, v, now, step)
        for name, value in metrics.items()
        for step, v in (value if isinstance(value, list) else [(0, value)])
    ]
    client.log_batch(run.info.run_id, metrics=batch)
    if status == "finished":
        client.set_terminated(run.info.run_id, "FINISHED")
    elif status == "failed":
        client.set_terminated(run.info.run_id, "FAILED")
    return run.info.run_id


def micro_recipe(directory: Path, dataset: Path, steps: int = 5) -> Path:
    """A seconds-long `sinklab fit` recipe on the `micro` model shape over `dataset`."""
    path = directory / "micro-recipe.yaml"
    path.write_text(
        textwrap.dedent(f"""\
    seed_everything: 1234
    run: {{name: micro, experiment: sinklab-tests, checkpoint_every: 0, keep_last: 1,
          sink_every: {steps}, plot_every: 0, val_every: {steps}, throughput_window: 1}}
    arch: {{preset: micro}}
    optim: {{lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 1, weight_decay: 0.1}}
    data: {{path: {dataset}, global_batch_tokens: 64, micro_batch_size: 4, val_batches: 1}}
    trainer: {{max_steps: {steps}, accelerator: cpu, devices: 1, precision: 32-true,
              log_every_n_steps: 1, enable_progress_bar: false, enable_model_summary: false}}
    """)
    )
    return path


def load_all() -> list[Experiment]:
    """Every experiment file under configs/experiments, their names distinct."""
    experiments = [load_experiment(p) for p in experiment_files()]
    seen: dict[str, Path] = {}
    for e in experiments:
        if e.name in seen:
            raise ExperimentError(f"{e.path}: experiment name {e.name!r} also used by {seen[e.name]}")
        seen[e.name] = e.path
    return experiments


def check_experiment(experiment: Experiment, scale: str) -> int:
    """Check every variant's config at ``scale``; how many were checked."""
    for variant in experiment.variants:
        check_variant(experiment, variant, scale)
    return len(experiment.variants)
