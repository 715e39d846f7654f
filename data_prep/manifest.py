"""Finish a preparation: place shards, the probe set and the tokenizer, and write manifest.json last."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from data_prep.dataset import FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, content_hash
from data_prep.errors import DataPrepError
from data_prep.pack import SPLITS, shard_file
from sinklab_io.atomic import atomic_write

COUNTS = ("sequences", "documents", "document_tokens", "dropped_tail_tokens")  # a split's, summed over its chunks
DOCUMENT_COUNTS = ("documents_read", "empty_documents", "invalid_utf8_documents", "filtered_documents")

if TYPE_CHECKING:
    from data_prep.prepare import Preparation
    from data_prep.runner import Chunk
    from data_prep.tokenizer import LoadedTokenizer


def spec_differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """'context_length: 256 there, 128 here; inputs differ' for an error message."""
    parts = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a != b:
            short = all(not isinstance(v, (list, dict)) for v in (a, b))
            parts.append(f"{key}: {a!r} there, {b!r} here" if short else f"{key} differ")
    return "; ".join(parts) or "same settings, different manifest"


class ProbeReservoir:
    """A uniform, seeded reservoir sample of `size` probe windows, kept in arrival order."""

    def __init__(self, size: int, seed: int):
        self.size = size
        self.rng = np.random.default_rng([seed, 41])
        self.seen = 0
        self.items: list[tuple[int, list[int]]] = []

    def add(self, windows: list[list[int]]) -> None:
        for window in windows:
            if len(self.items) < self.size:
                self.items.append((self.seen, window))
            else:
                slot = int(self.rng.integers(0, self.seen + 1))
                if slot < self.size:
                    self.items[slot] = (self.seen, window)
            self.seen += 1

    def array(self, dtype: str) -> np.ndarray:
        return np.array([w for _, w in sorted(self.items, key=lambda item: item[0])], dtype=dtype)


def probe_entry(probe: np.ndarray, bos: bool, source: str) -> dict[str, Any]:
    """The manifest's entry of the probe set ``probe`` (N, T), written as probe.bin."""
    n, length = probe.shape
    digest = hashlib.sha256(probe.tobytes()).hexdigest()
    return {"path": "probe.bin", "sequences": n, "length": length, "bos": bos, "source": source, "sha256": digest}


def write_manifest(out: Path, tokenizer: tuple[str, str], content: dict, command: str, spec: dict) -> dict[str, Any]:
    """Write ``out/tokenizer.json`` (``tokenizer``: source, text), then ``out/manifest.json`` with the content hash."""
    source, text = tokenizer
    atomic_write(out / "tokenizer.json", text)
    entry = {"source": source, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "file": "tokenizer.json"}
    manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "tokenizer": entry, **content}
    manifest |= {"command": command or " ".join(sys.argv), "spec": spec, "spec_hash": content_hash(spec, ())}
    manifest["hash"] = content_hash(manifest)
    atomic_write(out / MANIFEST_NAME, json.dumps(manifest, indent=1) + "\n")
    return manifest


def finalize(
    prep: Preparation, tok: LoadedTokenizer, dtype: str, used: list[tuple[Chunk, dict[str, Any]]]
) -> dict[str, Any]:
    cfg, out, staging = prep.cfg, prep.out, prep.staging
    pool = prep.probe_pool
    if len(pool.items) < cfg.probe_sequences:
        raise DataPrepError(
            f"{(cfg.val_inputs or cfg.inputs)[0]}: the validation documents hold only {len(pool.items)} windows of "
            f"{cfg.probe_length} tokens for the probe set, {cfg.probe_sequences} needed; add validation data "
            "(--val-input, a larger --val-fraction) or lower --probe-sequences/--probe-length"
        )
    splits: dict[str, Any] = {}
    for split in SPLITS:
        shutil.rmtree(out / split, ignore_errors=True)  # from a finalize interrupted before the manifest
        (out / split).mkdir(parents=True)
        shards, domains = [], {}
        totals: Counter = Counter()
        for chunk, result in used:
            info = result["splits"][split]
            totals.update({key: info[key] for key in COUNTS})
            for domain, counts in info["domains"].items():
                domains.setdefault(domain, Counter()).update(counts)
            if info["sequences"]:
                rel = f"{split}/{len(shards):05d}.bin"
                target = out / rel
                source = shard_file(staging, chunk.task.name, split)
                try:
                    os.link(source, target)  # same file system: free
                except OSError:
                    shutil.copyfile(source, target)
                shards.append({"path": rel, "sequences": info["sequences"], "sha256": info["sha256"]})
        splits[split] = {
            "sequences": totals["sequences"],
            "tokens": totals["sequences"] * cfg.context_length,
            **{key: totals[key] for key in COUNTS[1:]},
            "domains": dict(sorted(domains.items())),
            "shards": shards,
        }
    probe = pool.array(dtype)
    atomic_write(out / "probe.bin", memoryview(probe).cast("B"))
    counts: Counter = Counter()
    for chunk, result in used:
        counts.update(chunk.counts)
        counts["invalid_utf8_documents"] += result["invalid_utf8"]
    content = {
        "vocab_size": tok.vocab_size,
        "special_ids": dict(sorted(tok.special_ids.items())),
        "bos": cfg.bos,
        "context_length": cfg.context_length,
        "dtype": dtype,
        "packing": "[BOS] tokens EOS per document, concatenated, cut into sequences of context_length; tail dropped",
        "splits": splits,
        "probe": probe_entry(probe, False, "held-out validation documents, windows inside one document"),
        "documents": {key: counts[key] for key in DOCUMENT_COUNTS},
        "invalid_utf8": "undecodable bytes replaced by U+FFFD and counted",
        **{key: getattr(cfg, key) for key in ("max_tokens", "seed")},
    }
    manifest = write_manifest(out, (tok.source, tok.json_text), content, cfg.command, prep.spec)
    shutil.rmtree(staging, ignore_errors=True)
    return manifest


def existing_dataset(out: Path, spec: dict[str, Any], staged: bool = False) -> dict[str, Any] | None:
    """The manifest when ``out`` holds the dataset ``spec`` describes, None when it holds none; else an error."""
    manifest_file = out / MANIFEST_NAME
    if manifest_file.is_file():
        try:
            existing = json.loads(manifest_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise DataPrepError(f"{manifest_file}: not valid JSON; delete {out} or choose another --out") from None
        if existing.get("spec_hash") == content_hash(spec, ()):
            return existing
        diff = spec_differences(existing.get("spec", {}), spec)
        raise DataPrepError(f"{out}: already holds a different dataset ({diff}); choose another --out or delete it")
    leftovers = [p for p in ("train", "val", "probe.bin") if (out / p).exists()]
    if leftovers and not staged:
        raise DataPrepError(
            f"{out}: holds {', '.join(leftovers)} but no manifest.json; choose another --out or delete them"
        )
    return None
