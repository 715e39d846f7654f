"""Tiny packed datasets in the manifest format of data_prep.dataset (contracts.md section 1), for the
tests of every part (imported by name: tests/ is on sys.path through tests/conftest.py).

Train sequence i is ``(i * C + arange(C)) % (V - 8) + 8``-like but distinguishable: its first
token is ``8 + i % (V - 8)``, so a batch tells which sequences it holds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from data_prep.dataset import FORMAT_NAME, FORMAT_VERSION, content_hash

SPECIAL = {"bos": 1, "eos": 2, "pad": 0}


def train_sequence(i: int, C: int, V: int) -> np.ndarray:
    rng = np.random.default_rng(10_000 + i)
    seq = rng.integers(8, V, size=C)
    seq[0] = 8 + i % (V - 8)
    return seq


def make_dataset(
    root: Path,
    *,
    n_train: int = 64,
    n_val: int = 8,
    C: int = 16,
    V: int = 64,
    probe: tuple[int, int] = (8, 12),
    bos: bool = False,
    shards: int = 2,
) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, n in (("train", n_train), ("val", n_val)):
        (root / split).mkdir(exist_ok=True)
        data = (
            np.stack([train_sequence(i, C, V) for i in range(n)])
            if split == "train"
            else np.random.default_rng(7).integers(8, V, size=(n, C))
        )
        data = data.astype(np.uint16)
        per = -(-n // shards)
        infos = []
        for s in range(shards):
            part = data[s * per : (s + 1) * per]
            if not len(part):
                continue
            rel = f"{split}/{s:05d}.bin"
            part.tofile(root / rel)
            infos.append(
                {"path": rel, "sequences": int(len(part)), "sha256": hashlib.sha256(part.tobytes()).hexdigest()}
            )
        splits[split] = {
            "sequences": n,
            "tokens": n * C,
            "documents": n,
            "dropped_tail_tokens": 0,
            "domains": {"synthetic": {"documents": n}},
            "shards": infos,
        }
    pr = np.random.default_rng(3).integers(8, V, size=probe).astype(np.uint16)
    pr.tofile(root / "probe.bin")
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "vocab_size": V,
        "special_ids": SPECIAL,
        "bos": bos,
        "context_length": C,
        "dtype": "uint16",
        "splits": splits,
        "probe": {
            "path": "probe.bin",
            "sequences": probe[0],
            "length": probe[1],
            "bos": False,
            "sha256": hashlib.sha256(pr.tobytes()).hexdigest(),
        },
    }
    manifest["hash"] = content_hash(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return root
