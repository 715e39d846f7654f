"""Passkey retrieval under the eviction policies of `sinklab kv-eval`: its passkey columns (docs/analysis.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import torch

from pipeline.analysis import passkey as pk
from pipeline.analysis.streamers import CacheSpec, Streamer, kv_heads
from pipeline.analysis.streaming import bos_id
from pipeline.model.eviction import Evictor, Row

BY = "sinklab kv-eval"  # the command's name, shared with kv_eval


def add_passkey_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--passkey", default="1,2", help="comma list of f: passkey prompts of f x the budget's entries ('': none)"
    )
    p.add_argument("--depths", default="0,0.5,1", help=f"passkey depths in [0, 1] (passkey's: {pk.DEFAULT_DEPTHS})")
    p.add_argument("--keys", type=int, default=1, help="passkey keys (trials) per depth")


def check_passkey_args(passkey: str, depths: str, keys: int) -> tuple[list[int], list[float]]:
    """The factors of --passkey and the depths of --depths (none without factors), --keys checked."""
    factors = pk.parse_factors(passkey, BY)
    if not factors:
        return [], []
    if keys < 1:
        raise SystemExit(f"{BY}: --keys {keys}: must be >= 1 (no passkey: --passkey '')")
    return factors, pk.parse_depths(depths, BY)


def passkey_at(
    subject,
    streamer: Streamer,
    rows: Sequence[Row],
    entries: int,
    factors: Sequence[int],
    depths: Sequence[float],
    keys: int,
    bos_mode: str,
    secondary: Callable[[torch.Tensor], list[torch.Tensor]] | None = None,
) -> dict[str, dict | None]:
    """``<f>x`` -> the passkey on prompts of f x ``entries`` tokens (None where they cannot hold it): each trial one
    batch of the rows (sinks: their first entries and ``secondary(ids)``), and all trials with the whole prompt
    cached (``full``; None past the model's positions)."""
    tokenizer, bos = subject.tokenizer, bos_id(subject, bos_mode)
    layers, heads = kv_heads(subject)
    out: dict[str, dict | None] = {}
    for f in factors:
        try:
            trials = pk.make_trials(tokenizer, f * entries, list(depths), keys, bos=bos)
        except ValueError as e:
            print(f"  passkey at {f}x{entries} tokens: skipped ({e})", file=sys.stderr)
            out[f"{f}x"] = None
            continue
        new = max(pk.answer_length(tokenizer, t.key) for t in trials)
        got: dict[str, list | None] = {f"{r.policy.name}/{r.sinks}": [] for r in rows} | {"full": None}
        for t in trials:
            found = None if secondary is None else secondary(torch.tensor(t.ids, device=streamer.device))
            evictor = Evictor(rows, entries, layers, heads, found, device=streamer.device)
            (tokens,) = pk.answer(streamer, [t.ids], [CacheSpec(0, entries)] * len(rows), new, evictor)
            for key, row_tokens in zip(got, tokens):
                got[key].append(pk.check(tokenizer, row_tokens, t.key))
        whole, limit = len(trials[0].ids) + new + streamer.sink_tokens, subject.max_positions()
        if limit is None or whole <= limit:
            full = pk.answer(streamer, [t.ids for t in trials], [CacheSpec(0, whole)], new)
            got["full"] = [pk.check(tokenizer, tokens, t.key) for t, (tokens,) in zip(trials, full)]
        out[f"{f}x"] = {
            "tokens": len(trials[0].ids),
            "trials": [{"depth": t.depth, "key": t.key} for t in trials],
            "right": {k: None if v is None else sum(ok for _, ok in v) for k, v in got.items()},
            "accuracy": {k: None if v is None else 100 * sum(ok for _, ok in v) / len(v) for k, v in got.items()},
            "answers": {k: None if v is None else [text for text, _ in v] for k, v in got.items()},
        }
    return out


def passkey_cell(passkey: dict | None, key: str) -> str:
    """Right answers / trials; n/a where not measured."""
    right = None if passkey is None else passkey["right"].get(key)
    return "n/a" if right is None else f"{right}/{len(passkey['trials'])}"
