"""Where a ModelConfig sits: the ``arch`` section of a run config (``--arch.attention.op``) and
``hyper_parameters["arch"]`` of a checkpoint.

Configs and checkpoints that still name it ``model.model`` (the section) or
``hyper_parameters["model_config"]`` are read as ``arch``, with a one-line notice.
"""

from __future__ import annotations

from typing import Any

from sinklab_io.notices import notice

from .config import ConfigError

ARCH = "arch"
OLD_ARCH = "model.model"
OLD_HPARAM = "model_config"


def _notice(where: str, old: str) -> None:
    notice(f"{where}: `{old}` read as `{ARCH}` (the architecture's section); rename it there", once=True)


def renamed_key(dotted: str) -> str:
    """``model.model.attention.op`` -> ``arch.attention.op``; any other key as it is."""
    if dotted == OLD_ARCH or dotted.startswith(OLD_ARCH + "."):
        return ARCH + dotted[len(OLD_ARCH) :]
    return dotted


def renamed_keys(settings: dict[str, Any], where: str) -> dict[str, Any]:
    """Dotted keys (experiment overrides) with ``model.model.*`` read as ``arch.*``."""
    out = {renamed_key(k): v for k, v in settings.items()}
    if list(out) != list(settings):
        _notice(where, OLD_ARCH)
    return out


def renamed_argv(argv: list[str]) -> list[str]:
    """``--model.model.X v`` (or ``=v``) on a command line read as ``--arch.X``."""
    out = [("--" + renamed_key(a[2:])) if a.startswith("--" + OLD_ARCH) else a for a in argv]
    if out != argv:
        _notice("command line", "--" + OLD_ARCH)
    return out


def renamed_config(config: dict[str, Any], where: str) -> dict[str, Any]:
    """A nested run config (a recipe) whose ``model:`` holds ``model:`` (directly or under
    ``init_args``), with that section moved to the top as ``arch:``. Raises ConfigError where
    both are given."""
    module = config.get("model")
    if not isinstance(module, dict):
        return config
    nested = isinstance(module.get("init_args"), dict)
    rest = dict(module["init_args"] if nested else module)
    if "model" not in rest:
        return config
    if ARCH in config:
        raise ConfigError(f"{where}: gives both `{ARCH}` and `{OLD_ARCH}`; keep `{ARCH}` only")
    _notice(where, OLD_ARCH)
    out = dict(config)
    out[ARCH] = rest.pop("model")
    out["model"] = {**module, "init_args": rest} if nested else rest
    return out


def checkpoint_arch(hparams: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The ModelConfig dict a checkpoint's ``hyper_parameters`` carry (None: none)."""
    if ARCH in hparams:
        return hparams[ARCH]
    if OLD_HPARAM in hparams:
        _notice(where, f"hyper_parameters['{OLD_HPARAM}']")
        return hparams[OLD_HPARAM]
    return None
