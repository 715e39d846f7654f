"""SinkLab's model as a transformers model: the remote code of an export (``hf_bundle``), whose
``generate`` keeps keys and values in the model's own cache (``SinkLabCache``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .cache import StreamingCache
from .config import EXPORT_FORMAT, ModelConfig
from .transformer import Transformer

# transformers 5 names the cache ``cache``, 4.x ``past_key_values``
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
_TRANSFORMERS_5 = CACHE_FIELD == "cache"


class SinkLabConfig(PretrainedConfig):
    """config.json: the SinkLab model config under ``sinklab`` and the usual HF names beside it."""

    model_type = "sinklab"

    def __init__(self, sinklab: dict | None = None, sinklab_format: int = EXPORT_FORMAT, **kwargs):
        if sinklab_format > EXPORT_FORMAT:
            raise ValueError(
                f"config.json: sinklab_format={sinklab_format}, but this code reads format {EXPORT_FORMAT} at most; "
                "export the checkpoint again with the SinkLab that trained it"
            )
        self.sinklab, self.sinklab_format = None, sinklab_format
        if sinklab is not None:  # with what HF tools read (lm-eval's context length, the vocabulary)
            cfg = ModelConfig.from_dict(sinklab)
            self.sinklab = cfg.to_dict()
            self.vocab_size, self.hidden_size = cfg.vocab_size, cfg.d_model
            self.num_hidden_layers, self.num_attention_heads = cfg.n_layers, cfg.n_heads
            self.num_key_value_heads = cfg.kv_heads
            self.max_position_embeddings = cfg.max_seq_len
            kwargs["tie_word_embeddings"] = cfg.tie_embeddings
        super().__init__(**kwargs)


class SinkLabCache(StreamingCache):
    """Every key and value of the sequence so far (no eviction), and how many tokens it holds."""

    is_compileable = False

    def __init__(self, config: ModelConfig):
        super().__init__(config, n_initial=0, n_recent=1 << 62)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens consumed (sink tokens are the model's own, not the caller's)."""
        return self.seen - self.sink_tokens if self.seen else 0


class SinkLabForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = SinkLabConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"} if _TRANSFORMERS_5 else ["model.lm_head.weight"]

    def __init__(self, config: SinkLabConfig):
        super().__init__(config)
        self.model = Transformer(ModelConfig.from_dict(config.sinklab))
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Weights come from the checkpoint; the model's fixed buffers from its own constructor."""

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.lm_head

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model keeps its own cache

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        cache: SinkLabCache | None = None,
        past_key_values: SinkLabCache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits of the real tokens; rows of equal length (no padding); attentions with the extra keys first."""
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("SinkLab models take no padding: pass rows of equal length (attention_mask all ones)")
        cache = cache if cache is not None else past_key_values
        if use_cache and cache is None:
            cache = SinkLabCache(self.model.config)
        out = self.model(input_ids, cache=cache, output_attentions=bool(output_attentions))
        loss = None
        if labels is not None:
            logits = out.logits[:, :-1].float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
        attentions = tuple(out.attentions) if out.attentions is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=out.logits, attentions=attentions, **{CACHE_FIELD: cache})

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.LongTensor,
        cache: SinkLabCache | None = None,
        past_key_values: SinkLabCache | None = None,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool = True,
        **kwargs,
    ) -> dict:
        """Only the tokens the cache has not seen."""
        cache = cache if cache is not None else past_key_values
        if cache is not None:
            input_ids = input_ids[:, cache.get_seq_length() :]
        return {"input_ids": input_ids, CACHE_FIELD: cache, "attention_mask": attention_mask, "use_cache": use_cache}
