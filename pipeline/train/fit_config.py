"""`sinklab fit`'s config between parsing and building: the preset resolved, older layouts refused, parse
errors as one line, the `--check-only` check (which instantiates nothing), and the config as the run records it."""

from __future__ import annotations

import json
import os
import re
import warnings
from functools import lru_cache
from typing import Any

import yaml
from jsonargparse import Namespace, get_loader, set_loader

from pipeline.model.config import ARCH, SHAPE_FIELDS, ModelConfig, refuse_old_layout, refuse_renamed
from sinklab_io.mappings import flatten

CHECK_ONLY = "--check-only"
ARCH_TARGET = "model.arch"  # the LightningModule's argument, linked from the top-level `arch`
OPTIM, OPTIM_TARGET = "optim", "model.optim"  # likewise the optimiser's
PARSER_MODE = "sinklab"  # YAML, with a config of the older layout refused

_YAML = get_loader("yaml")


def _load_yaml(value: str, path: str = "") -> Any:
    """jsonargparse's YAML loader; a config file's ``path`` is its name, read from its folder."""
    loaded = _YAML(value)
    if isinstance(loaded, dict):
        refuse_old_layout(loaded, os.path.abspath(path) if path else "config")
    return loaded


set_loader(PARSER_MODE, _load_yaml, (yaml.YAMLError,))


def parse_fit(parser, args: list[str] | dict[str, Any]) -> Namespace:
    """``args`` (a command line, or a config as a dict) parsed, and ``arch`` replaced by the ModelConfig it
    builds, so the run's config names every number of its preset (ConfigError where it cannot)."""
    if isinstance(args, dict):
        refuse_old_layout(args, "config")
    for flag in args if isinstance(args, list) else ():
        if flag.startswith("--"):
            refuse_renamed(flag.split("=")[0][2:], "command line: ", "--")
    config = parser.parse_object(args) if isinstance(args, dict) else parser.parse_args(args)
    arch = config.get(ARCH)
    set_arch(config, ModelConfig.from_dict(arch.as_dict() if arch is not None else {}))
    return config


def set_arch(config: Namespace, arch: ModelConfig) -> None:
    """Name ``arch``, the model as built, in the config (and its link's copy)."""
    built = arch.to_dict()
    config[ARCH], config[ARCH_TARGET] = _namespace(built), _namespace(built)


def _namespace(data: dict[str, Any]) -> Namespace:
    return Namespace(**{k: _namespace(v) if isinstance(v, dict) else v for k, v in data.items()})


@lru_cache(maxsize=1)
def fit_parser():
    """`sinklab fit`'s parser, built once (building it costs about a second)."""
    from .lightning_cli import SinkLabCLI

    skipped = ("_set_seed", "before_instantiate_classes", "instantiate_classes", "after_instantiate_classes")
    parse_only = type("ParseOnly", (SinkLabCLI,), dict.fromkeys(skipped, lambda self: None))
    with warnings.catch_warnings():  # "args given while sys.argv has arguments": intended here
        warnings.simplefilter("ignore", UserWarning)
        return parse_only.build([]).parser


def check_fit(args: list[str] | dict[str, Any]) -> Namespace:
    """The resolved config of `sinklab fit ARGS`; raises ArgumentError (a name or type) or ConfigError (the model)."""
    from .optim import OptimConfig

    config = parse_fit(fit_parser(), args)
    if config.model.optim is not None and (config.trainer.max_steps or 0) >= 1:
        OptimConfig(**config.model.optim.as_dict()).validate(config.trainer.max_steps)  # as the fit's start does
    check_batch(config)
    return config


def check_batch(config: Namespace) -> None:
    """Raises BatchConfigError where the batch does not fit the world size, both given as numbers and the
    dataset readable from here (else the job's start checks it)."""
    from data_prep.dataset import DatasetError, load_manifest

    from .batching import plan_batch

    devices, nodes = (str(config.trainer.devices), str(config.trainer.num_nodes))  # the parser may keep "2"
    if not (devices.isdigit() and nodes.isdigit()) or config.data is None:
        return
    try:
        context = load_manifest(config.data.path).context_length
    except (DatasetError, OSError):
        return
    plan_batch(config.data.global_batch_tokens, context, config.data.micro_batch_size, int(devices) * int(nodes))


_NOISE = re.compile("NoneType|Does not validate against|Subtypes:|Errors:|Given value|Problem with given class_path")


def parse_error_line(message: str) -> str:
    """jsonargparse's multi-line error (every Union alternative, nested keys) as ``<dotted key>: <reason>``."""
    keys, reasons = [], []
    for line in (raw.strip(" -") for raw in message.splitlines()):
        if line.startswith('Parser key "'):
            key, _, rest = line[len('Parser key "') :].partition('":')
            keys.append(key)
            line = rest.strip()
        if line and not _NOISE.search(line):
            reasons.append(line)
    where = ".".join(keys)
    if where == OPTIM_TARGET or where.startswith(OPTIM_TARGET + "."):  # the link's copy of `optim`
        where = OPTIM + where[len(OPTIM_TARGET) :]
    return (f"{where}: " if where else "") + "; ".join(reasons)[:500]


def as_plain(cfg) -> dict:
    """The parsed config (or a dict of it) as plain values, anything else as its str (the run's MLflow params)."""
    out = json.loads(json.dumps(cfg.as_dict() if isinstance(cfg, Namespace) else cfg, default=str))
    out.pop("config", None)
    for target in (ARCH_TARGET, OPTIM_TARGET):  # the links' copies of `arch` and `optim`
        out.get("model", {}).pop(target.split(".")[1], None)
    return out


def variant_summary(cfg) -> str:
    """One line naming the attention operation (always) and what else differs from the paper's defaults."""
    plain = as_plain(cfg)
    default = flatten(ModelConfig().to_dict())
    flat = flatten(plain.get(ARCH) or {})
    op = flat.get("attention.op", default["attention.op"])
    named = {"attention.op"} | ({"attention.feature_map"} if op == "kernel" else set())
    diffs = [f"{op}({flat.get('attention.feature_map', default['attention.feature_map'])})" if op == "kernel" else op]
    diffs += [
        f"{k}={v}"
        for k, v in sorted(flat.items())
        if k not in ("preset", *SHAPE_FIELDS, *named) and default.get(k) != v
    ]
    optim = plain.get(OPTIM) or {}
    diffs += [f"lr={optim.get('lr')}", f"wd={optim.get('weight_decay')}"]
    inter = plain.get("data", {}).get("interventions") or {}
    if inter.get("resample"):
        diffs.append("resample=" + ",".join(map(str, inter["resample"])))
    if inter.get("fix_position"):
        diffs.append(f"fix x{inter['fix_position']}={inter.get('fix_token')}")
    if plain.get("data", {}).get("token_budget"):
        diffs.append(f"token_budget={plain['data']['token_budget']}")
    return ", ".join(diffs)


NEGATIVE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def negative_values_joined(argv: list[str]) -> list[str]:
    """``--optim.lr -1e-3`` as ``--optim.lr=-1e-3``, which argparse would take for an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and NEGATIVE_NUMBER.fullmatch(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out
