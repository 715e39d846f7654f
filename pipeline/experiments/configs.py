"""One training config per variant: the scale's recipe with the variant's overrides applied.

A sweep writes each variant's config as a plain YAML file beside its run directory, so a
local run and a SLURM array task start the same `sinklab fit --config FILE` (the array API
takes one config per task). Overrides are dotted paths as on the `sinklab fit` command line
(`arch.attention.op`); where the recipe holds a `class_path`/`init_args` pair the path
goes through `init_args`, as jsonargparse's own command line does.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from pipeline.experiments.spec import REPO, Experiment, ExperimentError, Variant
from pipeline.model.config import ConfigError
from pipeline.model.config_keys import renamed_config, renamed_keys
from sinklab_io.atomic import atomic_write


def load_recipe(experiment: Experiment, scale: str) -> dict[str, Any]:
    path = REPO / experiment.setup(scale).recipe
    if not path.is_file():
        raise ExperimentError(f"{experiment.path}: scale.{scale}.recipe: no such file {path}")
    try:
        recipe = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ExperimentError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(recipe, dict):
        raise ExperimentError(f"{path}: a recipe must be a YAML mapping")
    try:
        return renamed_config(recipe, str(path))
    except ConfigError as err:
        raise ExperimentError(str(err)) from None


def set_dotted(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in nested dicts, stepping through `init_args` where the recipe has one."""
    node = config
    parts = dotted.split(".")
    for part in parts[:-1]:
        if part not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ExperimentError(f"override {dotted}: {part!r} holds a value, not a section")
        node = child
    last = parts[-1]
    if last not in node and isinstance(node.get("init_args"), dict):
        node = node["init_args"]
    node[last] = copy.deepcopy(value)


def run_name(experiment: Experiment, variant: Variant, scale: str) -> str:
    """The MLflow run name of a variant, the variant first so that the UI's legends, which cut long
    names, still tell variants apart: ``wd-0.5 (weight-decay/cpu)``; `runs.run_scale` reads the
    scale back from it."""
    return f"{variant.name} ({experiment.name}/{scale})"


def identity(experiment: Experiment, variant: Variant, scale: str) -> dict[str, Any]:
    """`run` settings of `sinklab fit` that tie a run to its experiment, variant and scale:
    the MLflow experiment, the sinklab.variant tag and the run name."""
    return {
        "run.experiment": experiment.mlflow_experiment,
        "run.variant": variant.name,
        "run.name": run_name(experiment, variant, scale),
    }


def variant_config(experiment: Experiment, variant: Variant, scale: str) -> dict[str, Any]:
    config = load_recipe(experiment, scale)
    overrides = renamed_keys(experiment.overrides(variant, scale), str(experiment.path))
    settings = {**overrides, **identity(experiment, variant, scale)}
    try:
        for key, value in settings.items():
            set_dotted(config, key, value)
    except ExperimentError as err:
        recipe = experiment.setup(scale).recipe
        raise ExperimentError(
            f"{experiment.path}: variant {variant.name!r} at scale {scale} (recipe {recipe}): {err}"
        ) from None
    return config


def write_config(config: dict[str, Any], path: Path) -> Path:
    return atomic_write(path, yaml.safe_dump(config, sort_keys=False))
