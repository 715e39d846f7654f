"""Check variant configs with `sinklab fit`'s own parser and ModelConfig's validation, instantiating nothing."""

from __future__ import annotations

from typing import Any

from pipeline.experiments.configs import variant_config
from pipeline.experiments.spec import Experiment, ExperimentError, Variant


def check_config(config: dict[str, Any], where: str, extra: list[str] = ()) -> None:
    """Raise ExperimentError (starting with `where`) unless `sinklab fit` accepts `config`, then ``extra``."""
    import tempfile

    import yaml

    from pipeline.model.config import ConfigError
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
