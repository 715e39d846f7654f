"""The variants an HF architecture expresses exactly, converted both ways: the default block is
a ``LlamaForCausalLM``, the default block with qk-norm a ``Qwen3ForCausalLM`` (RMSNorm on each
head's queries and keys before the rotation, the norm's eps the model's). Anything else exports
as remote code (``hf_export``)."""

from __future__ import annotations

import os
from typing import Any

import torch

from .config import AttentionConfig, BiasConfig, ModelConfig
from .transformer import Transformer

# (field path, value HF Llama needs)
_LLAMA_FIELDS: list[tuple[str, Any]] = (
    [
        ("positional", "rope"),
        ("norm_position", "pre"),
        ("norm", "rmsnorm"),
        ("ffn", "swiglu"),
        ("head_merge", "concat"),
        ("sink_tokens", 0),
        ("mask", "causal"),
    ]
    + [
        (f"attention.{k}", v)
        for k, v in vars(AttentionConfig()).items()
        if k not in ("clip_gamma", "clip_zeta", "normalizer", "feature_map")
    ]
    + [
        ("biases.kind", "none"),
    ]
)
# the one field Qwen3 adds to Llama
_QWEN3_FIELDS = [(path, True if path == "attention.qk_norm" else needed) for path, needed in _LLAMA_FIELDS]
ARCHITECTURES = {"LlamaForCausalLM": _LLAMA_FIELDS, "Qwen3ForCausalLM": _QWEN3_FIELDS}


class NotNative(ValueError):
    """The model config has a field no HF architecture here expresses (or an HF config one SinkLab
    does not import)."""


def _differing(cfg: ModelConfig, fields: list[tuple[str, Any]]) -> list[tuple[str, Any, Any]]:
    found = []
    for path, needed in fields:
        value: Any = cfg
        for part in path.split("."):
            value = getattr(value, part)
        if value != needed:
            found.append((path, value, needed))
    return found


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
    """The LlamaConfig or Qwen3Config of a model that one of them expresses."""
    from transformers import LlamaConfig, Qwen3Config

    architecture = check_native(cfg)
    shape = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ffn,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_embeddings,
        initializer_range=cfg.init_std,
        hidden_act="silu",
        attention_bias=False,
    )
    if architecture == "Qwen3ForCausalLM":
        return Qwen3Config(**shape, use_sliding_window=False)
    return LlamaConfig(**shape, mlp_bias=False)


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    check_native(model.config)
    sd = model.state_dict()
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"]}
    out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(model.config.n_layers):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        q, k, v = sd[src + "attn.qkv.weight"].chunk(3, dim=0)
        gate, up = sd[src + "ffn.gate_up.weight"].chunk(2, dim=0)
        out.update(
            {
                dst + "input_layernorm.weight": sd[src + "attn_norm.weight"],
                dst + "post_attention_layernorm.weight": sd[src + "ffn_norm.weight"],
                dst + "self_attn.q_proj.weight": q,
                dst + "self_attn.k_proj.weight": k,
                dst + "self_attn.v_proj.weight": v,
                dst + "self_attn.o_proj.weight": sd[src + "attn.out.weight"],
                dst + "mlp.gate_proj.weight": gate,
                dst + "mlp.up_proj.weight": up,
                dst + "mlp.down_proj.weight": sd[src + "ffn.down.weight"],
            }
        )
        if model.config.attention.qk_norm:
            out[dst + "self_attn.q_norm.weight"] = sd[src + "attn.q_norm.weight"]
            out[dst + "self_attn.k_norm.weight"] = sd[src + "attn.k_norm.weight"]
    return {k: v.detach().clone() for k, v in out.items()}


def to_hf(model: Transformer):
    """A ``LlamaForCausalLM`` (or ``Qwen3ForCausalLM`` with qk-norm) with this model's weights (fp32)."""
    import transformers

    hf = getattr(transformers, check_native(model.config))(hf_config(model.config))
    hf.load_state_dict(to_hf_state_dict(model), strict=not model.config.tie_embeddings)
    return hf.eval()


def from_hf(hf_model) -> Transformer:
    """Import an HF Llama or Qwen3 (a model object or a save_pretrained directory)."""
    if isinstance(hf_model, (str, os.PathLike)):
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(hf_model, dtype=torch.float32)
    c = hf_model.config
    qwen3 = c.model_type == "qwen3"
    if c.model_type not in ("llama", "qwen3"):
        raise NotNative(f"HF config model_type={c.model_type!r}: SinkLab imports only 'llama' and 'qwen3'")
    for name, needed in (
        ("num_key_value_heads", c.num_attention_heads),
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
    cfg = ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        d_ffn=c.intermediate_size,
        max_seq_len=c.max_position_embeddings,
        norm_eps=c.rms_norm_eps,
        rope_theta=float(rope["rope_theta"]),
        tie_embeddings=bool(c.tie_word_embeddings),
        attention=AttentionConfig(qk_norm=qwen3),
        biases=BiasConfig(),
    )
    if cfg.head_dim != getattr(c, "head_dim", cfg.head_dim):
        raise NotNative(f"HF config head_dim={c.head_dim}: SinkLab needs hidden_size / num_attention_heads")
    sd = hf_model.state_dict()
    ours = {
        "embed.weight": sd["model.embed_tokens.weight"],
        "norm.weight": sd["model.norm.weight"],
        "lm_head.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"]),
    }
    for i in range(cfg.n_layers):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        ours.update(
            {
                dst + "attn_norm.weight": sd[src + "input_layernorm.weight"],
                dst + "ffn_norm.weight": sd[src + "post_attention_layernorm.weight"],
                dst + "attn.qkv.weight": torch.cat([sd[src + f"self_attn.{p}_proj.weight"] for p in "qkv"]),
                dst + "attn.out.weight": sd[src + "self_attn.o_proj.weight"],
                dst + "ffn.gate_up.weight": torch.cat(
                    [sd[src + "mlp.gate_proj.weight"], sd[src + "mlp.up_proj.weight"]]
                ),
                dst + "ffn.down.weight": sd[src + "mlp.down_proj.weight"],
            }
        )
        if qwen3:
            ours[dst + "attn.q_norm.weight"] = sd[src + "self_attn.q_norm.weight"]
            ours[dst + "attn.k_norm.weight"] = sd[src + "self_attn.k_norm.weight"]
    model = Transformer(cfg)
    model.load_state_dict({k: v.float() for k, v in ours.items()})
    return model
