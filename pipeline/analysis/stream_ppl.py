"""`sinklab stream-ppl`: streaming perplexity with an ``x + y`` KV cache (Xiao et al. 2024, Table 10)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline import metric_names as N
from pipeline.analysis import streaming
from pipeline.analysis.inputs import at_least, default_text
from pipeline.analysis.streamers import CacheSpec, group_by_capacity, perplexity
from pipeline.analysis.subject import add_model_arguments, log_back, model_name, write_json, writer
from sinklab_io.mappings import settings_of
from sinklab_io.outputs import NotOurs, claim_file

BY = "sinklab stream-ppl"


@dataclass(frozen=True)
class StreamPpl:
    model: str
    reading: streaming.Reading
    caches: list[CacheSpec]
    max_tokens: int
    full: bool
    out: Path | None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sinklab stream-ppl", description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    streaming.add_text_arguments(p)
    p.add_argument("--max-tokens", type=int, default=2048, help="evaluate on the first N tokens of the text")
    streaming.add_cache_argument(p, " ".join(streaming.DEFAULT_CACHES))
    p.add_argument("--full", action="store_true", help="also report the full-context perplexity (one forward pass)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (auto: the GPU when one is visible)")
    return p


def check_args(args: argparse.Namespace) -> StreamPpl:
    caches = streaming.parse_caches(args.cache, "stream-ppl")
    at_least(args, BY, max_tokens=2)
    return settings_of(StreamPpl, args, reading=settings_of(streaming.Reading, args), caches=caches)


def main(argv: list[str] | None = None) -> int:
    s = check_args(build_parser().parse_args(argv))
    specs, r = s.caches, s.reading
    by = writer(BY, [s.model])
    if s.out is not None:
        try:
            claim_file(s.out, "sinklab stream-ppl: --out", by)
        except NotOurs as error:
            raise SystemExit(str(error)) from None
    streamer, ids, subject = streaming.load_subject(s.model, r, s.max_tokens)
    ids = torch.tensor(ids[: s.max_tokens], dtype=torch.long, device=streamer.device)
    if ids.numel() < 2:
        raise SystemExit("sinklab stream-ppl: the text has fewer than 2 tokens")
    if unfilled := [str(spec) for spec in specs if spec.n_initial + spec.n_recent >= ids.numel()]:
        raise SystemExit(
            f"sinklab stream-ppl: the text has {ids.numel()} tokens, which fit whole in cache {', '.join(unfilled)}: "
            "nothing would be evicted, so that is no streaming perplexity; give a longer --text (or --max-tokens) "
            "or a smaller --cache"
        )
    caches = {spec: str(spec) for spec in specs} | ({CacheSpec(0, ids.numel()): "full"} if s.full else {})
    streaming.check_positions(subject, caches, "keep x+y (and --max-tokens for --full) within it")
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
    if s.full:
        results["full"] = perplexity(streamer.full_nll(ids))
    head, row = " | ".join(results), " | ".join(f"{v:.2f}" for v in results.values())
    separator = "|---" * (len(results) + 1) + "|"
    print(
        f"Streaming perplexity, {ids.numel()} tokens\n\n| model | {head} |\n{separator}\n| {model_name(s.model)} | {row} |"
    )
    if subject.run_id is not None:
        text = f"dataset {r.dataset} (val)" if r.dataset else str(r.text or default_text())
        values = {N.stream_perplexity(key.replace("+", "_")): value for key, value in results.items()}
        log_back(subject, "stream", values, {"text": text, "tokens": ids.numel(), "bos_first": first_is_bos}, None)
        print(f"logged to MLflow run {subject.run_id} as stream/ppl_<x>_<y>", file=sys.stderr)
    if s.out:
        entry = {"tokens": ids.numel(), "bos_first": first_is_bos, "perplexity": results, "seconds": seconds}
        write_json(subject.header() | entry, s.out, by)
    return 0
