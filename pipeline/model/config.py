"""Typed model configuration: one dataclass tree (every factor the paper varies is a field), presets, validation."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from pipeline.kernels.tiled import MaskKind, Normalizer

from .attention_ops import OPS, op_spec

# the one place each named shape is written down (docs/model.md, "Presets")
PRESETS: dict[str, dict[str, int]] = {
    "llama-60m": dict(vocab_size=32000, d_model=768, n_layers=10, n_heads=8, d_ffn=1536, max_seq_len=2048),
    "llama-1b": dict(vocab_size=32000, d_model=2048, n_layers=22, n_heads=32, d_ffn=5632, max_seq_len=2048),
    "tiny": dict(vocab_size=32000, d_model=128, n_layers=4, n_heads=4, d_ffn=512, max_seq_len=256),
    "micro": dict(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ffn=64, max_seq_len=64),
    "bb": dict(vocab_size=32, d_model=64, n_layers=1, n_heads=1, d_ffn=256, max_seq_len=64),
    "bb-tiny": dict(vocab_size=32, d_model=32, n_layers=1, n_heads=1, d_ffn=128, max_seq_len=32),
}
# What a preset sets; the trainer replaces vocab_size by the dataset's.
SHAPE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ffn", "max_seq_len")
# The section that holds a ModelConfig: a run config's `arch:` and a checkpoint's hyper_parameters["arch"]
ARCH = "arch"
# Older names, refused with today's: fields under `arch`, and every run-config path that moved
RENAMED = {"attention.kernel": "attention.feature_map", "attention.scale": "attention.alpha"}
OLD_PATHS = {f"{ARCH}.{old}": f"{ARCH}.{new}" for old, new in RENAMED.items()} | {"model.optim": "optim"}
# The format of the config a remote-code export writes (config.json); code of a lower format refuses it.
EXPORT_FORMAT = 1
# the ops registered in attention_ops.py, so that the CLI lists them; validation reads OPS itself
AttentionOp = Literal[tuple(OPS)]


class ConfigError(ValueError):
    """A model config field has a value the model cannot build."""


def refuse_renamed(key: str, where: str, prefix: str = "") -> None:
    """Raises ConfigError where ``key`` (a dotted run-config path, ``arch.attention.kernel`` or
    ``model.optim.lr``) is an older name; ``prefix`` spells it as given (``--`` on a command line)."""
    for old, new in OLD_PATHS.items():
        if key == old or key.startswith(old + "."):
            raise ConfigError(f"{where}{prefix}{key} is now {prefix}{new}{key[len(old) :]}; give it under that name")


def refuse_old_layout(config: dict[str, Any], where: str) -> None:
    """Raises ConfigError for a run config of an older layout (``model.model``, ``model.optim``, a renamed field)."""
    module = config.get("model")
    module = module.get("init_args", module) if isinstance(module, dict) else None
    if isinstance(module, dict) and "model" in module:
        raise ConfigError(
            f"{where}: `model.model` is an older config format, no longer read "
            f"(today's configs hold the architecture in a top-level `{ARCH}:` section)"
        )
    if isinstance(module, dict) and "optim" in module:
        refuse_renamed("model.optim", f"{where}: ")
    arch = config.get(ARCH)
    for old in RENAMED:
        section, _, name = old.partition(".")
        if isinstance(arch, dict) and name in (arch.get(section) or {}):
            refuse_renamed(f"{ARCH}.{old}", f"{where}: ")


@dataclass
class AttentionConfig:
    """How queries meet keys (paper section 7.4, Tables 6, 14, 15; Gu et al. 2025, appendix A.3 mitigations)."""

    op: AttentionOp = "softmax"
    """The attention operation, a name registered in attention_ops.OPS (docs/model.md's table)."""
    normalizer: Normalizer = "sum"
    """Z_i of a non-softmax op: sum (Σ_j sim, or its p-norm), abs_clamp (max(|Σ_j sim|, 1)) or none (1)."""
    feature_map: Literal["identity", "elu1", "mlp"] = "identity"
    """φ of op kernel: identity, elu+1 or a two-layer MLP per layer (Table 15)."""
    alpha: float = 1.0
    """The normalisation factor α: Z becomes Z / α (Table 14 left)."""
    p: float = 1.0
    """p-normalisation (Eq. 43-44); for softmax, softmax(p s)^(1/p)."""
    clip_gamma: float = -0.03
    """γ of clipped softmax, clip((ζ − γ) softmax + γ, 0, 1)."""
    clip_zeta: float = 1.0
    """ζ of clipped softmax."""
    sink_logit: bool = False
    """A learned per-head logit in the softmax denominator (a key slot of value 0)."""
    gated: bool = False
    """A sigmoid gate on the attention output before W_O, from its input x (Qiu et al. 2025, G1)."""
    gate_granularity: Literal["headwise", "elementwise"] = "headwise"
    """headwise: one score per head, σ(x W), W ∈ R^{d×H}; elementwise: σ(x W_g), W_g ∈ R^{d×d}."""
    qk_norm: bool = False
    """RMSNorm on each head's queries and keys before the rotation (Dehghani et al.)."""


@dataclass
class BiasConfig:
    """Explicit attention biases (Tables 4, 5, 12 right, 13)."""

    kind: Literal["none", "kv", "k", "v"] = "none"
    """kv: learnable k* and v* as a key/value slot; k: learnable k*, fixed v*; v: learnable v* added to each head."""
    shared_heads: bool = False
    """One bias for all heads of a layer (Table 12 right)."""
    key_dims: int = 0
    """d_a, the learnable leading dimensions of k* (the rest zero); 0: all (Table 13)."""
    value_norm: float = 0.0
    """m of kind k's fixed v* = m v' (onehot) or m v'' (uniform)."""
    value_direction: Literal["onehot", "uniform"] = "onehot"
    """v' = [1, 0, .., 0] (onehot) or v'' = [1, .., 1] / √d_h (uniform) of kind k's fixed v* (Table 5)."""
    slot_logit: bool = False
    """A learned per-query-head logit added to the k*/v* slot's scores (0 at a fresh start; an added slot starts far below)."""


@dataclass
class ModelConfig:
    """One LLaMA-style decoder; every default is the paper's block."""

    preset: Literal[tuple(PRESETS)] | None = None
    """A named shape (docs/model.md, "Presets") that fills each shape field left null; null: llama-60m."""
    vocab_size: int | None = None
    """Token vocabulary; the trainer sets the dataset's."""
    d_model: int | None = None
    """Width of the residual stream."""
    n_layers: int | None = None
    """Number of blocks."""
    n_heads: int | None = None
    """Attention heads per block; divides d_model."""
    n_kv_heads: int | None = None
    """Key/value heads, each shared by n_heads / n_kv_heads query heads (grouped-query attention); None: n_heads."""
    d_ffn: int | None = None
    """Hidden width of the feed-forward block."""
    max_seq_len: int | None = None
    """Longest sequence the positional encodings cover."""
    norm_eps: float = 1e-5
    """ε of every norm."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of the weights."""
    tie_embeddings: bool = False
    """Share the token embedding with the LM head."""
    positional: Literal["rope", "nope", "sinusoidal", "learned", "relative", "t5", "alibi"] = "rope"
    """The positional encoding (docs/model.md; Table 3)."""
    rope_theta: float = 10000.0
    """RoPE's base θ."""
    relative_buckets: int = 32
    """B, the buckets of relative and T5 position biases (Eq. 6)."""
    relative_max_distance: int = 128
    """D, the distance the last relative bucket starts at (Eq. 6)."""
    norm_position: Literal["pre", "post"] = "pre"
    """Norms before each sublayer (pre) or after its residual sum (post)."""
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    """The norm of the blocks and the final norm; layernorm has its bias (GPT-2)."""
    ffn: Literal["swiglu", "geglu", "reglu", "relu", "gelu", "swish"] = "swiglu"
    """The feed-forward block's activation; the three *glu are gated."""
    head_merge: Literal["concat", "sum"] = "concat"
    """How the heads' outputs meet W_O: concatenated, or summed with W_O ∈ R^{d_h×d} (Table 12 left)."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    """The attention operation and its mitigations."""
    biases: BiasConfig = field(default_factory=BiasConfig)
    """Explicit attention biases."""
    sink_tokens: int = 0
    """Learnable tokens put before every sequence, 0 to 4 (Xiao et al. 2024; Table 4 row 2)."""
    mask: MaskKind = "causal"
    """The attention mask: causal, prefix LM (prefix_len) or sliding window (window)."""
    prefix_len: int = 0
    """p, the real tokens that see each other under mask prefix (Figure 5 left)."""
    window: int = 0
    """w under mask sliding: token t sees t−w+1..t (Figure 6 left)."""

    def __post_init__(self) -> None:
        if self.preset is not None and self.preset not in PRESETS:
            raise ConfigError(f"arch.preset={self.preset!r}: unknown preset; allowed: {', '.join(PRESETS)}")
        shape = PRESETS[self.preset or "llama-60m"]
        for name in SHAPE_FIELDS:
            if getattr(self, name) is None:
                setattr(self, name, shape[name])
        if isinstance(self.attention, dict):
            self.attention = _build(AttentionConfig, self.attention, "attention.")
        if isinstance(self.biases, dict):
            self.biases = _build(BiasConfig, self.biases, "biases.")
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def n_bias_slots(self) -> int:
        """Leading key columns that are not tokens: k*/v* slot, then the sink-logit column."""
        kv_slot = 1 if self.biases.kind in ("kv", "k") else 0
        return kv_slot + int(self.has_sink_logit)

    @property
    def has_sink_logit(self) -> bool:
        return self.attention.sink_logit or op_spec(self.attention.op).zero_logit

    def validate(self) -> None:
        _check_literals(self, "")
        _check_literals(self.attention, "attention.")
        _check_literals(self.biases, "biases.")
        for name in SHAPE_FIELDS:
            if getattr(self, name) < 1:
                raise ConfigError(f"arch.{name}={getattr(self, name)}: must be a positive integer")
        if self.d_model % self.n_heads:
            raise ConfigError(f"arch.n_heads={self.n_heads}: must divide d_model={self.d_model}")
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            raise ConfigError(
                f"arch.n_kv_heads={self.n_kv_heads}: must be a positive divisor of n_heads={self.n_heads}"
            )
        if self.positional == "rope" and self.head_dim % 2:
            raise ConfigError(f"arch.n_heads={self.n_heads}: rope needs an even head_dim, got {self.head_dim}")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ConfigError(f"arch.d_model={self.d_model}: sinusoidal PE needs an even d_model")
        if self.sink_tokens not in (0, 1, 2, 3, 4):
            raise ConfigError(f"arch.sink_tokens={self.sink_tokens}: allowed 0..4 (the paper uses 0, 1, 2)")
        if self.mask == "prefix" and self.prefix_len < 1:
            raise ConfigError(f"arch.prefix_len={self.prefix_len}: mask=prefix needs prefix_len >= 1")
        if self.mask == "sliding" and self.window < 1:
            raise ConfigError(f"arch.window={self.window}: mask=sliding needs window >= 1")
        if self.positional in ("relative", "t5") and self.relative_buckets < 2:
            raise ConfigError(f"arch.relative_buckets={self.relative_buckets}: must be >= 2")
        if self.positional in ("relative", "t5") and self.relative_max_distance <= self.relative_buckets // 2:
            raise ConfigError(
                f"arch.relative_max_distance={self.relative_max_distance}: must exceed relative_buckets/2"
            )
        a, b = self.attention, self.biases
        op = OPS[a.op]  # _check_literals has checked the name against OPS
        if a.alpha <= 0:
            raise ConfigError(f"arch.attention.alpha={a.alpha}: must be > 0")
        if a.p <= 0:
            raise ConfigError(f"arch.attention.p={a.p}: must be > 0")
        if a.normalizer not in op.normalizers:
            raise ConfigError(
                f"arch.attention.normalizer={a.normalizer}: op={a.op} takes {' or '.join(map(repr, op.normalizers))}"
            )
        if a.p != 1.0 and not op.p_norm:
            p_ops = " or ".join(name for name, spec in OPS.items() if spec.p_norm)
            raise ConfigError(f"arch.attention.p={a.p}: p-normalisation is defined for op {p_ops}")
        if a.p != 1.0 and a.normalizer != "sum":
            raise ConfigError(f"arch.attention.p: p-normalised {a.op} needs normalizer='sum'")
        if a.gate_granularity != "headwise" and not a.gated:
            raise ConfigError(f"arch.attention.gate_granularity={a.gate_granularity}: needs attention.gated=true")
        if a.sink_logit and not op.softmax:
            raise ConfigError(f"arch.attention.sink_logit=true: needs a softmax op, got op={a.op}")
        if not op.score_biases and self.positional in ("alibi", "relative", "t5"):
            raise ConfigError(
                f"arch.positional={self.positional}: additive score biases are undefined for op={a.op}; "
                "use rope, nope, sinusoidal or learned"
            )
        if b.key_dims < 0 or b.key_dims > self.head_dim:
            raise ConfigError(f"arch.biases.key_dims={b.key_dims}: allowed 0 (all) .. head_dim={self.head_dim}")
        if b.key_dims and b.kind not in ("kv", "k"):
            raise ConfigError(f"arch.biases.key_dims={b.key_dims}: only meaningful for kind 'kv' or 'k'")
        if b.slot_logit and (b.kind not in ("kv", "k") or not op.softmax):
            raise ConfigError("arch.biases.slot_logit=true: needs biases.kind 'kv' or 'k' and a softmax op")
        if b.value_norm and b.kind != "k":
            raise ConfigError(f"arch.biases.value_norm={b.value_norm}: the fixed v* belongs to kind 'k'")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        return _build(cls, dict(data), "")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A preset with overrides, nested as dicts (``attention={"op": "sigmoid"}``) or as ``attention__op``."""
        return cls.from_dict({**_overridden({}, overrides), "preset": name})

    def replace(self, **overrides: Any) -> ModelConfig:
        return ModelConfig.from_dict(_overridden(self.to_dict(), overrides))


def _overridden(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with each override set, given nested as dicts (merged into base's) or as ``attention__op``."""
    for key, value in overrides.items():
        *parents, leaf = key.split("__")
        node = base
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = (
            _overridden(node[leaf], value) if isinstance(value, dict) and isinstance(node.get(leaf), dict) else value
        )
    return base


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        refuse_renamed(f"{ARCH}.{prefix}{unknown[0]}", "")
        raise ConfigError(f"unknown field arch.{prefix}{unknown[0]}; allowed: {', '.join(sorted(names))}")
    hints = get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = _build(hint, value, f"{prefix}{key}.")
        kwargs[key] = value
    return cls(**kwargs)


def _check_literals(obj: Any, prefix: str) -> None:
    hints = get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        hint = hints[f.name]
        value = getattr(obj, f.name)
        if get_origin(hint) in (Union, UnionType):  # `X | None`: a shape field the preset fills, or the preset
            if value is None:
                continue
            hint = next(arg for arg in get_args(hint) if arg is not NoneType)
        if getattr(hint, "__origin__", None) is Literal:
            allowed = tuple(OPS) if hint == AttentionOp else get_args(hint)  # ops registered later count
            if value not in allowed:
                raise ConfigError(f"arch.{prefix}{f.name}={value!r}: allowed values are {', '.join(map(str, allowed))}")
        elif hint in (int, float, bool) and not isinstance(value, hint if hint is not float else (int, float)):
            raise ConfigError(f"arch.{prefix}{f.name}={value!r}: expected {hint.__name__}")
        elif hint is float and isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"arch.{prefix}{f.name}={value!r}: must be finite")
