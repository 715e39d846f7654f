"""Packing and its small helpers, on hand-computed cases."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from data_prep.cli import count
from data_prep.errors import DataPrepError
from data_prep.manifest import ProbeReservoir
from data_prep.pack import pack_documents, probe_candidates, val_mask
from data_prep.tokenizer import token_dtype

DOCS = [[5, 6, 7], [8], [9, 10]]  # with BOS=0, EOS=1: 0 5 6 7 1 | 0 8 1 | 0 9 10 1  (12 tokens)


def test_pack_with_bos_cuts_sequences_and_drops_the_tail():
    tokens, used, dropped = pack_documents(DOCS, 5, bos_id=0, eos_id=1, dtype="uint16")
    assert tokens.tolist() == [0, 5, 6, 7, 1, 0, 8, 1, 0, 9]
    assert (used, dropped) == (3, 2)
    tokens, used, dropped = pack_documents(DOCS, 4, bos_id=0, eos_id=1, dtype="uint32")
    assert tokens.dtype == np.uint32 and len(tokens) == 12 and dropped == 0


def test_pack_without_bos_uses_eos_as_the_only_boundary():
    tokens, used, dropped = pack_documents(DOCS, 4, bos_id=None, eos_id=1, dtype="uint16")
    assert tokens.tolist() == [5, 6, 7, 1, 8, 1, 9, 10]  # 9 tokens: 5 6 7 1 8 1 9 10 1
    assert (used, dropped) == (3, 1)


def test_pack_limit_uses_only_the_documents_it_needs():
    # one sequence of 4: the first document (5 tokens) covers it; its last token is the tail
    tokens, used, dropped = pack_documents(DOCS, 4, bos_id=0, eos_id=1, dtype="uint16", limit=1)
    assert tokens.tolist() == [0, 5, 6, 7] and (used, dropped) == (1, 1)
    # two sequences of 4 = 8 tokens: documents 1 and 2 end exactly at 8
    tokens, used, dropped = pack_documents(DOCS, 4, bos_id=0, eos_id=1, dtype="uint16", limit=2)
    assert tokens.tolist() == [0, 5, 6, 7, 1, 0, 8, 1] and (used, dropped) == (2, 0)
    tokens, used, dropped = pack_documents(DOCS, 4, bos_id=0, eos_id=1, dtype="uint16", limit=0)
    assert len(tokens) == 0 and (used, dropped) == (0, 0)


def test_pack_of_nothing_and_of_less_than_one_sequence():
    tokens, used, dropped = pack_documents([], 4, bos_id=0, eos_id=1, dtype="uint16")
    assert len(tokens) == 0 and (used, dropped) == (0, 0)
    tokens, used, dropped = pack_documents([[7]], 4, bos_id=0, eos_id=1, dtype="uint16")
    assert len(tokens) == 0 and (used, dropped) == (1, 3)


def test_probe_candidates_are_whole_windows_inside_one_document():
    docs = [list(range(10, 19)), [1, 2], list(range(30, 34))]  # 9 tokens -> 2 windows of 4; 2 -> 0; 4 -> 1
    windows = probe_candidates(docs, 4, wanted=10, rng=np.random.default_rng(0))
    assert windows == [[10, 11, 12, 13], [14, 15, 16, 17], [30, 31, 32, 33]]
    two = probe_candidates(docs, 4, wanted=2, rng=np.random.default_rng(0))
    assert len(two) == 2 and all(w in windows for w in two)


def test_probe_reservoir_keeps_size_items_in_arrival_order_deterministically():
    def sample(seed):
        pool = ProbeReservoir(3, seed)
        for start in range(0, 40, 4):
            pool.add([[i] for i in range(start, start + 4)])
        return pool.array("uint16").ravel().tolist()

    first = sample(0)
    assert len(first) == 3 and first == sorted(first) and first == sample(0)
    assert len({tuple(sample(s)) for s in range(6)}) > 1  # the draw depends on the seed


def test_val_mask_is_seeded_and_all_for_the_val_stream():
    a = val_mask(0, "main", 3, 1000, 0.1)
    assert a.tolist() == val_mask(0, "main", 3, 1000, 0.1).tolist()
    assert 50 < a.sum() < 150 and a.tolist() != val_mask(1, "main", 3, 1000, 0.1).tolist()
    assert val_mask(0, "val", 3, 5, 0.0).all() and not val_mask(0, "main", 3, 5, 0.0).any()


def test_count_suffixes():
    assert [count(v) for v in ("4096", "50M", "5B", "1.5k", "2m")] == [4096, 50_000_000, 5_000_000_000, 1500, 2_000_000]
    with pytest.raises(argparse.ArgumentTypeError, match="50 mega"):
        count("50 mega")


def test_token_dtype():
    assert token_dtype(4096) == "uint16" and token_dtype(65536) == "uint16" and token_dtype(65537) == "uint32"
    assert token_dtype(4096, "uint32") == "uint32"
    with pytest.raises(DataPrepError, match="--dtype uint16 holds ids below 65536 but the tokenizer has 70000 ids"):
        token_dtype(70000, "uint16")
