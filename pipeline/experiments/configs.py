"""One training config per (variant, seed): the scale's recipe with the variant's dotted overrides applied, checked
with `sinklab fit`'s own parser and ModelConfig's validation (instantiating nothing)."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from pipeline.experiments.spec import REPO, Experiment, ExperimentError, Variant
from pipeline.model.config import ConfigError, refuse_old_layout

DEFAULT_SEED = 1234  # `sinklab fit`'s seed_everything where a recipe gives none


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
        refuse_old_layout(recipe, str(path))
    except ConfigError as err:
        raise ExperimentError(str(err)) from None
    return recipe


def set_dotted(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in nested dicts, stepping through `init_args` where the recipe has one."""

    def holder(node: dict, part: str) -> dict:  # its init_args where the section has them but not part
        return node["init_args"] if part not in node and isinstance(node.get("init_args"), dict) else node

    node = config
    *sections, last = dotted.split(".")
    for part in sections:
        node = holder(node, part)
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ExperimentError(f"override {dotted}: {part!r} holds a value, not a section")
        node = child
    holder(node, last)[last] = copy.deepcopy(value)


def seeds(experiment: Experiment, scale: str, count: int | None = None) -> list[int]:
    """The recipe's seed_everything and the next ones, `count` of them (default the file's scale.<scale>.seeds)."""
    first = load_recipe(experiment, scale).get("seed_everything", DEFAULT_SEED)
    if isinstance(first, bool) or not isinstance(first, int):
        raise ExperimentError(
            f"{experiment.setup(scale).recipe}: seed_everything: a sweep needs a whole number to count seeds "
            f"from, got {first!r}"
        )
    return [first + i for i in range(count or experiment.setup(scale).seeds)]


def run_name(experiment: Experiment, variant: Variant, scale: str, seed: int) -> str:
    """``wd-0.5 s1234 (weight-decay/cpu)``, the variant first (the UI cuts long legends); `runs.run_scale` reads it."""
    return f"{variant.name} s{seed} ({experiment.name}/{scale})"


def variant_config(experiment: Experiment, variant: Variant, scale: str, seed: int | None = None) -> dict[str, Any]:
    """The recipe with the scale's and the variant's overrides and the run's identity (`seed` default: the first)."""
    config = load_recipe(experiment, scale)
    seed = seeds(experiment, scale, 1)[0] if seed is None else seed
    settings = {  # the run's identity: its experiment, variant, scale and seed (initialisation and data)
        **experiment.overrides(variant, scale),
        "run.experiment": experiment.mlflow_experiment,
        "run.variant": variant.name,
        "run.name": run_name(experiment, variant, scale, seed),
        "seed_everything": seed,
        "data.seed": seed,
    }
    try:
        for key, value in settings.items():
            set_dotted(config, key, value)
    except ExperimentError as err:
        recipe = experiment.setup(scale).recipe
        raise ExperimentError(
            f"{experiment.path}: variant {variant.name!r} at scale {scale} (recipe {recipe}): {err}"
        ) from None
    return config


def check_config(config: dict[str, Any], where: str, extra: list[str] = ()) -> None:
    """Raise ExperimentError (starting with `where`) unless `sinklab fit` accepts `config`, then ``extra``."""
    import tempfile

    from pipeline.train.fit_config import check_fit, parse_error_line

    try:
        if extra:  # as each job gets them: the config file, then the arguments
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
                yaml.safe_dump(config, f)
                f.flush()
                check_fit(["--config", f.name, *extra])
        else:
            check_fit(config)
    except (ConfigError, TypeError) as error:  # the model cannot be built
        raise ExperimentError(f"{where}: {error}") from None
    except Exception as error:  # jsonargparse's ArgumentError or a type error
        raise ExperimentError(f"{where}: `sinklab fit` rejects it: {parse_error_line(str(error))}") from None


def check_variant(
    experiment: Experiment, variant: Variant, scale: str, seed: int | None = None, extra: list[str] = ()
) -> None:
    where = f"{experiment.path}: variant {variant.name!r} at scale {scale}" + (
        f" with {' '.join(extra)}" if extra else ""
    )
    check_config(variant_config(experiment, variant, scale, seed), where, extra)
