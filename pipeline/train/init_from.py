"""``--model.init``: the weights a new run starts from (a SinkLab checkpoint, an export, ``runs:/<id>``, or a
pretrained HF model: smollm2, a .gguf file, an HF directory or hub id), the slots it adds to them without
changing the function, and ``--model.trainable``: which parameters train (docs/training.md, "Continual
pre-training from a pretrained model")."""

from __future__ import annotations

import fnmatch
import hashlib
from pathlib import Path

import torch

from pipeline.model import ConfigError, ModelConfig, Transformer
from pipeline.model.config import SHAPE_FIELDS
from sinklab_io.mappings import flatten

# what a run may add to its source: a sink logit, a K/KV-bias slot (with or without its logit)
SLOT_FIELDS = ("attention.sink_logit", "biases")
# an added slot's logit starts this far below the smallest log-sum-exp of its head's rows on the probe set:
# its share of every probe row is at most e^-20 = 2.1e-9, under float32's rounding (docs/training.md)
SLOT_MARGIN = 20.0
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".bin", ".safetensors", ".json", ".yaml")  # a missing file, not a hub id
NEW_SLOT_PARAMETERS = ("sink_logit", "slot_logit", "kv_slot.key", "kv_slot.value")


def is_pretrained_hf(spec: str) -> bool:
    """An HF source: a shortcut, a .gguf file, a directory with an HF config.json not of SinkLab, or an ORG/NAME hub id."""
    from pipeline.model.hf_sources import SHORTCUTS, hub_name
    from pipeline.model.loading import exported_config

    path = Path(spec)
    if spec in SHORTCUTS or path.suffix == ".gguf":
        return True
    if path.is_dir():
        return (path / "config.json").is_file() and exported_config(path) is None
    hub_id = hub_name(spec) and path.suffix not in CHECKPOINT_SUFFIXES
    return not path.exists() and not spec.startswith("runs:/") and bool(hub_id)


def _flat(cfg: ModelConfig) -> dict:
    return flatten(cfg.to_dict())


def _adds_slot(path: str) -> bool:
    return any(path == f or path.startswith(f + ".") for f in SLOT_FIELDS)


def init_arch(spec: str, cfg: ModelConfig, vocab_size: int) -> ModelConfig:
    """The run's model: for an HF source its own config (the recipe names no shape) with the run's slots;
    a SinkLab source's model must equal the run's but for the slots the run adds. Refusals name the field."""
    if not is_pretrained_hf(spec):
        return cfg
    if cfg.preset is not None:
        raise ConfigError(f"model.init={spec}: arch.preset={cfg.preset}: a pretrained source sets the shape; drop it")
    from transformers import AutoConfig

    from pipeline.model.hf_native import NotNative, config_from_hf
    from pipeline.model.hf_sources import hf_directory

    try:
        source = config_from_hf(AutoConfig.from_pretrained(hf_directory(spec)[1]).get_text_config())
    except (NotNative, OSError, ValueError) as exc:
        raise ConfigError(f"model.init={spec}: {str(exc).splitlines()[0]}") from None
    if vocab_size != source.vocab_size:
        raise ConfigError(
            f"model.init={spec}: the dataset has a vocabulary of {vocab_size} ids, the model {source.vocab_size}; "
            f"prepare it with the model's tokenizer (sinklab prep ... --tokenizer <its tokenizer.json>)"
        )
    run = _flat(cfg)
    arch = ModelConfig.from_dict(source.to_dict())
    arch = arch.replace(**{path.replace(".", "__"): value for path, value in run.items() if _adds_slot(path)})
    default = _flat(ModelConfig())
    from_source = {k for k, v in _flat(source).items() if v != default.get(k)} | {*SHAPE_FIELDS, "n_kv_heads", "preset"}
    have = _flat(arch)
    for path, value in run.items():
        if path not in from_source and not _adds_slot(path) and value != have[path]:
            raise ConfigError(
                f"model.init={spec}: arch.{path}={value!r}, the source has {have[path]!r}; a pretrained "
                "source keeps its architecture (a sink logit or a K/KV-bias slot may be added)"
            )
    return arch


def _source_model(spec: str) -> tuple[Transformer, dict[str, str]]:
    """The source as a SinkLab model and the tags that link the run to it."""
    tags = {"sinklab.init_from": spec}
    if is_pretrained_hf(spec):
        from pipeline.model.hf_native import from_hf
        from pipeline.model.hf_sources import hf_directory

        source, directory = hf_directory(spec)
        if (tokenizer := Path(directory) / "tokenizer.json").is_file():
            tags["sinklab.init_tokenizer_sha256"] = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
        return from_hf(directory), tags | {"sinklab.init_source": source}
    from pipeline.model import load_pretrained
    from pipeline.tracking import RunModelError, is_model_uri, resolve_model

    if not (is_model_uri(spec) or Path(spec).exists()):
        raise ConfigError(f"model.init={spec}: no such checkpoint or model directory (or runs:/<run_id>)")
    try:
        spec_path = spec
        if is_model_uri(spec):
            resolved = resolve_model(spec)
            spec_path, tags["sinklab.init_run_id"] = resolved.path, resolved.run_id
        return load_pretrained(spec_path), tags
    except (RunModelError, ValueError, OSError) as exc:
        raise ConfigError(f"model.init={spec}: {exc}") from None


def _added_logits(
    model: Transformer, new: list[str], tokens: torch.Tensor, margin: float, quantile: float
) -> dict[str, torch.Tensor]:
    """Per new logit parameter, ``margin`` below the ``quantile`` (0: the smallest) of the log-sum-exps over
    the existing keys of its head's rows on ``tokens``, read in float64 from the share of a new column whose
    logit is L: 1/p = n_new + e^(lse - L) (L moves down where e^(lse - L) is lost to rounding); repeated
    until each layer's L holds with the layers below it at theirs."""
    model = model.double().eval()
    params = dict(model.named_parameters())
    layers = sorted({name.split(".")[1] for name in new})
    level = {layer: torch.zeros(model.config.n_heads, dtype=torch.float64) for layer in layers}
    column = model.config.n_bias_slots - 1 if any(n.endswith("sink_logit") for n in new) else 0
    n_new = len({n.rsplit(".", 1)[1] for n in new})
    for _ in range(len(layers) + 8):
        with torch.no_grad():
            for name in new:
                params[name].copy_(level[name.split(".")[1]])
            out = model(tokens, output_attentions=True)
        moved = 0.0
        for layer in layers:
            p = out.attentions[int(layer)][..., column].transpose(0, 1).reshape(model.config.n_heads, -1)
            rest = torch.quantile(
                (1.0 / p - n_new).clamp(min=1e-300), quantile, dim=-1, interpolation="lower"
            )  # e^(lse - L), per head
            target = level[layer] + rest.log() - margin
            target = torch.where(rest < 1e-8 * n_new, level[layer] - 40.0, target)
            moved = max(moved, (target - level[layer]).abs().max().item())
            level[layer] = target
        if moved < 1e-6:
            break
    return {name: level[name.split(".")[1]].float() for name in new}


def read_init(
    spec: str, cfg: ModelConfig, tokens: torch.Tensor, margin: float = SLOT_MARGIN, quantile: float = 0.0
) -> tuple[dict, dict[str, str]]:
    """The weights of ``spec`` for a model of ``cfg`` (``init_arch``'s), the slots the run adds set where the
    function is the source's on ``tokens`` (the probe set): k* and v* zero, an added logit ``margin`` below
    the ``quantile`` of its head's row log-sum-exps (0: every row's); and the MLflow tags."""
    if not margin > 0:
        raise ConfigError(f"model.slot_margin={margin}: must be above 0 (20 keeps the function; 4.6 starts at 1%)")
    if not 0 <= quantile <= 1:
        raise ConfigError(f"model.slot_quantile={quantile}: must be in [0, 1] (0: the smallest row, 0.5: the median)")
    source, tags = _source_model(spec)
    have, want = _flat(source.config), _flat(cfg)
    if differ := sorted(k for k in want if k != "preset" and not _adds_slot(k) and want[k] != have.get(k)):
        raise ConfigError(
            f"model.init={spec}: its model differs in {', '.join(differ)} "
            f"({', '.join(f'{k}={have.get(k)!r}' for k in differ)}); set arch to match"
        )
    ours, theirs = Transformer(cfg).state_dict(), source.state_dict()
    if dropped := sorted(set(theirs) - set(ours)):
        raise ConfigError(f"model.init={spec}: the run's model lacks its {dropped[0]}; keep the source's slots in arch")
    if cfg.biases.kind in ("k", "kv") and not cfg.biases.slot_logit and not any("kv_slot" in n for n in theirs):
        raise ConfigError(
            f"model.init={spec}: an added K/KV-bias slot scores q·k* whatever k*; give arch.biases.slot_logit=true "
            "so that it starts with no attention"
        )
    state, new = {}, []
    for name, fresh in ours.items():
        if name in theirs and theirs[name].shape == fresh.shape:
            state[name] = theirs[name].to(fresh.dtype)
        elif name.endswith(("sink_logit", "slot_logit")):
            state[name] = torch.zeros_like(fresh)
            new.append(name)
        elif name.endswith(NEW_SLOT_PARAMETERS):
            state[name] = (
                fresh if name.endswith("kv_slot.value") and cfg.biases.kind == "k" else torch.zeros_like(fresh)
            )
        else:
            raise ConfigError(
                f"model.init={spec}: {name} has shape {tuple(theirs[name].shape)} there, here {tuple(fresh.shape)}"
            )
    if new:
        model = Transformer(cfg)
        model.load_state_dict(state)
        state |= _added_logits(model, new, tokens, margin, quantile)
    return state, tags


def trainable_names(model: torch.nn.Module, globs: str) -> set[str]:
    """The parameter names ``globs`` (comma-separated fnmatch patterns) match; a pattern matching none is refused."""
    names = [name for name, _ in model.named_parameters()]
    chosen = set()
    for glob in (g.strip() for g in globs.split(",")):
        hits = fnmatch.filter(names, glob)
        if not glob or not hits:
            example = next((n for n in names if "attn" in n), names[0])
            raise ConfigError(f"model.trainable: {glob!r} matches no parameter (names look like {example!r})")
        chosen.update(hits)
    return chosen
