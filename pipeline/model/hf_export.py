"""A Hugging Face model directory of any SinkLab model (``sinklab export-hf``): a native Llama or
Qwen3 where one computes it exactly (``hf_native``), else remote code (``hf_bundle``; docs/model.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from sinklab_io.mappings import flatten
from sinklab_io.outputs import atomic_directory

from .config import SHAPE_FIELDS, ModelConfig
from .hf_bundle import bundle, entry_class
from .hf_native import native_architecture, to_hf
from .transformer import Transformer

KIND = "sinklab export-hf"
REMOTE = "remote code"
AUTO_MAP = {"AutoConfig": entry_class("SinkLabConfig"), "AutoModelForCausalLM": entry_class("SinkLabForCausalLM")}
_NOT_VARIANT = {"preset", "init_std", *SHAPE_FIELDS}  # shape and initialisation name no variant


def export_hf(
    model: Transformer,
    out_dir: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    tokenizer: Any = None,
    facts: dict[str, Any] | None = None,
) -> str:
    """Write the export; returns the HF class it loads as (or ``REMOTE``). ``tokenizer``: a transformers
    tokenizer or a tokenizer.json path; ``facts``: what the model card reports beyond the config."""
    from transformers import GenerationConfig

    from .hf_modeling import SinkLabConfig, SinkLabForCausalLM

    architecture = native_architecture(model.config)
    if architecture:
        hf = to_hf(model).to(dtype)
    else:  # the model inside the remote-code class
        hf = SinkLabForCausalLM(SinkLabConfig(sinklab=model.config.to_dict()))
        hf.model.load_state_dict(model.state_dict())
        hf.config.auto_map = dict(AUTO_MAP)
        hf = hf.eval().to(dtype)
    for role in ("bos", "eos", "pad"):  # the tokenizer's, else none (not a Llama's defaults)
        setattr(hf.config, f"{role}_token_id", getattr(tokenizer, f"{role}_token_id", None))
    hf.generation_config = GenerationConfig.from_model_config(hf.config)
    with atomic_directory(out_dir, kind=KIND) as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        if architecture is None:
            for name, text in bundle().items():
                (tmp / name).write_text(text)
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(tmp)
        elif tokenizer is not None:
            shutil.copy(tokenizer, tmp / "tokenizer.json")
        card = model_card(model, architecture, Path(out_dir).resolve().name, str(dtype).removeprefix("torch."), facts)
        (tmp / "README.md").write_text(card)
    return architecture or REMOTE


def _value(v: Any) -> str:
    return "not recorded" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def model_card(
    model: Transformer, architecture: str | None, name: str, dtype: str, facts: dict[str, Any] | None
) -> str:
    """README.md: the variant, the training data, the final metrics, how to load it. ``facts``:
    ``source`` (what was exported), ``dataset`` (the manifest summary, a dict), ``metrics``
    ({label: value}: Sink_1, alpha_1, val loss), ``metrics_from`` (where they were read)."""
    facts = facts or {}
    cfg = model.config
    default = flatten(ModelConfig(**{name: getattr(cfg, name) for name in SHAPE_FIELDS}).to_dict())
    variant = [f"`{k}={v}`" for k, v in flatten(cfg.to_dict()).items() if k not in _NOT_VARIANT and v != default[k]]
    described = ", ".join(variant) or "the default block (RoPE, pre-norm RMSNorm, SwiGLU)"
    remote = architecture is None
    trust = ", trust_remote_code=True" if remote else ""
    how = (
        f"`{architecture}` (native transformers class)"
        if not remote
        else "remote code: `SinkLabForCausalLM`, whose source (SinkLab's own model modules) is in this folder"
    )
    lines = [
        "---",
        "library_name: transformers",
        "tags: [sinklab, attention-sinks]",
        "---",
        f"# {name}",
        "",
        f"A SinkLab model. Variant: {described}.",
        "",
        f"- loads as {how}",
        f"- shape: d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads ({cfg.kv_heads} key/value), FFN {cfg.d_ffn}, "
        f"vocabulary {cfg.vocab_size}, context {cfg.max_seq_len}; {model.num_parameters() / 1e6:.2f}M parameters; "
        f"weights in {dtype}",
        f"- exported from: `{facts.get('source', 'a SinkLab model')}`",
        "",
        "## Training data",
        "",
    ]
    dataset = facts.get("dataset")
    if dataset:
        lines += [f"- {k}: `{json.dumps(dataset[k])}`" for k in ("manifest_hash", "path", "tokenizer") if k in dataset]
        for split, info in (dataset.get("splits") or {}).items():
            lines.append(f"- {split}: {info.get('tokens')} tokens, {info.get('sequences')} sequences")
    else:
        lines.append("Not recorded with this checkpoint (no dataset.json beside it).")
    metrics = facts.get("metrics") or {}
    lines += ["", "## Final metrics", ""]
    if metrics:
        lines += ["| metric | value |", "|---|---|"] + [f"| {k} | {_value(v)} |" for k, v in metrics.items()]
    lines += ["", f"Read from {facts['metrics_from']}." if facts.get("metrics_from") else "Not recorded."]
    lines += [
        "",
        "## How to load",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        f'model = AutoModelForCausalLM.from_pretrained("{name}"{trust})',
        "```",
        "",
        f"lm-evaluation-harness: `lm_eval --model hf --model_args pretrained={name}{trust.replace(' ', '')} --tasks ...`"
        + (" (SinkLab models take no padding mask: generation tasks with batch size 1)." if remote else "."),
        f"SinkLab reads it back: `sinklab analyze {name}`, `sinklab stream-ppl {name}`.",
        "",
        "## Model config (SinkLab)",
        "",
        "```json",
        json.dumps(cfg.to_dict(), indent=2),
        "```",
        "",
    ]
    return "\n".join(lines)
