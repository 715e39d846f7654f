"""Packing (the paper's Figure 1, right): each document becomes `[BOS] tokens EOS`, documents
are concatenated and cut into sequences of C tokens; the tail shorter than C is dropped and
counted. A worker packs one chunk, writes its shards, then its done marker.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sinklab_io.atomic import atomic_write

SPLITS = ("train", "val")


@dataclass(frozen=True)
class PackConfig:
    staging: str  # directory holding tokenizer.json, shards/ and done/
    context_length: int
    bos_id: int | None  # None: documents get no BOS
    eos_id: int
    dtype: str
    val_fraction: float
    probe_length: int
    probe_sequences: int
    seed: int


@dataclass
class ChunkTask:
    stream: str  # "main" (train, minus a --val-fraction) or "val" (all validation)
    index: int
    texts: list[str]
    domains: list[str]
    limit: int | None = None  # at most this many train sequences (token budget)

    @property
    def name(self) -> str:
        return f"{self.stream}-{self.index:05d}"


def shard_file(staging: str | Path, name: str, split: str) -> Path:
    return Path(staging) / "shards" / f"{name}.{split}.bin"


def marker_file(staging: str | Path, name: str) -> Path:
    return Path(staging) / "done" / f"{name}.json"


def val_mask(seed: int, stream: str, index: int, n_docs: int, fraction: float) -> np.ndarray:
    """Which documents of a chunk are validation: all of a "val" stream, else a seeded draw."""
    if stream == "val":
        return np.ones(n_docs, dtype=bool)
    return np.random.default_rng([seed, index, 17]).random(n_docs) < fraction


def pack_documents(
    ids: Sequence[Sequence[int]],
    context_length: int,
    bos_id: int | None,
    eos_id: int,
    dtype: str,
    limit: int | None = None,
) -> tuple[np.ndarray, int, int]:
    """(tokens of n_seq * C, documents used, dropped tail tokens) of `[BOS] ids EOS` per document, at most
    `limit` sequences; always: sum of used document lengths (with BOS/EOS) == n_seq * C + dropped."""
    extra = 2 if bos_id is not None else 1
    lengths = np.fromiter((len(x) + extra for x in ids), dtype=np.int64, count=len(ids))
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    n_seq, used = total // context_length, len(ids)
    if limit is not None and n_seq >= limit:
        n_seq = limit
        used = int(np.searchsorted(ends, n_seq * context_length, side="left")) + 1 if n_seq else 0
        total = int(ends[used - 1]) if used else 0
    stream = np.empty(total, dtype=dtype)
    ends, lengths = ends[:used], lengths[:used]
    content = np.ones(total, dtype=bool)
    if bos_id is not None:
        starts = ends - lengths
        stream[starts] = bos_id
        content[starts] = False
    stream[ends - 1] = eos_id
    content[ends - 1] = False
    stream[content] = np.fromiter(itertools.chain.from_iterable(ids[:used]), dtype=dtype, count=total - used * extra)
    return stream[: n_seq * context_length], used, total - n_seq * context_length


def probe_candidates(
    ids: Sequence[Sequence[int]], length: int, wanted: int, rng: np.random.Generator
) -> list[list[int]]:
    """Up to `wanted` of the non-overlapping `length`-token windows inside the documents, in document order."""
    slots = [(d, start) for d, doc in enumerate(ids) for start in range(0, len(doc) - length + 1, length)]
    if not slots:
        return []
    chosen = np.sort(rng.choice(len(slots), size=min(wanted, len(slots)), replace=False))
    return [list(ids[slots[i][0]][slots[i][1] : slots[i][1] + length]) for i in chosen]


_tokenizer = None
_config: PackConfig | None = None


def init_worker(config: PackConfig) -> None:
    """Pool initializer: one single-threaded tokenizer per worker process."""
    global _tokenizer, _config
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (it stops the pool)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    _tokenizer = Tokenizer.from_file(str(Path(config.staging) / "tokenizer.json"))
    _config = config


def encode(tokenizer, texts: list[str]) -> tuple[list[list[int]], int]:
    """Token ids per text; texts holding lone surrogates (from JSON escapes) are repaired and counted."""
    try:
        return [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)], 0
    except TypeError:
        clean = [text.encode("utf-8", errors="replace").decode("utf-8") for text in texts]
        repaired = sum(text != was for text, was in zip(clean, texts))
        return [e.ids for e in tokenizer.encode_batch_fast(clean, add_special_tokens=False)], repaired


def process_chunk(task: ChunkTask) -> dict[str, Any]:
    """Tokenize, pack and write one chunk; returns (and records in its marker) its counts."""
    config, tokenizer = _config, _tokenizer
    assert config is not None and tokenizer is not None, "init_worker was not called"
    ids, repaired = encode(tokenizer, task.texts)
    is_val = val_mask(config.seed, task.stream, task.index, len(ids), config.val_fraction)
    extra = 2 if config.bos_id is not None else 1
    result: dict[str, Any] = {"name": task.name, "limit": task.limit, "invalid_utf8": repaired, "splits": {}}
    for split in SPLITS:
        members = np.flatnonzero(is_val if split == "val" else ~is_val)
        split_ids = [ids[i] for i in members]
        limit = task.limit if split == "train" else None
        tokens, used, dropped = pack_documents(
            split_ids, config.context_length, config.bos_id, config.eos_id, config.dtype, limit
        )
        domains: dict[str, Counter] = {}
        for i, doc in zip(members[:used], split_ids[:used]):
            domains.setdefault(task.domains[i], Counter()).update(documents=1, tokens=len(doc) + extra)
        info = {
            "sequences": len(tokens) // config.context_length,
            "documents": used,
            "document_tokens": len(tokens) + dropped,
            "dropped_tail_tokens": dropped,
            "domains": domains,
            "sha256": None,
        }
        if len(tokens):
            view = memoryview(tokens).cast("B")
            atomic_write(shard_file(config.staging, task.name, split), view)
            info["sha256"] = hashlib.sha256(view).hexdigest()
        if split == "val":
            rng = np.random.default_rng([config.seed, task.index, 29 if task.stream == "main" else 31])
            result["probe_candidates"] = probe_candidates(split_ids, config.probe_length, config.probe_sequences, rng)
        result["splits"][split] = info
    atomic_write(marker_file(config.staging, task.name), json.dumps(result).encode("utf-8"))
    return result
