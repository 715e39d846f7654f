"""Streaming perplexity: the two shortcuts of `sinklab stream-ppl` and `passkey`, each timed
against going without it, in one process, on the same tokens, checking the same NLL.

MODEL and the options are stream-ppl's (--max-tokens 512, --cache 0+128 1+127 4+124 here); the last
line is ``ratio=<token-by-token s / chunked s>``, after ``batch_ratio=<one-at-a-time s / batched s>``.
"""

from __future__ import annotations

import sys
from unittest import mock

import torch
from side_by_side import interleaved

from pipeline.analysis import streamers
from pipeline.analysis.stream_ppl import build_parser, check_args
from pipeline.analysis.streamers import group_by_capacity, perplexity
from pipeline.analysis.streaming import load_subject

DEFAULT = ("0+128", "1+127", "4+124")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.prog = "bench_stream.py"
    parser.set_defaults(max_tokens=512)
    args = parser.parse_args(argv)
    args.cache = args.cache or list(DEFAULT)
    settings = check_args(args)
    specs = settings.caches
    if len(group_by_capacity(specs)) != 1:
        raise SystemExit("bench_stream.py: --cache configs must share x+y to stream as one batch")
    streamer, ids, _ = load_subject(settings.model, settings.reading, settings.max_tokens)
    ids = torch.tensor(ids[: settings.max_tokens], dtype=torch.long)

    def token_by_token():
        with mock.patch.object(streamers, "PREFILL_TOKENS", 1):
            return streamer.nll(ids, specs)

    works = {
        "batched": lambda: streamer.nll(ids, specs),
        "single": lambda: torch.stack([streamer.nll(ids, [spec])[0] for spec in specs]),
        "stepwise": token_by_token,
    }
    times, out = interleaved(works, 1)
    batched, single, stepwise = (out[name] for name in works)
    t_batched, t_single, t_stepwise = (times[name][0] for name in works)

    print(f"{args.model}: {ids.numel()} tokens, {torch.get_num_threads()} threads")
    print(f"{'config':>8} {'batched ppl':>12} {'one-at-a-time ppl':>18}")
    for spec, b, s in zip(specs, batched, single):
        print(f"{str(spec):>8} {perplexity(b):12.3f} {perplexity(s):18.3f}")
    same = torch.allclose(batched, single, atol=1e-4, rtol=1e-4)
    same_prefill = torch.allclose(batched, stepwise, atol=1e-4, rtol=1e-4)
    print(f"one at a time {t_single:.1f} s, one batch of {len(specs)} {t_batched:.1f} s, same nll: {same}")
    print(
        f"token by token {t_stepwise:.1f} s, prefill in chunks of {streamers.PREFILL_TOKENS} (rows x tokens) {t_batched:.1f} s, "
        f"same nll: {same_prefill}"
    )
    print(f"batch_ratio={t_single / t_batched:.2f}")
    print(f"ratio={t_stepwise / t_batched:.2f}")
    return 0 if same and same_prefill else 1


if __name__ == "__main__":
    sys.exit(main())
