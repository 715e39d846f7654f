"""Prepare a dataset: read, tokenize in N worker processes, pack and write shards, resumably.

Work happens in `<out>/.partial/`; `manifest.json` is written last, so `<out>` holds a finished dataset
or none (docs/data_prep.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from data_prep.dataset import MANIFEST_NAME
from data_prep.errors import DataPrepError
from data_prep.manifest import ProbeReservoir, existing_dataset, finalize, spec_differences
from data_prep.pack import PackConfig, val_mask
from data_prep.readers import ByteCounter, ReaderOptions, expand_inputs
from data_prep.runner import Chunk, ChunkRunner, iter_chunks
from data_prep.tokenizer import LoadedTokenizer, load_tokenizer, token_dtype, train_bpe, trained_tokenizer
from sinklab_io.atomic import atomic_write
from sinklab_io.outputs import Additions

STAGING = ".partial"


def default_workers() -> int:
    """The cores this process may use (all of them unless pinned)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class PrepConfig:
    """Everything `sinklab prep` takes; each option in docs/data_prep.md."""

    inputs: list[str]
    out: str
    val_inputs: list[str] = field(default_factory=list)
    val_fraction: float = 0.01
    tokenizer: str | None = None  # tokenizer.json or HF dir; None: train one
    vocab_size: int = 32000
    tokenizer_train_chars: int = 100_000_000
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    context_length: int = 2048
    bos: bool = True
    dtype: str | None = None
    domains: list[str] | None = None
    max_tokens: int | None = None
    probe_sequences: int = 100
    probe_length: int = 64
    workers: int = field(default_factory=default_workers)
    seed: int = 0
    chunk_chars: int = 4 << 20
    reader: ReaderOptions = field(default_factory=ReaderOptions)
    hf_val_split: str | None = None
    progress: bool = True
    command: str = ""


@dataclass
class PrepResult:
    out: Path
    manifest: dict[str, Any]
    reused: bool  # the directory already held this dataset
    elapsed_s: float
    chunks_tokenized: int = 0
    chunks_resumed: int = 0
    warnings: list[str] = field(default_factory=list)


def _validate(cfg: PrepConfig) -> None:
    checks = [
        (cfg.context_length >= 2, f"--context-length {cfg.context_length}: must be at least 2"),
        (0 <= cfg.val_fraction < 1, f"--val-fraction {cfg.val_fraction}: must be in [0, 1)"),
        (cfg.probe_sequences >= 1 and cfg.probe_length >= 1, "--probe-sequences and --probe-length must be positive"),
        (cfg.workers >= 1, f"--workers {cfg.workers}: must be at least 1"),
        (
            cfg.max_tokens is None or cfg.max_tokens >= cfg.context_length,
            f"--max-tokens {cfg.max_tokens}: must be at least one sequence ({cfg.context_length} tokens)",
        ),
        (bool(cfg.inputs), "--input: give at least one input"),
    ]
    for ok, message in checks:
        if not ok:
            raise DataPrepError(message)


def _input_entries(refs: list[str], out: Path) -> list[dict[str, Any]]:
    entries, root = [], out.resolve()
    for ref in refs:
        path = Path(ref)
        if path.exists():
            resolved = path.resolve()  # inputs inside the dataset directory stay valid if it moves
            name = f"<out>/{resolved.relative_to(root)}" if resolved.is_relative_to(root) else str(resolved)
            entries.append({"path": name, "bytes": path.stat().st_size if path.is_file() else None})
        else:
            entries.append({"path": ref, "bytes": None})
    return entries


def build_spec(cfg: PrepConfig, inputs: list[str], val_inputs: list[str]) -> dict[str, Any]:
    """What determines the output bytes (not the worker count or the progress bar)."""
    out = Path(cfg.out)
    if cfg.tokenizer is None:
        tokenizer: dict[str, Any] = {"train_vocab_size": cfg.vocab_size, "train_chars": cfg.tokenizer_train_chars}
    else:
        tok = Path(cfg.tokenizer)
        tok = tok / "tokenizer.json" if tok.is_dir() else tok
        digest = hashlib.sha256(tok.read_bytes()).hexdigest() if tok.is_file() else None
        tokenizer = {"file_sha256": digest, "roles": [cfg.bos_token, cfg.eos_token, cfg.pad_token]}
    return {
        "format": cfg.reader.fmt,
        "inputs": _input_entries(inputs, out),
        "val_inputs": _input_entries(val_inputs, out),
        "reader": asdict(cfg.reader) | {"hf_val_split": cfg.hf_val_split},
        "domains": sorted(cfg.domains) if cfg.domains else None,
        "tokenizer": tokenizer,
        **{key: getattr(cfg, key) for key in ("context_length", "bos", "dtype", "max_tokens", "val_fraction")},
        "probe": [cfg.probe_sequences, cfg.probe_length],
        **{key: getattr(cfg, key) for key in ("seed", "chunk_chars")},
    }


# What `sinklab prep` itself puts in --out (raw/: the embedded corpus's source shards)
DATASET_ENTRIES = {MANIFEST_NAME, "tokenizer.json", "train", "val", "probe.bin", STAGING, "raw"}


def claim_output_dir(out: str | Path) -> None:
    """Make `out` ready for a dataset: new, empty or one of `sinklab prep`."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataPrepError(f"--out {out}: is a file; choose a directory path")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in DATASET_ENTRIES)
        if foreign:
            shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
            raise DataPrepError(
                f"--out {out}: holds {shown}, which is not part of a SinkLab dataset; choose an empty or new directory"
            )
        if not os.access(out, os.W_OK | os.X_OK):
            raise DataPrepError(f"--out {out}: not writable by this user; choose a writable directory")
        return
    try:
        out.mkdir(parents=True)
    except OSError as error:
        raise DataPrepError(f"--out {out}: cannot create it ({error.strerror}); choose a writable directory") from None


class Preparation:
    def __init__(self, cfg: PrepConfig):
        _validate(cfg)
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.staging = self.out / STAGING
        self.inputs = expand_inputs(cfg.inputs, cfg.reader.fmt)
        self.val_inputs = expand_inputs(cfg.val_inputs, cfg.reader.fmt) if cfg.val_inputs else []
        self.spec = build_spec(cfg, self.inputs, self.val_inputs)
        self.counter = ByteCounter()
        self.seen_domains: set[str] = set()
        self.warnings: list[str] = []
        self.probe_pool = ProbeReservoir(cfg.probe_sequences, cfg.seed)

    def streams(self) -> list[tuple[str, list[str], ReaderOptions]]:
        streams = [("main", self.inputs, self.cfg.reader)]
        if self.val_inputs:
            streams.append(("val", self.val_inputs, self.cfg.reader))
        elif self.cfg.reader.fmt == "hf" and self.cfg.hf_val_split:
            streams.append(("val", self.inputs, replace(self.cfg.reader, hf_split=self.cfg.hf_val_split)))
        return streams

    @property
    def carve_fraction(self) -> float:
        """Fraction of main-stream documents held out: none when validation has its own stream."""
        return 0.0 if len(self.streams()) > 1 else self.cfg.val_fraction

    def tokenizer(self) -> LoadedTokenizer:
        file = self.staging / "tokenizer.json"
        cfg = self.cfg
        roles = {"bos": cfg.bos_token, "eos": cfg.eos_token, "pad": cfg.pad_token}
        if cfg.tokenizer is not None:
            loaded = load_tokenizer(cfg.tokenizer, roles)
        elif file.is_file():  # trained by an interrupted run with the same spec
            json_text = file.read_text(encoding="utf-8")
            loaded = trained_tokenizer(Tokenizer.from_str(json_text), cfg.vocab_size, json_text)
        else:
            loaded = trained_tokenizer(train_bpe(self._training_texts(), cfg.vocab_size), cfg.vocab_size)
            self.counter.value = 0  # the progress bar counts the packing pass only
        if cfg.tokenizer is None and loaded.vocab_size < cfg.vocab_size:
            self.warnings.append(
                f"--vocab-size {cfg.vocab_size:,}: the corpus supports only {loaded.vocab_size:,} ids "
                f"(the tokenizer found nothing more to merge); the dataset has {loaded.vocab_size:,}"
            )
        if not file.is_file():
            atomic_write(file, loaded.json_text.encode("utf-8"))
        return loaded

    def _training_texts(self) -> Iterator[str]:
        """Train-split documents of the main stream, up to `tokenizer_train_chars`."""
        budget = self.cfg.tokenizer_train_chars
        name, inputs, options = self.streams()[0]
        for chunk in iter_chunks(self, name, inputs, options):
            is_val = val_mask(self.cfg.seed, name, chunk.task.index, len(chunk.task.texts), self.carve_fraction)
            for text, held_out in zip(chunk.task.texts, is_val):
                if held_out:
                    continue
                yield text[:budget]
                budget -= len(text)
                if budget <= 0:
                    return

    def check_output_dir(self) -> dict[str, Any] | None:
        """The existing manifest when `out` already holds this dataset; errors for anything else."""
        existing = existing_dataset(self.out, self.spec, staged=self.staging.exists())
        spec_file, done = self.staging / "spec.json", self.staging / "done"
        if existing is not None or not spec_file.is_file():
            return existing
        staged = json.loads(spec_file.read_text(encoding="utf-8"))
        if staged == self.spec:
            return None
        if not (self.staging / "tokenizer.json").is_file() and not (done.is_dir() and any(done.iterdir())):
            shutil.rmtree(self.staging)  # an earlier attempt that died before any work: nothing to keep
            return None
        raise DataPrepError(
            f"{self.staging}: an unfinished preparation with other settings ({spec_differences(staged, self.spec)}); "
            "delete it or use the same settings"
        )

    def run(self, undo: bool = True) -> PrepResult:
        start = time.perf_counter()
        existing = self.check_output_dir()
        if existing is not None:
            return PrepResult(self.out, existing, True, time.perf_counter() - start)
        additions = Additions(self.out)
        try:
            for sub in ("shards", "done"):
                (self.staging / sub).mkdir(parents=True, exist_ok=True)
            (self.staging / "spec.json").write_text(json.dumps(self.spec, indent=1), encoding="utf-8")
            tok = self.tokenizer()
            dtype = token_dtype(tok.vocab_size, self.cfg.dtype)
            used, tokenized, resumed = self._pack_all(tok, dtype)
            self._check_domains(used)
            manifest = finalize(self, tok, dtype, used)
        except Exception:  # an interruption keeps the finished chunks to resume from
            if undo:
                additions.remove()
            raise
        return PrepResult(self.out, manifest, False, time.perf_counter() - start, tokenized, resumed, self.warnings)

    def _check_domains(self, used: list[tuple[Chunk, dict[str, Any]]]) -> None:
        if not any(r["splits"]["train"]["sequences"] for _, r in used):
            known = ", ".join(sorted(self.seen_domains)) or "none"
            raise DataPrepError(
                f"{self.cfg.inputs[0]}: no full training sequence of {self.cfg.context_length} tokens"
                f"{' after --domains ' + ','.join(self.cfg.domains) if self.cfg.domains else ''} (domains in the input: {known})"
            )
        for domain in self.cfg.domains or []:
            if domain not in self.seen_domains:
                self.warnings.append(
                    f"--domains: {domain!r} does not occur in the input (it has: {', '.join(sorted(self.seen_domains))})"
                )

    def _pack_all(self, tok: LoadedTokenizer, dtype: str) -> tuple[list[tuple[Chunk, dict[str, Any]]], int, int]:
        cfg = self.cfg
        pack_config = PackConfig(
            staging=str(self.staging),
            bos_id=tok.special_ids["bos"] if cfg.bos else None,
            eos_id=tok.special_ids["eos"],
            dtype=dtype,
            val_fraction=self.carve_fraction,
            **{key: getattr(cfg, key) for key in ("context_length", "probe_length", "probe_sequences", "seed")},
        )
        runner = ChunkRunner(self, pack_config)
        runner.run()
        if runner.budget is not None and runner.train_sequences < runner.budget:
            self.warnings.append(
                f"--max-tokens {cfg.max_tokens} is more than the corpus holds; used all "
                f"{runner.train_sequences * cfg.context_length} training tokens"
            )
        return runner.used, runner.tokenized, runner.resumed


def prepare(cfg: PrepConfig, undo: bool = True) -> PrepResult:
    """Prepare (or find already prepared) the dataset `cfg` describes; ``undo``: remove what it added on an error."""
    return Preparation(cfg).run(undo)
