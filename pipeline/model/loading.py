"""Saving and loading SinkLab models (docs/model.md, "Checkpoints and HF")."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from sinklab_io.outputs import atomic_directory

from .config import ARCH, EXPORT_FORMAT, ConfigError, ModelConfig
from .transformer import Transformer

CONFIG_NAME = "sinklab_config.json"
WEIGHTS_NAME = "model.safetensors"
_PREFIXES = ("_forward_module.", "module.", "model.")


def checkpoint_arch(hparams: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The ModelConfig dict a checkpoint's ``hyper_parameters`` carry, or None; refuses the older ``model_config``."""
    if "model_config" in hparams:
        raise ConfigError(
            f"{where}: hyper_parameters['model_config'] is an older checkpoint format, no longer read "
            f"(today's checkpoints hold hyper_parameters['{ARCH}'])"
        )
    return hparams.get(ARCH)


def save_pretrained(model: Transformer, out_dir: str | os.PathLike) -> Path:
    """Write ``sinklab_config.json`` + ``model.safetensors`` atomically into out_dir."""
    with atomic_directory(out_dir, kind="sinklab save_pretrained") as tmp:
        write_weights(model.config, model.state_dict(), tmp)
    return Path(out_dir)


def write_weights(config: ModelConfig, state: dict[str, torch.Tensor], directory: Path) -> None:
    """``state`` (a tied ``lm_head.weight`` left out) and ``config`` as load_pretrained reads them."""
    state = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    if config.tie_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(directory / WEIGHTS_NAME), metadata={"format": "pt", "sinklab": "1"})
    (directory / CONFIG_NAME).write_text(json.dumps(config.to_dict(), indent=2) + "\n")


def load_pretrained(
    path: str | os.PathLike, config: str | os.PathLike | ModelConfig | dict | None = None, map_location: str = "cpu"
) -> Transformer:
    """A SinkLab export dir or remote-code HF export, a Lightning ``.ckpt``, or a state-dict file with ``config``."""
    p = Path(path)
    if p.is_dir():
        cfg_file, weights = p / CONFIG_NAME, p / WEIGHTS_NAME
        if config is None and not cfg_file.exists() and (exported := exported_config(p)):
            return _build(exported, load_file(str(weights), device=map_location), str(weights))
        for f in (cfg_file, weights):
            if not f.exists():
                raise FileNotFoundError(f"{p}: not a SinkLab export dir, missing {f.name}")
        arch = _as_config(cfg_file if config is None else config)
        return _build(arch, load_file(str(weights), device=map_location), str(weights))
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such checkpoint")
    try:
        if p.suffix == ".safetensors":
            state: dict[str, Any] = load_file(str(p), device=map_location)
            blob: dict[str, Any] = {}
        else:
            blob = torch.load(p, map_location=map_location, weights_only=False)
            state = blob.get("state_dict", blob.get("module", blob)) if isinstance(blob, dict) else {}
    except Exception as exc:  # zip, pickle, EOF and safetensors errors alike: not a file we can read
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{p}: not a readable checkpoint or state dict ({first[:150]})") from None
    if config is None and isinstance(blob, dict):
        config = checkpoint_arch(blob.get("hyper_parameters") or {}, str(p))
    if config is None:
        raise ValueError(f"{p}: no model config inside; pass config=<sinklab_config.json or run config.yaml>")
    return _build(_as_config(config), state, str(p))


def exported_config(directory: Path) -> ModelConfig | None:
    """The model config of a remote-code HF export (config.json of model_type ``sinklab``), or None."""
    try:
        data = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("model_type") != "sinklab":
        return None
    if data.get("sinklab_format", 1) > EXPORT_FORMAT:
        raise ValueError(
            f"{directory / 'config.json'}: sinklab_format={data['sinklab_format']}, this SinkLab reads format "
            f"{EXPORT_FORMAT} at most; upgrade SinkLab to read it"
        )
    return ModelConfig.from_dict(data.get("sinklab") or {})


def _as_config(config: str | os.PathLike | ModelConfig | dict) -> ModelConfig:
    """``config`` as it is, from a dict, or from sinklab_config.json or the model section of a run config."""
    if isinstance(config, ModelConfig):
        return config
    if isinstance(config, dict):
        return ModelConfig.from_dict(config)
    p = Path(config)
    if p.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(p.read_text())
    else:
        data = json.loads(p.read_text())
    found = _find_model_section(data)
    if found is None:
        raise ValueError(f"{p}: no model config found (a mapping with a preset, or d_model, n_layers, n_heads)")
    return ModelConfig.from_dict(found)


def _find_model_section(data: Any) -> dict | None:
    if isinstance(data, dict):
        if "preset" in data or {"d_model", "n_layers", "n_heads"} <= set(data):
            return data
        for value in data.values():
            if (found := _find_model_section(value)) is not None:
                return found
    return None


def _build(config: ModelConfig, state: dict[str, Any], source: str) -> Transformer:
    model = Transformer(config)
    shapes = model.state_dict()
    expected = set(shapes)
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    for _ in range(3):  # up to three wrappers' prefixes, outermost first
        if set(tensors) & expected:
            break
        for prefix in _PREFIXES:
            if any(k.startswith(prefix) for k in tensors):
                tensors = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
                break
    if config.tie_embeddings:
        tensors.setdefault("lm_head.weight", tensors.get("embed.weight"))
    missing = sorted(expected - set(tensors))
    unexpected = sorted(set(tensors) - expected)
    if missing or unexpected:
        raise ValueError(f"{source}: weights do not fit the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if wrong := [k for k, v in tensors.items() if v.shape != shapes[k].shape]:
        k = wrong[0]
        raise ValueError(
            f"{source}: weights do not fit the config: {k} is {list(tensors[k].shape)}, the config builds "
            f"{list(shapes[k].shape)} (vocab_size {config.vocab_size}, d_model {config.d_model}); give the config "
            "the weights were trained with"
        )
    model.load_state_dict({k: v.float() for k, v in tensors.items()})
    return model
