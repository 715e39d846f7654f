"""Conversion to and from HF transformers ``LlamaForCausalLM``.

Only the default variant (RoPE, pre-norm RMSNorm, SwiGLU, concat heads, softmax, causal, no
biases or sink tokens) is a Llama; any other value is refused with the field that differs.

    sinklab export-hf CHECKPOINT --out DIR [--config run/config.yaml] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from sinklab_io.outputs import atomic_directory

from .config import AttentionConfig, BiasConfig, ModelConfig
from .loading import load_pretrained
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
        if k not in ("clip_gamma", "clip_zeta", "normalizer", "kernel")
    ]
    + [
        ("biases.kind", "none"),
    ]
)


class NotALlama(ValueError):
    """The model config has a field HF LlamaForCausalLM cannot express."""


def check_llama_compatible(cfg: ModelConfig) -> None:
    for path, needed in _LLAMA_FIELDS:
        value: Any = cfg
        for part in path.split("."):
            value = getattr(value, part)
        if value != needed:
            raise NotALlama(f"arch.{path}={value!r}: HF LlamaForCausalLM expresses only {needed!r}")


def llama_config(cfg: ModelConfig):
    from transformers import LlamaConfig

    check_llama_compatible(cfg)
    return LlamaConfig(
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
        mlp_bias=False,
    )


def to_hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    check_llama_compatible(model.config)
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
    return {k: v.detach().clone() for k, v in out.items()}


def to_hf(model: Transformer):
    """A ``LlamaForCausalLM`` with this model's weights (fp32)."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM(llama_config(model.config))
    hf.load_state_dict(to_hf_state_dict(model), strict=not model.config.tie_embeddings)
    return hf.eval()


def from_hf(hf_model) -> Transformer:
    """Import an HF Llama (a ``LlamaForCausalLM`` or a save_pretrained directory)."""
    if isinstance(hf_model, (str, os.PathLike)):
        from transformers import LlamaForCausalLM

        hf_model = LlamaForCausalLM.from_pretrained(hf_model, torch_dtype=torch.float32)
    c = hf_model.config
    for name, needed in (
        ("num_key_value_heads", c.num_attention_heads),
        ("hidden_act", "silu"),
        ("attention_bias", False),
        ("mlp_bias", False),
    ):
        if getattr(c, name, needed) != needed:
            raise NotALlama(f"HF config {name}={getattr(c, name)!r}: SinkLab imports only {needed!r}")
    rope = getattr(c, "rope_parameters", None) or {"rope_type": "default", "rope_theta": getattr(c, "rope_theta", 1e4)}
    if rope.get("rope_type", "default") != "default":
        raise NotALlama(f"HF config rope_type={rope['rope_type']!r}: SinkLab imports only 'default'")
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
        attention=AttentionConfig(),
        biases=BiasConfig(),
    )
    if cfg.head_dim != getattr(c, "head_dim", cfg.head_dim):
        raise NotALlama(f"HF config head_dim={c.head_dim}: SinkLab needs hidden_size / num_attention_heads")
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
    model = Transformer(cfg)
    model.load_state_dict({k: v.float() for k, v in ours.items()})
    return model


def export_hf(
    model: Transformer,
    out_dir: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    tokenizer: str | os.PathLike | None = None,
) -> Path:
    """Write a save_pretrained directory (config.json + model.safetensors) atomically."""
    hf = to_hf(model).to(dtype)
    with atomic_directory(out_dir, kind="sinklab export-hf") as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            shutil.copy(tokenizer, tmp / "tokenizer.json")
    return Path(out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sinklab export-hf", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="SinkLab export dir, Lightning .ckpt or consolidated state dict")
    parser.add_argument("--out", required=True, help="output directory (HF save_pretrained layout)")
    parser.add_argument("--config", help="model/run config, needed for a bare state-dict file")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--tokenizer", help="tokenizer.json to copy next to the weights")
    args = parser.parse_args(argv)
    try:
        model = load_pretrained(args.checkpoint, config=args.config)
        out = export_hf(model, args.out, getattr(torch, args.dtype), args.tokenizer)
    except (NotALlama, ValueError, OSError) as err:  # OSError: NotOurs, a missing file, a full disk
        print(f"sinklab export-hf: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} (LlamaForCausalLM, {model.num_parameters() / 1e6:.2f}M parameters, {args.dtype})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
