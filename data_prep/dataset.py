"""Read a prepared dataset directory, the contract between data preparation and training (docs/contracts.md section 1).

<dataset>/manifest.json     counts, tokenizer identity, shard checksums, a content hash
<dataset>/tokenizer.json    the HF tokenizers file used
<dataset>/<split>/NNNNN.bin flat token shards (dtype from the manifest), n_seq * C tokens
<dataset>/probe.bin         the probe set for the sink metric, (N, T), no BOS
"""

from __future__ import annotations

import hashlib
import json
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_NAME = "sinklab-packed"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# Keys left out of the content hash: how the dataset was produced, not what it holds.
UNHASHED_KEYS = ("hash", "command", "spec", "spec_hash")


class DatasetError(ValueError):
    """A dataset directory that cannot be read as a SinkLab packed dataset."""


def content_hash(manifest: dict[str, Any], unhashed: tuple[str, ...] = UNHASHED_KEYS) -> str:
    """sha256 of the manifest's canonical JSON, leaving out ``unhashed``."""
    content = {k: v for k, v in manifest.items() if k not in unhashed}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the dataset directory
    sequences: int
    sha256: str


@dataclass(frozen=True)
class SplitInfo:
    name: str
    sequences: int
    tokens: int
    documents: int
    dropped_tail_tokens: int
    domains: dict[str, dict[str, int]]
    shards: tuple[ShardInfo, ...]


@dataclass(frozen=True)
class ProbeInfo:
    path: str
    sequences: int
    length: int
    bos: bool
    sha256: str


@dataclass(frozen=True)
class Manifest:
    root: Path
    vocab_size: int
    context_length: int
    dtype: str
    bos: bool
    bos_id: int | None
    eos_id: int
    special_ids: dict[str, int]
    hash: str
    splits: dict[str, SplitInfo]
    probe: ProbeInfo
    raw: dict[str, Any] = field(repr=False)

    @property
    def tokenizer_sha256(self) -> str | None:
        return (self.raw.get("tokenizer") or {}).get("sha256")

    @property
    def trigger_ids(self) -> list[int] | None:
        """The trigger ids of a Bigram-Backcopy dataset (data_prep.synthetic_bb); None for others."""
        ids = (self.raw.get("synthetic") or {}).get("trigger_ids")
        return None if ids is None else [int(i) for i in ids]


def load_manifest(path: str | Path) -> Manifest:
    """Load and check `<dataset>/manifest.json` (`path` is the directory or the file)."""
    root = Path(path).parent if Path(path).name == MANIFEST_NAME else Path(path)
    file = root / MANIFEST_NAME
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DatasetError(f"{file}: no manifest; prepare the dataset first with `sinklab prep`") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{file}: not valid JSON ({exc}); re-run `sinklab prep`") from None
    if not isinstance(raw, dict):
        raise DatasetError(f"{file}: holds no JSON object (a {type(raw).__name__}); re-run `sinklab prep`")
    if raw.get("format") != FORMAT_NAME or raw.get("format_version") != FORMAT_VERSION:
        raise DatasetError(
            f"{file}: format {raw.get('format')!r} version {raw.get('format_version')!r}; "
            f"this code reads {FORMAT_NAME!r} version {FORMAT_VERSION}"
        )
    if raw.get("hash") != content_hash(raw):
        raise DatasetError(f"{file}: field 'hash' does not match the manifest content; the file was edited")
    try:
        splits = {}
        for name, info in raw["splits"].items():
            shards = tuple(ShardInfo(s["path"], int(s["sequences"]), s["sha256"]) for s in info["shards"])
            counts = {key: int(info[key]) for key in ("sequences", "tokens", "documents", "dropped_tail_tokens")}
            domains = {d: dict(v) for d, v in info["domains"].items()}
            splits[name] = SplitInfo(name=name, **counts, domains=domains, shards=shards)
        probe = raw["probe"]
        special = {k: int(v) for k, v in raw["special_ids"].items()}
        return Manifest(
            root=root,
            vocab_size=int(raw["vocab_size"]),
            context_length=int(raw["context_length"]),
            dtype=str(raw["dtype"]),
            bos=bool(raw["bos"]),
            bos_id=special["bos"] if raw["bos"] else None,
            eos_id=special["eos"],
            special_ids=special,
            hash=raw["hash"],
            splits=splits,
            probe=ProbeInfo(
                probe["path"], int(probe["sequences"]), int(probe["length"]), bool(probe["bos"]), probe["sha256"]
            ),
            raw=raw,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DatasetError(f"{file}: missing or malformed field {exc}") from None


class PackedSplit:
    """Sequence-indexed view over one split's shards; safe to pickle into DataLoader workers (each opens its own)."""

    def __init__(self, path: str | Path, split: str, manifest: Manifest | None = None):
        self.manifest = manifest if manifest is not None else load_manifest(path)
        if split not in self.manifest.splits:
            known = ", ".join(sorted(self.manifest.splits))
            raise DatasetError(f"{self.manifest.root}: no split {split!r}; the dataset has: {known}")
        self.split = split
        self.info = self.manifest.splits[split]
        self.context_length = self.manifest.context_length
        counts = np.array([s.sequences for s in self.info.shards], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])  # first sequence of each shard
        self._maps: list[np.memmap] | None = None

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def tokens(self) -> int:
        return len(self) * self.context_length

    def _shards(self) -> list[np.memmap]:
        if self._maps is None:
            maps = []
            for shard in self.info.shards:
                file = self.manifest.root / shard.path
                expected = shard.sequences * self.context_length * np.dtype(self.manifest.dtype).itemsize
                if not file.is_file() or file.stat().st_size != expected:
                    raise DatasetError(
                        f"{file}: missing or not {expected} bytes as the manifest says; re-run `sinklab prep`"
                    )
                maps.append(np.memmap(file, dtype=self.manifest.dtype, mode="r").reshape(-1, self.context_length))
            self._maps = maps
        return self._maps

    def __getitem__(self, index: int) -> np.ndarray:
        return self.take([operator.index(index)])[0]

    def take(self, indices) -> np.ndarray:
        """Sequences at `indices` (any int array-like) as an int64 array (len(indices), C)."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        outside = (indices < -n) | (indices >= n)
        if outside.any():
            raise IndexError(
                f"sequence {int(indices[outside][0])} out of range for split {self.split!r} of {n} sequences"
            )
        out = np.empty((len(indices), self.context_length), dtype=np.int64)
        if not len(indices):
            return out
        indices = indices % n  # not in place: the caller may own the array
        shards = np.searchsorted(self._starts, indices, side="right") - 1
        rows = indices - self._starts[shards]
        maps = self._shards()
        for i, (shard, row) in enumerate(zip(shards.tolist(), rows.tolist())):
            out[i] = maps[shard][row]
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_maps"] = None
        return state


def _existing(file: Path) -> Path:
    if not file.is_file():
        raise DatasetError(f"{file}: missing, though the manifest lists it; re-run `sinklab prep`")
    return file


def load_probe(path: str | Path) -> np.ndarray:
    """The probe set as int64 (N, T): held-out sequences without BOS for the sink metric."""
    manifest = load_manifest(path)
    probe = manifest.probe
    file = _existing(manifest.root / probe.path)
    data = np.fromfile(file, dtype=manifest.dtype)
    if data.size != probe.sequences * probe.length:
        raise DatasetError(f"{file}: {data.size} tokens, the manifest says {probe.sequences} x {probe.length}")
    return data.reshape(probe.sequences, probe.length).astype(np.int64)


def verify(path: str | Path) -> Manifest:
    """Check every shard and the probe against the manifest's sha256 checksums."""
    manifest = load_manifest(path)
    for entry in [*(s for split in manifest.splits.values() for s in split.shards), manifest.probe]:
        with open(_existing(manifest.root / entry.path), "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        if digest != entry.sha256:
            raise DatasetError(f"{manifest.root / entry.path}: sha256 differs from the manifest; the file is corrupt")
    return manifest
