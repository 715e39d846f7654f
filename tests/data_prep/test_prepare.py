"""End-to-end preparation on tiny corpora, checked against an independent reference packing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dp_helpers import config, make_docs
from tokenizers import Tokenizer

from data_prep.dataset import DatasetError, PackedSplit, load_manifest, load_probe, verify
from data_prep.errors import DataPrepError
from data_prep.prepare import prepare
from data_prep.runner import ChunkRunner

C = 32


def reference_shards(
    texts: list[str], tokenizer: Path, chunk_chars: int, bos: bool = True
) -> tuple[list[np.ndarray], int, int]:
    """Chunks of >= chunk_chars characters, each packed as [BOS] ids EOS and cut into C: the
    expected shards, the total document tokens and the total dropped tail."""
    tok = Tokenizer.from_file(str(tokenizer))
    chunks, current, chars = [], [], 0
    for text in texts:
        current.append(text)
        chars += len(text)
        if chars >= chunk_chars:
            chunks.append(current)
            current, chars = [], 0
    chunks += [current] if current else []
    shards, doc_tokens, dropped = [], 0, 0
    for chunk in chunks:
        stream = []
        for text in chunk:
            stream += ([0] if bos else []) + tok.encode(text, add_special_tokens=False).ids + [1]
        n = len(stream) // C
        doc_tokens += len(stream)
        dropped += len(stream) - n * C
        if n:
            shards.append(np.array(stream[: n * C], dtype=np.uint16))
    return shards, doc_tokens, dropped


def read_shards(out: Path, split: str) -> list[np.ndarray]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [np.fromfile(out / s["path"], dtype=np.uint16) for s in manifest["splits"][split]["shards"]]


def all_files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_packed_tokens_match_the_reference_exactly(tmp_path, corpus, tokenizer_file):
    out = tmp_path / "ds"
    result = prepare(config(corpus, out, tokenizer_file, workers=2))
    m = result.manifest
    for split, seed, n in (("train", 1, 400), ("val", 2, 120)):
        texts = [d["text"] for d in make_docs(n, seed, max_words=60 if split == "train" else 120)]
        shards, doc_tokens, dropped = reference_shards(texts, tokenizer_file, 4000)
        got = read_shards(out, split)
        assert len(got) == len(shards) > 1
        for a, b in zip(got, shards):
            np.testing.assert_array_equal(a, b)
        info = m["splits"][split]
        assert info["document_tokens"] == doc_tokens == info["tokens"] + info["dropped_tail_tokens"]
        assert info["dropped_tail_tokens"] == dropped and info["documents"] == n
        assert sum(d["tokens"] for d in info["domains"].values()) == doc_tokens
        assert info["domains"]["A"]["documents"] == n // 2
    # the reader API sees the same sequences, across shard boundaries
    train = PackedSplit(out, "train")
    flat = np.concatenate(read_shards(out, "train")).reshape(-1, C)
    assert len(train) == len(flat) == m["splits"]["train"]["sequences"] and train.tokens == len(flat) * C
    for i in (0, len(flat) // 2, len(flat) - 1, -1):
        assert train[i].dtype == np.int64 and train[i].tolist() == flat[i].tolist()
    assert train.take([3, 0]).tolist() == flat[[3, 0]].tolist()
    manifest = verify(out)
    assert manifest.hash == m["hash"] and manifest.bos_id == 0 and manifest.eos_id == 1 and manifest.dtype == "uint16"
    assert (out / "tokenizer.json").read_bytes() == tokenizer_file.read_bytes()
    assert not (out / ".partial").exists()


def test_probe_is_held_out_without_bos(tmp_path, corpus, tokenizer_file):
    out = tmp_path / "ds"
    prepare(config(corpus, out, tokenizer_file))
    probe = load_probe(out)
    assert probe.shape == (20, 16) and probe.dtype == np.int64
    assert not np.isin(probe, [0, 1, 2]).any()  # no BOS, no EOS, no PAD
    tok = Tokenizer.from_file(str(tokenizer_file))
    val_ids = [tok.encode(d["text"], add_special_tokens=False).ids for d in make_docs(120, 2, max_words=120)]

    def inside(row, docs):
        return any(doc[i : i + len(row)] == row for doc in docs for i in range(len(doc) - len(row) + 1))

    assert all(inside(row, val_ids) for row in probe.tolist())
    assert len({tuple(r) for r in probe.tolist()}) == 20
    (out / "probe.bin").unlink()
    for read in (load_probe, verify):
        with pytest.raises(DatasetError, match=r"probe\.bin: missing, though the manifest lists it; re-run"):
            read(out)


def test_second_run_reuses_and_a_different_dataset_is_refused(tmp_path, corpus, tokenizer_file):
    out = tmp_path / "ds"
    first = prepare(config(corpus, out, tokenizer_file))
    before = all_files(out)
    again = prepare(config(corpus, out, tokenizer_file, workers=2))
    assert again.reused and again.manifest["hash"] == first.manifest["hash"] and all_files(out) == before
    with pytest.raises(DataPrepError, match=r"already holds a different dataset \(context_length: 32 there, 64 here\)"):
        prepare(config(corpus, out, tokenizer_file, context_length=64))
    assert all_files(out) == before


def test_interrupted_run_resumes_to_identical_bytes(tmp_path, corpus, tokenizer_file, monkeypatch):
    reference = tmp_path / "uninterrupted"
    prepare(config(corpus, reference, tokenizer_file, workers=2))

    out = tmp_path / "interrupted"
    done, consume = [], ChunkRunner._consume

    def interrupt_after_three(runner, chunk, result):
        stop = consume(runner, chunk, result)
        done.append(result["name"])
        if len(done) == 3:
            raise KeyboardInterrupt
        return stop

    with pytest.raises(KeyboardInterrupt), monkeypatch.context() as patch:
        patch.setattr(ChunkRunner, "_consume", interrupt_after_three)
        prepare(config(corpus, out, tokenizer_file))
    assert not (out / "manifest.json").exists()
    markers = sorted(p.stem for p in (out / ".partial" / "done").glob("*.json"))
    assert done[:3] == markers[:3]

    resumed = prepare(config(corpus, out, tokenizer_file, workers=2))
    assert resumed.chunks_resumed >= 3 and resumed.chunks_tokenized > 0
    assert all_files(out) == all_files(reference)


def test_token_budget_takes_the_first_sequences_whatever_the_worker_count(tmp_path, corpus, tokenizer_file):
    full = tmp_path / "full"
    prepare(config(corpus, full, tokenizer_file))
    budget = 50 * C + 7  # not a multiple of C: floor to 50 sequences
    one = prepare(config(corpus, tmp_path / "one", tokenizer_file, max_tokens=budget))
    two = prepare(config(corpus, tmp_path / "two", tokenizer_file, max_tokens=budget, workers=2))
    assert one.manifest["hash"] == two.manifest["hash"]
    train = one.manifest["splits"]["train"]
    assert train["sequences"] == 50 and train["tokens"] == 50 * C
    assert train["document_tokens"] == train["tokens"] + train["dropped_tail_tokens"]
    assert sum(d["tokens"] for d in train["domains"].values()) == train["document_tokens"]
    first = np.concatenate(read_shards(full, "train"))[: 50 * C]
    np.testing.assert_array_equal(np.concatenate(read_shards(tmp_path / "one", "train")), first)
    assert train["documents"] < 400 and not one.warnings
    # the validation split is not cut by the training budget
    assert one.manifest["splits"]["val"] == json.loads((full / "manifest.json").read_text())["splits"]["val"]


def test_budget_larger_than_the_corpus_warns_and_uses_all(tmp_path, corpus, tokenizer_file):
    result = prepare(config(corpus, tmp_path / "ds", tokenizer_file, max_tokens=10**9))
    used = result.manifest["splits"]["train"]["tokens"]
    assert result.warnings == [
        f"--max-tokens 1000000000 is more than the corpus holds; used all {used} training tokens"
    ]


def test_domain_filter_keeps_only_the_named_domains(tmp_path, corpus, tokenizer_file):
    result = prepare(config(corpus, tmp_path / "ds", tokenizer_file, domains=["A", "Pile-CC"]))
    m = result.manifest
    assert set(m["splits"]["train"]["domains"]) == {"A"} and set(m["splits"]["val"]["domains"]) == {"A"}
    assert m["splits"]["train"]["documents"] == 200 and m["splits"]["val"]["documents"] == 60
    assert m["documents"]["filtered_documents"] == 260 and m["documents"]["documents_read"] == 520
    assert result.warnings == ["--domains: 'Pile-CC' does not occur in the input (it has: A, B)"]
    with pytest.raises(
        DataPrepError,
        match=r"no full training sequence of 32 tokens after --domains Pile-CC \(domains in the input: A, B\)",
    ):
        prepare(config(corpus, tmp_path / "none", tokenizer_file, domains=["Pile-CC"]))
    assert not (tmp_path / "none").exists()


def test_val_fraction_carves_validation_from_the_input(tmp_path, corpus, tokenizer_file):
    result = prepare(
        config(corpus, tmp_path / "ds", tokenizer_file, val_inputs=[], val_fraction=0.3, probe_sequences=5)
    )
    m = result.manifest
    assert m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == 400
    assert 80 < m["splits"]["val"]["documents"] < 160
    manifest = load_manifest(tmp_path / "ds")
    assert manifest.probe.sequences == 5 and not manifest.probe.bos


KILLABLE = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from dp_helpers import config
from data_prep.prepare import prepare
from data_prep.runner import ChunkRunner
from pathlib import Path
consume = ChunkRunner._consume
ChunkRunner._consume = lambda runner, chunk, result: time.sleep(0.25) or consume(runner, chunk, result)
corpus = {"train": Path(sys.argv[2]), "val": Path(sys.argv[3])}
prepare(config(corpus, Path(sys.argv[4]), Path(sys.argv[5])))
"""


def test_killed_process_resumes_to_identical_bytes(tmp_path, corpus, tokenizer_file):
    """SIGKILL the whole process group mid-run (no cleanup code runs), then resume."""
    reference = tmp_path / "uninterrupted"
    prepare(config(corpus, reference, tokenizer_file))
    out = tmp_path / "killed"
    args = [str(Path(__file__).parent), str(corpus["train"]), str(corpus["val"]), str(out), str(tokenizer_file)]
    proc = subprocess.Popen([sys.executable, "-c", KILLABLE, *args], start_new_session=True)
    deadline = time.monotonic() + 60
    while len(list((out / ".partial" / "done").glob("*.json"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    resumed = prepare(config(corpus, out, tokenizer_file))
    assert resumed.chunks_resumed >= 2
    assert all_files(out) == all_files(reference)
