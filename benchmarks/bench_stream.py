"""Streaming perplexity: the two shortcuts of `sinklab stream-ppl` and `passkey`, each timed
against going without it, in one process, on the same tokens, checking the same NLL.

MODEL and the options are stream-ppl's (--max-tokens 512, --cache 0+128 1+127 4+124 here); the last
line is ``ratio=<token-by-token s / chunked s>``, after ``batch_ratio=<one-at-a-time s / batched s>``.
"""

from __future__ import annotations

import sys
import time

import torch

from pipeline.analysis import streamers
from pipeline.analysis.streamers import CacheSpec, group_by_capacity, perplexity
from pipeline.analysis.streaming import Reading, build_parser, load_subject
from sinklab_io.mappings import settings_of

DEFAULT = ("0+128", "1+127", "4+124")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.prog = "bench_stream.py"
    parser.set_defaults(max_tokens=512)
    args = parser.parse_args(argv)
    specs = [CacheSpec.parse(c) for c in (args.cache or DEFAULT)]
    if len(group_by_capacity(specs)) != 1:
        raise SystemExit("bench_stream.py: --cache configs must share x+y to stream as one batch")
    streamer, ids, _ = load_subject(args.model, settings_of(Reading, args), args.max_tokens)
    ids = torch.tensor(ids[: args.max_tokens], dtype=torch.long)

    batched, t_batched = timed(lambda: streamer.nll(ids, specs))
    single, t_single = timed(lambda: torch.stack([streamer.nll(ids, [spec])[0] for spec in specs]))
    chunk, streamers.PREFILL_TOKENS = streamers.PREFILL_TOKENS, 1
    try:
        stepwise, t_stepwise = timed(lambda: streamer.nll(ids, specs))
    finally:
        streamers.PREFILL_TOKENS = chunk

    print(f"{args.model}: {ids.numel()} tokens, {torch.get_num_threads()} threads")
    print(f"{'config':>8} {'batched ppl':>12} {'one-at-a-time ppl':>18}")
    for spec, b, s in zip(specs, batched, single):
        print(f"{str(spec):>8} {perplexity(b):12.3f} {perplexity(s):18.3f}")
    same = torch.allclose(batched, single, atol=1e-4, rtol=1e-4)
    same_prefill = torch.allclose(batched, stepwise, atol=1e-4, rtol=1e-4)
    print(f"one at a time {t_single:.1f} s, one batch of {len(specs)} {t_batched:.1f} s, same nll: {same}")
    print(
        f"token by token {t_stepwise:.1f} s, prefill in chunks of {chunk} (rows x tokens) {t_batched:.1f} s, "
        f"same nll: {same_prefill}"
    )
    print(f"batch_ratio={t_single / t_batched:.2f}")
    print(f"ratio={t_stepwise / t_batched:.2f}")
    return 0 if same and same_prefill else 1


def timed(work):
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
