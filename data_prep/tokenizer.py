"""Tokenizers (HF `tokenizers`): load one or train a byte-level BPE on the corpus; find the special ids."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data_prep.errors import DataPrepError

# Special tokens of a tokenizer trained here, in this order: ids 0, 1, 2.
TRAINED_SPECIALS = {"bos": "<|bos|>", "eos": "<|eos|>", "pad": "<|pad|>"}
# Names tried, in order, when a loaded tokenizer does not say which token is which.
KNOWN_NAMES = {
    "bos": ("<|bos|>", "<s>", "<|begin_of_text|>", "<bos>", "[CLS]", "<|startoftext|>"),
    "eos": ("<|eos|>", "</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>", "[SEP]"),
    "pad": ("<|pad|>", "<pad>", "[PAD]", "<|padding|>"),
}


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Tokenizer
    json_text: str  # the serialized tokenizer.json copied into the dataset
    source: str  # path it came from, or "trained: byte-level BPE ..."
    special_ids: dict[str, int]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.json_text.encode("utf-8")).hexdigest()

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def as_transformers(self):
        """A transformers ``PreTrainedTokenizerFast`` with the BOS/EOS/PAD roles resolved here."""
        from transformers import PreTrainedTokenizerFast

        roles = {f"{role}_token": self.tokenizer.id_to_token(i) for role, i in self.special_ids.items()}
        return PreTrainedTokenizerFast(tokenizer_object=self.tokenizer, **roles)


MAX_TRAINED_VOCAB = 1 << 20


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of `vocab_size` ids (3 of them special) trained on `texts`."""
    if vocab_size < 256 + len(TRAINED_SPECIALS) + 1:
        raise DataPrepError(
            f"--vocab-size {vocab_size} is too small; a byte-level BPE needs at least {256 + len(TRAINED_SPECIALS) + 1}"
        )
    if vocab_size > MAX_TRAINED_VOCAB:  # the trainer reserves memory by the requested size (1e10 asked for 566 GB)
        raise DataPrepError(
            f"--vocab-size {vocab_size:,} is more than a trained BPE can use; give at most "
            f"{MAX_TRAINED_VOCAB:,} (the largest vocabularies in use hold about 256K ids)"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(TRAINED_SPECIALS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def trained_tokenizer(tokenizer: Tokenizer, vocab_size: int, json_text: str | None = None) -> LoadedTokenizer:
    """A tokenizer from `train_bpe`; `json_text` is its saved file when reloaded from one."""
    ids = {role: tokenizer.token_to_id(name) for role, name in TRAINED_SPECIALS.items()}
    text = tokenizer.to_str() if json_text is None else json_text
    return LoadedTokenizer(tokenizer, text, f"trained: byte-level BPE, vocab {vocab_size}", ids)


def load_tokenizer(ref: str, overrides: dict[str, str | None] | None = None) -> LoadedTokenizer:
    """Load a tokenizer.json or local HF tokenizer directory; roles from `overrides`, its configs, or `KNOWN_NAMES`."""
    path = Path(ref)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise DataPrepError(
            f"{ref}: no tokenizer.json there; --tokenizer takes a tokenizer.json file or a local HF tokenizer directory"
        )
    try:
        json_text = file.read_text(encoding="utf-8")
        tokenizer = Tokenizer.from_str(json_text)
    except Exception as exc:  # not UTF-8 text, not JSON, not a tokenizer: the library's errors differ
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise DataPrepError(
            f"{file}: not a valid HF tokenizers file ({first}); give a tokenizer.json saved by `tokenizers`"
        ) from None
    names: dict[str, str | None] = {}
    for config_name in ("special_tokens_map.json", "tokenizer_config.json"):
        config_file = file.parent / config_name
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise DataPrepError(f"{config_file}: not valid JSON ({exc}); fix or remove it") from None
            if not isinstance(config, dict):
                raise DataPrepError(f"{config_file}: holds no JSON object; fix or remove it")
            for role in ("bos", "eos", "pad"):
                value = config.get(f"{role}_token")
                if isinstance(value, dict):  # {"content": "<s>", ...} in tokenizer_config.json
                    value = value.get("content")
                names.setdefault(role, value if isinstance(value, str) else None)
    names |= {role: value for role, value in (overrides or {}).items() if value}
    ids: dict[str, int] = {}
    for role in ("bos", "eos", "pad"):
        candidates = [names[role]] if names.get(role) else list(KNOWN_NAMES[role])
        found = [token_id for token_id in map(tokenizer.token_to_id, candidates) if token_id is not None]
        if found:
            ids[role] = found[0]
        elif names.get(role):
            raise DataPrepError(
                f"{file}: the {role.upper()} token {names[role]!r} is not in the vocabulary; pass --{role}-token with one that is"
            )
    if "eos" not in ids:
        raise DataPrepError(f"{file}: no EOS token found (tried {', '.join(KNOWN_NAMES['eos'])}); pass --eos-token")
    return LoadedTokenizer(tokenizer, json_text, str(file), {"bos": ids["eos"], "pad": ids["eos"]} | ids)


def token_dtype(vocab_size: int, forced: str | None = None) -> str:
    """uint16 when every id fits, else uint32; a forced dtype must fit."""
    if forced is None:
        return "uint16" if vocab_size <= 1 << 16 else "uint32"
    if forced == "uint16" and vocab_size > 1 << 16:
        raise DataPrepError(
            f"--dtype uint16 holds ids below 65536 but the tokenizer has {vocab_size} ids; use --dtype uint32 or leave --dtype out"
        )
    if forced not in ("uint16", "uint32"):
        raise DataPrepError(f"--dtype {forced!r}: choose uint16 or uint32")
    return forced
