"""The variants an HF architecture expresses exactly, converted both ways: the default block is a
``LlamaForCausalLM``, with qk-norm a ``Qwen3ForCausalLM``; anything else exports as remote code."""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from .config import AttentionConfig, ModelConfig
from .transformer import Transformer

_ANY_ATTENTION = ("clip_gamma", "clip_zeta", "normalizer", "feature_map")  # fields a softmax op ignores
# (field path, value HF Llama needs)
_LLAMA_FIELDS: list[tuple[str, Any]] = [
    ("positional", "rope"),
    ("norm_position", "pre"),
    ("norm", "rmsnorm"),
    ("ffn", "swiglu"),
    ("head_merge", "concat"),
    ("sink_tokens", 0),
    ("mask", "causal"),
    *((f"attention.{k}", v) for k, v in vars(AttentionConfig()).items() if k not in _ANY_ATTENTION),
    ("biases.kind", "none"),
]
# the one field Qwen3 adds to Llama
_QWEN3_FIELDS = [(path, True if path == "attention.qk_norm" else needed) for path, needed in _LLAMA_FIELDS]
ARCHITECTURES = {"LlamaForCausalLM": _LLAMA_FIELDS, "Qwen3ForCausalLM": _QWEN3_FIELDS}
# our weights -> HF's; per layer: one to one, Qwen3's qk-norm, and ours stacked from several of HF's
_TOP_WEIGHTS = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
_LAYER_WEIGHTS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn.out.weight": "self_attn.o_proj.weight",
    "ffn.down.weight": "mlp.down_proj.weight",
}
_QK_NORM_WEIGHTS = {"attn.q_norm.weight": "self_attn.q_norm.weight", "attn.k_norm.weight": "self_attn.k_norm.weight"}
_FUSED_WEIGHTS = {
    "attn.qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "ffn.gate_up.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


# ModelConfig field -> the HF config's name for it
HF_NAMES = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "d_ffn": "intermediate_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "max_seq_len": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "tie_embeddings": "tie_word_embeddings",
}


class NotNative(ValueError):
    """A model config no HF architecture here expresses, or an HF config SinkLab does not import."""


def _differing(cfg: ModelConfig, fields: list[tuple[str, Any]]) -> list[tuple[str, Any, Any]]:
    found = [(path, functools.reduce(getattr, path.split("."), cfg), needed) for path, needed in fields]
    return [(path, value, needed) for path, value, needed in found if value != needed]


def native_architecture(cfg: ModelConfig) -> str | None:
    """The HF class that computes exactly this model, or None (it exports as remote code)."""
    return next((name for name, fields in ARCHITECTURES.items() if not _differing(cfg, fields)), None)


def check_native(cfg: ModelConfig) -> str:
    """The HF class of :func:`native_architecture`; else raises, naming a field of the closest one."""
    name, fields = min(ARCHITECTURES.items(), key=lambda item: len(_differing(cfg, item[1])))
    for path, value, needed in _differing(cfg, fields)[:1]:
        raise NotNative(f"arch.{path}={value!r}: HF {name} expresses only {needed!r}")
    return name


def hf_config(cfg: ModelConfig):
    from transformers import LlamaConfig, Qwen3Config

    architecture = check_native(cfg)
    shape = {theirs: getattr(cfg, ours) for ours, theirs in HF_NAMES.items()}
    shape |= dict(head_dim=cfg.head_dim, initializer_range=cfg.init_std, hidden_act="silu", attention_bias=False)
    if architecture == "Qwen3ForCausalLM":
        return Qwen3Config(**shape, use_sliding_window=False)
    return LlamaConfig(**shape, mlp_bias=False)


def _weight_names(cfg: ModelConfig) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Our state-dict names -> HF's: one to one, and ours stacked from several HF matrices."""
    single = dict(_TOP_WEIGHTS)
    layer = _LAYER_WEIGHTS | (_QK_NORM_WEIGHTS if cfg.attention.qk_norm else {})
    fused = {}
    for i in range(cfg.n_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        single |= {ours + a: theirs + b for a, b in layer.items()}
        fused |= {ours + a: tuple(theirs + b for b in bs) for a, bs in _FUSED_WEIGHTS.items()}
    return single, fused


def to_hf(model: Transformer):
    """A ``LlamaForCausalLM`` (or ``Qwen3ForCausalLM`` with qk-norm) with this model's weights (fp32)."""
    import transformers

    hf = getattr(transformers, check_native(model.config))(hf_config(model.config))
    sd, modules = model.state_dict(), dict(model.named_modules())
    single, fused = _weight_names(model.config)
    out = {theirs: sd[ours] for ours, theirs in single.items()}
    for ours, theirs in fused.items():
        out |= dict(zip(theirs, sd[ours].split(modules[ours.removesuffix(".weight")].fused_rows, dim=0)))
    hf.load_state_dict({k: v.detach().clone() for k, v in out.items()}, strict=not model.config.tie_embeddings)
    return hf.eval()


def config_from_hf(c) -> ModelConfig:
    """The ModelConfig of an HF Llama or Qwen3 config (a ``PretrainedConfig``); NotNative for any other."""
    if c.model_type not in ("llama", "qwen3"):
        raise NotNative(f"HF config model_type={c.model_type!r}: SinkLab imports only 'llama' and 'qwen3'")
    for name, needed in (
        ("hidden_act", "silu"),
        ("attention_bias", False),
        ("mlp_bias", False),
        ("use_sliding_window", False),
    ):
        if getattr(c, name, needed) != needed:
            raise NotNative(f"HF config {name}={getattr(c, name)!r}: SinkLab imports only {needed!r}")
    rope = getattr(c, "rope_parameters", None) or {"rope_type": "default", "rope_theta": getattr(c, "rope_theta", 1e4)}
    if rope.get("rope_type", "default") != "default":
        raise NotNative(f"HF config rope_type={rope['rope_type']!r}: SinkLab imports only 'default'")
    read = {ours: getattr(c, theirs) for ours, theirs in HF_NAMES.items() if ours not in ("kv_heads", "rope_theta")}
    cfg = ModelConfig(
        **read | {"tie_embeddings": bool(c.tie_word_embeddings)},
        n_kv_heads=None if c.num_key_value_heads == c.num_attention_heads else c.num_key_value_heads,
        rope_theta=float(rope["rope_theta"]),
        attention=AttentionConfig(qk_norm=c.model_type == "qwen3"),
    )
    if cfg.head_dim != getattr(c, "head_dim", cfg.head_dim):
        raise NotNative(f"HF config head_dim={c.head_dim}: SinkLab needs hidden_size / num_attention_heads")
    return cfg


def from_hf(hf_model) -> Transformer:
    """Import an HF Llama or Qwen3 (a model object or a save_pretrained directory), grouped-query attention
    included; float64 weights stay float64, any other dtype becomes float32."""
    if isinstance(hf_model, (str, os.PathLike)):
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(hf_model, dtype=torch.float32)
    cfg = config_from_hf(hf_model.config)
    sd = hf_model.state_dict()
    sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
    single, fused = _weight_names(cfg)
    ours = {o: sd[t] for o, t in single.items()} | {o: torch.cat([sd[t] for t in ts]) for o, ts in fused.items()}
    dtype = torch.float64 if sd["model.embed_tokens.weight"].dtype == torch.float64 else torch.float32
    model = Transformer(cfg).to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in ours.items()})
    return model
