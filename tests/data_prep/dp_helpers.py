"""Helpers for the data_prep tests: tiny corpora written by the tests themselves."""

from __future__ import annotations

import json
import random
from pathlib import Path

import zstandard

from data_prep.prepare import PrepConfig

WORDS = (
    "the sink of attention moves to the first token when softmax must give its mass somewhere and the "
    "model learns a bias that stores nothing while every query looks at it in each head of each layer"
).split()


def make_docs(n: int, seed: int, domains=("A", "B"), max_words: int = 60) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "text": " ".join(rng.choices(WORDS, k=rng.randint(1, max_words))),
            "meta": {"pile_set_name": domains[i % len(domains)]},
        }
        for i in range(n)
    ]


def write_jsonl(path: Path, records: list, compress: bool = False) -> Path:
    data = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode("utf-8")
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if compress else data)
    return path


def config(corpus: dict[str, Path], out: Path, tokenizer: Path, **overrides) -> PrepConfig:
    settings = dict(
        inputs=[str(corpus["train"])],
        val_inputs=[str(corpus["val"])],
        out=str(out),
        tokenizer=str(tokenizer),
        context_length=32,
        val_fraction=0.0,
        probe_sequences=20,
        probe_length=16,
        workers=1,
        chunk_chars=4000,
        progress=False,
    )
    settings.update(overrides)
    return PrepConfig(**settings)
