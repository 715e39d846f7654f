"""The Bigram-Backcopy generator (data_prep.synthetic_bb): the rule holds at every position, the
bigram steps follow the source's statistics, and `sinklab prep bb` writes a dataset the rest of
SinkLab reads."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from data_prep.cli import main
from data_prep.dataset import PackedSplit, load_probe, verify
from data_prep.synthetic_bb import bigram_source, generate, long_sequences


def test_bigram_source_counts_by_hand():
    # 'b' x5, 'a' x4, ' ' x3 (ids by frequency), 'c' x1 dropped with n_chars=3; pairs only within a text
    src = bigram_source(3, ["ab ab", "bca a", "b b"])
    assert src.chars == ["b", "a", " "]
    assert src.unigrams.tolist() == [5, 4, 3]
    expected = np.zeros((3, 3), dtype=np.int64)
    for prev, nxt in ["ab", "b ", " a", "ab", "ba", "a ", " a", "b ", " b"]:  # "bca a" -> "ba a"
        expected["ba ".index(prev), "ba ".index(nxt)] += 1
    assert np.array_equal(src.bigrams, expected)
    P = src.transitions()
    assert P[1].tolist() == pytest.approx([2 / 3, 0, 1 / 3]) and P[2].tolist() == pytest.approx([1 / 3, 2 / 3, 0])


def test_a_character_never_followed_moves_by_the_marginal():
    src = bigram_source(2, ["aab"])  # 'b' is never followed by anything
    assert src.transitions()[1].tolist() == pytest.approx([2 / 3, 1 / 3])


@pytest.fixture(scope="module")
def shakespeare():
    src = bigram_source(20)
    return src, src.transitions(), src.unigrams / src.unigrams.sum()


def test_every_token_after_a_trigger_copies_the_token_two_back(shakespeare):
    src, P, marginal = shakespeare
    k, bos = 3, len(src.chars)
    x = generate(P, marginal, k, bos, 2000, 48, np.random.default_rng(0))
    assert (x[:, 0] == bos).all() and (x[:, 1:] < bos).all()  # BOS first, nowhere else
    assert (x[:, 1] >= k).all()  # the first token is never a trigger
    after_trigger = x[:, 1:-1] < k
    assert after_trigger.sum() > 10_000  # the rule is exercised
    assert np.array_equal(x[:, 2:][after_trigger], x[:, :-2][after_trigger])
    assert (x[:, :-2][after_trigger] >= k).all()  # what is copied is never BOS nor a trigger


def test_bigram_steps_follow_the_source_statistics(shakespeare):
    src, P, marginal = shakespeare
    k, bos = 3, len(src.chars)
    x = generate(P, marginal, k, bos, 4000, 64, np.random.default_rng(1))
    prev, nxt = x[:, 1:-1].ravel(), x[:, 2:].ravel()
    markov = prev >= k
    counts = np.zeros_like(P)
    np.add.at(counts, (prev[markov], nxt[markov]), 1)
    rows = counts.sum(axis=1)
    checked = 0
    for i in range(k, len(src.chars)):
        if rows[i] < 2000:
            continue
        n, p = rows[i], P[i]
        assert np.all(np.abs(counts[i] / n - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-3), src.chars[i]
        checked += 1
    assert checked >= 10
    first = np.bincount(x[:, 1], minlength=len(src.chars)) / len(x)
    start = np.where(np.arange(len(src.chars)) < k, 0.0, marginal) / marginal[k:].sum()
    assert np.abs(first - start).max() < 0.03


def test_prep_bb_writes_a_dataset_sinklab_reads(tmp_path, capsys):
    out = tmp_path / "bb"
    argv = [
        "bb",
        "--out",
        str(out),
        "--vocab-size",
        "24",
        "--triggers",
        "2",
        "--context-length",
        "16",
        "--sequences",
        "5000",
        "--val-sequences",
        "40",
        "--probe-sequences",
        "7",
        "--probe-length",
        "12",
        "--seed",
        "3",
    ]
    assert main(argv) == 0
    manifest = verify(out)
    assert manifest.vocab_size == 24 and manifest.context_length == 16 and manifest.trigger_ids == [0, 1]
    assert manifest.bos_id == 22 and manifest.eos_id == 23 and manifest.probe.bos
    bb = manifest.raw["synthetic"]
    assert bb["trigger_chars"] == [" ", "e"] and len(bb["chars"]) == 22
    train = PackedSplit(out, "train", manifest)
    assert len(train) == 5000 and len(PackedSplit(out, "val", manifest)) == 40
    rows = train.take(range(5000))
    assert (rows[:, 0] == 22).all() and (rows[:, 1:] < 22).all()
    probe = load_probe(out)
    assert probe.shape == (7, 12) and (probe[:, 0] == 22).all()
    assert not np.array_equal(probe, rows[:7, :12])  # its own stream, not training rows
    text = Tokenizer.from_file(str(out / "tokenizer.json")).decode(rows[0].tolist(), skip_special_tokens=False)
    assert text.startswith("<|bos|>") and len(text) == len("<|bos|>") + 15
    before = (out / "train" / "00000.bin").read_bytes()
    assert main(argv) == 0 and "already prepared" in capsys.readouterr().out
    assert main(argv[:-1] + ["4"]) == 2  # another seed: refused, the dataset kept
    assert "seed: 3 there, 4 here" in capsys.readouterr().err
    again = tmp_path / "again"
    assert main(["bb", "--out", str(again)] + argv[3:]) == 0
    assert (again / "train" / "00000.bin").read_bytes() == before  # the bytes depend on the settings only
    assert json.loads((again / "manifest.json").read_text())["hash"] == manifest.hash
    # length-eval's sequences: any length, the same chain and rule, a stream of their own, repeatable
    long = long_sequences(manifest.raw, 30, 64)
    assert long.shape == (30, 64) and (long[:, 0] == 22).all() and (long[:, 1:] < 22).all()
    after_trigger = long[:, 1:-1] < 2
    assert after_trigger.any() and np.array_equal(long[:, 2:][after_trigger], long[:, :-2][after_trigger])
    assert np.array_equal(long, long_sequences(manifest.raw, 30, 64))
    assert not np.array_equal(long[:, :16], PackedSplit(out, "val", manifest).take(range(30)))
    assert long_sequences({"seed": 0}, 3, 8) is None  # not a Bigram-Backcopy dataset


@pytest.mark.parametrize(
    "args, message",
    [
        (["--vocab-size", "5", "--triggers", "3"], "--vocab-size 5 with --triggers 3: the vocabulary needs BOS, EOS"),
        (["--vocab-size", "500"], "--vocab-size 500: the source has only"),
        (["--context-length", "2"], "--context-length 2: must be at least 3"),
    ],
)
def test_prep_bb_bad_settings_one_line_and_nothing_left(tmp_path, capsys, args, message):
    out = tmp_path / "bb"
    assert main(["bb", "--out", str(out), "--sequences", "10", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sinklab prep: error: ") and message in err[0]
    assert "removed" not in err[0] and not out.exists()  # nothing was written, so nothing to report removed


def test_prep_bb_on_a_full_disk_one_line_and_nothing_left(tmp_path, capsys, monkeypatch):
    """A write error: one line, and no `.partial` left behind."""
    import errno
    import os

    import data_prep.synthetic_bb as bb

    write = bb.atomic_write

    def full_at_the_probe(path, data):
        if str(path).endswith("probe.bin"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return write(path, data)

    monkeypatch.setattr(bb, "atomic_write", full_at_the_probe)
    out = tmp_path / "bb"
    assert main(["bb", "--out", str(out), "--sequences", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"sinklab prep: error: writing {out}: No space left on device (the disk is full: free space or write "
        f"elsewhere); removed {out}, which this run had created"
    ]
    assert not out.exists()
