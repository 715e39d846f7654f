"""Streaming perplexity: cache configurations streamed as one batch against one at a time.

`sinklab stream-ppl` streams every x+y configuration that shares a capacity as the rows of
one batch. This times that against streaming the same configurations one after another,
in one process, on the same tokens, and checks that both give the same perplexities.
The last line is ``ratio=<one-at-a-time seconds over batched seconds>``.

    python benchmarks/bench_stream.py MODEL [--tokenizer T] [--max-tokens N] [--cache x+y ...]

MODEL and the options are `sinklab stream-ppl`'s (`make bench-stream` runs smollm2); here
--max-tokens defaults to 512 and --cache to 0+128 1+127 4+124, so that evictions happen.
"""
from __future__ import annotations

import sys
import time

import torch

from pipeline.analysis.streaming import CacheSpec, build_parser, group_by_capacity, load_subject, perplexity

DEFAULT = ("0+128", "1+127", "4+124")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.prog = "bench_stream.py"
    parser.set_defaults(max_tokens=512)
    args = parser.parse_args(argv)
    specs = [CacheSpec.parse(c) for c in (args.cache or DEFAULT)]
    if len(group_by_capacity(specs)) != 1:
        raise SystemExit("bench_stream.py: --cache configs must share x+y to stream as one batch")
    streamer, ids, _ = load_subject(args)
    ids = torch.tensor(ids[: args.max_tokens], dtype=torch.long)

    start = time.perf_counter()
    batched = streamer.nll(ids, specs)
    t_batched = time.perf_counter() - start
    start = time.perf_counter()
    single = torch.stack([streamer.nll(ids, [spec])[0] for spec in specs])
    t_single = time.perf_counter() - start

    print(f"{args.model}: {ids.numel()} tokens, {torch.get_num_threads()} threads")
    print(f"{'config':>8} {'batched ppl':>12} {'one-at-a-time ppl':>18}")
    for spec, b, s in zip(specs, batched, single):
        print(f"{str(spec):>8} {perplexity(b):12.3f} {perplexity(s):18.3f}")
    same = torch.allclose(batched, single, atol=1e-4, rtol=1e-4)
    print(f"one at a time {t_single:.1f} s, one batch of {len(specs)} {t_batched:.1f} s, same nll: {same}")
    print(f"ratio={t_single / t_batched:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
