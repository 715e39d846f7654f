"""`sinklab passkey`: passkey retrieval under a streaming x + y cache."""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from pipeline import metric_names as N
from pipeline.analysis.inputs import comma_list, encode
from pipeline.analysis.streamers import CacheSpec, Streamer, group_by_capacity, streamer_for
from pipeline.analysis.streaming import add_cache_argument, add_text_arguments, bos_id, check_positions, parse_caches
from pipeline.analysis.subject import Subject, add_model_arguments, claimed, csv_text, log_back, model_name, write_json
from pipeline.plots import passkey_heatmap
from sinklab_io.mappings import settings_of
from sinklab_io.outputs import write_output

BY = "sinklab passkey"
OUTPUTS = ("passkey.md", "passkey.csv", "passkey.json", "passkey.png")
INSTRUCTION = (
    "Below, one line among many repeated ones holds a secret number. "
    "Read everything, remember the number, and give it when asked."
)
FILLER = " The lake was calm. The road went on. The birds flew south. Nothing happened here."
NEEDLE = (" The secret number is", " {key}", ". Remember it:", " {key}", ".")  # encoded piece by piece
QUESTION = " What is the secret number? The secret number is"
DEFAULT_DEPTHS = "0,0.25,0.5,0.75,1"
DIGITS = range(1, 19)  # a key's digits: every key fits an int64
DEFAULT_CACHES = ("0+256", "4+252")


@dataclass(frozen=True)
class Trial:
    depth: float
    key: str
    ids: list[int]
    key_spans: tuple[tuple[int, int], ...]  # token spans [start, end) of the key's two mentions


def build_trial(tokenizer, length: int, depth: float, key: str, bos: int | None = None) -> Trial:
    """About ``length`` tokens: instruction, filler with the needle after ``round(depth * n)`` of its ``n`` repeats,
    question; encoded piece by piece, so trials of one length and key width share a token count."""
    enc = partial(encode, tokenizer)
    head = ([bos] if bos is not None else []) + enc(INSTRUCTION)
    unit, question = enc(FILLER), enc(QUESTION)
    pieces = [enc(piece.format(key=key)) for piece in NEEDLE]
    needle = [token for piece in pieces for token in piece]
    repeats = (length - len(head) - len(needle) - len(question)) // len(unit)
    if repeats < 1:
        raise ValueError(
            f"--length {length}: too short for the prompt; use at least "
            f"{len(head) + len(needle) + len(question) + len(unit)} tokens"
        )
    before = round(depth * repeats)
    spans, at = [], len(head) + before * len(unit)
    for template, piece in zip(NEEDLE, pieces):
        if "{key}" in template:
            spans.append((at, at + len(piece)))
        at += len(piece)
    ids = head + unit * before + needle + unit * (repeats - before) + question
    return Trial(depth, key, ids, tuple(spans))


def key_cached(trial: Trial, spec: CacheSpec, sink_tokens: int = 0) -> bool:
    """Whether one whole mention of the key is cached when the first answer token is predicted: among the first x
    (less the model's sink tokens) and the latest, x + y entries with the incoming token."""
    n, first = len(trial.ids), max(0, spec.n_initial - sink_tokens)
    return n + sink_tokens <= spec.n_initial + spec.n_recent or any(
        end <= first or start >= n - spec.n_recent for start, end in trial.key_spans
    )


def first_number(text: str) -> str | None:
    match = re.search(r"\d+", text)
    return match.group(0) if match else None


def answer_length(tokenizer, key: str) -> int:
    """Tokens decoded for an answer: the key's, plus two for what follows it."""
    return len(encode(tokenizer, " " + key)) + 2


def check(tokenizer, tokens: list[int], key: str) -> tuple[str, bool]:
    """The answer's text, and whether the first number it writes is the key."""
    text = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    return text, first_number(text) == key


@torch.no_grad()
def answer(
    streamer: Streamer, prompts: Sequence[list[int]], specs: Sequence[CacheSpec], new_tokens: int, evictor=None
) -> list[list[list[int]]]:
    """Greedy answers [prompt][spec] -> token ids, each (prompt, spec) pair one batch row; an ``evictor`` (one row
    per pair) chooses the kept entries in place of x + y."""
    rows = [(p, s) for p in range(len(prompts)) for s in range(len(specs))]
    feed = streamer.stream([specs[s] for _, s in rows], evictor)
    ids = torch.tensor([prompts[p] for p, _ in rows], device=streamer.device)
    for _, logits in streamer.read(feed, ids, specs):  # noqa: B007 (the last one is read below)
        pass
    out = [logits[:, -1].argmax(-1)]
    while len(out) < new_tokens:
        out.append(feed(out[-1][:, None])[:, -1].argmax(-1))
    generated = torch.stack(out, 1).tolist()
    return [[generated[p * len(specs) + s] for s in range(len(specs))] for p in range(len(prompts))]


def run_trials(streamer: Streamer, tokenizer, trials: Sequence[Trial], caches: dict[CacheSpec, str]) -> list[dict]:
    """One result per (trial, cache config), its ``cache`` the config's name in ``caches``."""
    results = []
    by_length: dict[int, list[Trial]] = {}
    for trial in trials:
        by_length.setdefault(len(trial.ids), []).append(trial)
    for group in group_by_capacity(list(caches)):
        for same_length in by_length.values():
            started = time.perf_counter()
            new_tokens = max(answer_length(tokenizer, t.key) for t in same_length)
            answers = answer(streamer, [t.ids for t in same_length], group, new_tokens)
            print(
                f"  {' '.join(caches[spec] for spec in group)}: {len(same_length)} prompts of {len(same_length[0].ids)} tokens, "
                f"{time.perf_counter() - started:.1f} s",
                file=sys.stderr,
            )
            for trial, per_spec in zip(same_length, answers):
                for spec, tokens in zip(group, per_spec):
                    text, correct = check(tokenizer, tokens, trial.key)
                    results.append(
                        {
                            "cache": caches[spec],
                            "depth": trial.depth,
                            "key": trial.key,
                            "tokens": len(trial.ids),
                            "answer": text,
                            "correct": correct,
                            "key_cached": key_cached(trial, spec, streamer.sink_tokens),
                        }
                    )
    return results


def accuracy(results: Sequence[dict], caches: Sequence[str], depths: Sequence[float]) -> dict[str, dict[float, dict]]:
    """cache -> depth -> {"accuracy": % right, "cached": % of trials whose key was cached}."""

    def cell(cache: str, depth: float) -> dict:
        found = [r for r in results if r["cache"] == cache and r["depth"] == depth]
        return {
            "accuracy": 100.0 * sum(r["correct"] for r in found) / len(found),
            "cached": 100.0 * sum(r["key_cached"] for r in found) / len(found),
        }

    return {cache: {depth: cell(cache, depth) for depth in depths} for cache in caches}


def markdown(model: str, table: dict, n_tokens: int, trials: int) -> str:
    depths = list(next(iter(table.values())))
    lines = [
        f"Passkey accuracy (%), {model}, {n_tokens}-token prompts, {trials} keys per cell; "
        "† = the key had left the cache when the answer began",
        "",
        "| cache x+y | " + " | ".join(f"depth {d:g}" for d in depths) + " | mean |",
        "|---|" + "---|" * (len(depths) + 1),
    ]
    for cache, row in table.items():
        cells = [f"{c['accuracy']:.0f}" + ("†" if c["cached"] < 100 else "") for c in row.values()]
        mean = sum(c["accuracy"] for c in row.values()) / len(row)
        lines.append(f"| {cache} | " + " | ".join(cells) + f" | {mean:.0f} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sinklab passkey", description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    add_text_arguments(p, text=False)
    p.add_argument("--length", type=int, default=512, help="prompt length in tokens (about; filler repeats are whole)")
    p.add_argument("--depths", default=DEFAULT_DEPTHS, help="comma list of depths in [0, 1]")
    p.add_argument("--keys", type=int, default=2, help="random keys per depth")
    p.add_argument("--digits", type=int, default=5, help="digits of each key")
    p.add_argument("--seed", type=int, default=0)
    add_cache_argument(p, " ".join(DEFAULT_CACHES))
    p.add_argument("--full", action="store_true", help="also answer with the whole prompt cached (the reference)")
    p.add_argument("--out", type=Path, help="output directory (default: analysis/passkey/<model>)")
    return p


def parse_depths(text: str, prog: str = BY) -> list[float]:
    why = "{text!r}: expected a comma list of numbers in [0, 1]"
    return list(dict.fromkeys(comma_list(text, "--depths", prog, float, check=lambda d: 0 <= d <= 1, refusal=why)))


def parse_factors(text: str, prog: str) -> list[int]:
    """``--passkey``'s comma list of prompt lengths in multiples of a command's unit ('': none)."""
    why = "{text!r}: expected a comma list of whole numbers >= 1, e.g. 1,2,4,8"
    return comma_list(text, "--passkey", prog, int, check=lambda f: f >= 1, refusal=why, empty=True)


def make_trials(
    tokenizer, length: int, depths: list[float], keys: int, digits: int = 5, seed: int = 0, bos: int | None = None
) -> list[Trial]:
    """``keys`` random keys of ``digits`` digits at each depth; ValueError where ``length`` is too short."""
    rng = random.Random(seed)
    drawn = [str(rng.randrange(10 ** (digits - 1), 10**digits)) for _ in range(keys)]
    return [build_trial(tokenizer, length, d, k, bos) for d in depths for k in drawn]


@dataclass(frozen=True)
class PasskeyEval:
    model: str
    kind: str
    tokenizer: Path | None
    bos: str
    cache: list[CacheSpec]
    full: bool
    length: int
    depths: list[float]
    keys: int
    digits: int
    seed: int
    out: Path | None


def check_args(args: argparse.Namespace) -> PasskeyEval:
    cache = parse_caches(args.cache, "passkey", DEFAULT_CACHES)
    depths = parse_depths(args.depths)
    if args.keys < 1 or args.digits not in DIGITS:
        raise SystemExit("sinklab passkey: --keys must be >= 1 and --digits in 1..18")
    return settings_of(PasskeyEval, args, cache=cache, depths=depths)


def main(argv: list[str] | None = None) -> int:
    s = check_args(build_parser().parse_args(argv))
    depths, name = s.depths, model_name(s.model)
    out = s.out or Path("analysis") / "passkey" / name
    by = claimed(out, OUTPUTS, BY, [s.model])
    subject = Subject(s.model, s.kind, s.tokenizer, "passkey")
    tokenizer, bos = subject.require_tokenizer(), bos_id(subject, s.bos)
    try:
        trials = make_trials(tokenizer, s.length, depths, s.keys, s.digits, s.seed, bos)
    except ValueError as e:
        raise SystemExit(f"sinklab passkey: {e}") from None
    caches = {spec: str(spec) for spec in s.cache}
    if s.full:  # the longest prompt and answer
        caches[CacheSpec(0, max(len(t.ids) + answer_length(tokenizer, t.key) for t in trials))] = "full"
    check_positions(subject, caches, "keep x+y (and --length for --full) within it")
    started = time.perf_counter()
    results = run_trials(streamer_for(subject), tokenizer, trials, caches)
    seconds = round(time.perf_counter() - started, 1)
    table = accuracy(results, list(dict.fromkeys(caches.values())), depths)
    named = {k: getattr(s, k) for k in ("depths", "keys", "digits", "seed")}
    settings = {"length": s.length, "tokens": len(trials[0].ids)} | named | {"bos": bos is not None}
    text = markdown(name, table, settings["tokens"], s.keys)
    write_output(out / "passkey.md", text + "\n", by)
    write_output(out / "passkey.csv", csv_text(results), by)
    accuracy_by_depth = {cache: {str(d): cell for d, cell in row.items()} for cache, row in table.items()}
    result = {"settings": settings, "seconds": seconds, "accuracy": accuracy_by_depth, "trials": results}
    write_json(subject.header(out) | result, out / "passkey.json", by)
    title = f"passkey retrieval, {name}, {settings['tokens']} tokens"
    figure = passkey_heatmap(table, out / "passkey.png", title, by)
    print(text)
    print(f"wrote {out}/{', '.join(OUTPUTS)} ({seconds} s)", file=sys.stderr)
    if subject.run_id is not None:  # passkey/acc_<x>_<y>, the mean over depths, and the figure
        means = {cache: sum(c["accuracy"] for c in row.values()) / len(row) for cache, row in table.items()}
        values = {N.passkey_accuracy(cache.replace("+", "_")): mean for cache, mean in means.items()}
        log_back(subject, "passkey", values, settings, figure)
        print(f"logged to MLflow run {subject.run_id} as passkey/acc_<x>_<y>", file=sys.stderr)
    return 0
