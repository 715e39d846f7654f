"""Fixtures for the data_prep tests: a tiny tokenizer and a tiny corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
from dp_helpers import make_docs, write_jsonl

from data_prep.tokenizer import train_bpe


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory) -> Path:
    """A byte-level BPE of 300 ids trained on the test vocabulary (ids 0, 1, 2: BOS, EOS, PAD)."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe((d["text"] for d in make_docs(300, 99)), 300).save(str(path))
    return path


@pytest.fixture
def corpus(tmp_path) -> dict[str, Path]:
    """A train shard (.jsonl.zst, 400 documents) and a validation shard (.jsonl, 120 documents)."""
    return {
        "train": write_jsonl(tmp_path / "train.jsonl.zst", make_docs(400, 1), compress=True),
        "val": write_jsonl(tmp_path / "val.jsonl", make_docs(120, 2, max_words=120)),
    }
