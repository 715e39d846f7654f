"""SinkLab's model: one LLaMA-style decoder whose every paper factor is a config field (torch only)."""

from .cache import StreamingCache
from .config import PRESETS, ConfigError, ModelConfig
from .loading import load_pretrained, save_pretrained
from .sharded import has_sharded, is_sharded, local_part
from .transformer import ModelOutput, Transformer

__all__ = [
    "ConfigError",
    "ModelConfig",
    "ModelOutput",
    "PRESETS",
    "StreamingCache",
    "Transformer",
    "has_sharded",
    "is_sharded",
    "load_pretrained",
    "local_part",
    "save_pretrained",
]
