"""Check variant configs with `sinklab fit`'s own parser before anything runs.

Every override must name a real field of the training config (LightningCLI / jsonargparse
checks names and types, e.g. a Literal such as model.model.attention.op), and the model part
must pass ModelConfig's own cross-field validation. Nothing is instantiated: no run
directory, no MLflow run, no dataset, no weights.
"""
from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Any

from pipeline.experiments.configs import variant_config
from pipeline.experiments.spec import Experiment, ExperimentError, Variant


@lru_cache(maxsize=1)
def _fit_parser():
    from pipeline.train.cli import SinkLabCLI
    from pipeline.train.data import SinkDataModule
    from pipeline.train.module import SinkLabModule

    class ParseOnly(SinkLabCLI):
        def _set_seed(self) -> None:
            pass

        def before_instantiate_classes(self) -> None:
            pass

        def instantiate_classes(self) -> None:
            pass

        def after_instantiate_classes(self) -> None:
            pass

    with warnings.catch_warnings():  # "args given while sys.argv has arguments": intended here
        warnings.simplefilter("ignore", UserWarning)
        cli = ParseOnly(SinkLabModule, SinkDataModule, args=[], run=False, save_config_callback=None,
                        auto_configure_optimizers=False, seed_everything_default=1234,
                        parser_kwargs={"default_env": False, "exit_on_error": False})
    return cli.parser


def _check_parsed(parse, where: str) -> None:
    """Raise ExperimentError (starting with `where`) unless `parse()` (fit's parser) and
    ModelConfig's own cross-field validation accept the config."""
    from jsonargparse import Namespace

    from pipeline.model.config import ConfigError, ModelConfig
    from pipeline.train.cli import parse_error_line

    try:
        parsed = parse()
    except Exception as error:  # jsonargparse's ArgumentError or a type error
        raise ExperimentError(f"{where}: `sinklab fit` rejects it: {parse_error_line(str(error))}") from None
    model = parsed.model.model
    if model is None:  # not set: fit builds the default ModelConfig
        return
    fields = model.as_dict() if isinstance(model, Namespace) else dict(vars(model))
    try:
        ModelConfig.from_dict(fields)
    except (ConfigError, TypeError) as error:
        raise ExperimentError(f"{where}: {error}") from None


def check_config(config: dict[str, Any], where: str) -> None:
    """Raise ExperimentError (starting with `where`) unless `sinklab fit` would accept `config`."""
    _check_parsed(lambda: _fit_parser().parse_object(config), where)


def check_fit_command(config: str, fit_args: list[str], where: str) -> None:
    """`sinklab fit --config CONFIG *fit_args`, parsed and checked without running anything."""
    _check_parsed(lambda: _fit_parser().parse_args(["--config", str(config), *fit_args]), where)


def check_variant(experiment: Experiment, variant: Variant, scale: str) -> None:
    check_config(variant_config(experiment, variant, scale),
                 f"{experiment.path}: variant {variant.name!r} at scale {scale}")


def check_experiment(experiment: Experiment, scale: str) -> int:
    """Check every variant's config at `scale`; return how many were checked."""
    for variant in experiment.variants:
        check_variant(experiment, variant, scale)
    return len(experiment.variants)
