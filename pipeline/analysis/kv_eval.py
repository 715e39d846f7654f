"""`sinklab kv-eval`: perplexity under KV-cache eviction policies, on their own scores and with the sinks kept or dropped.

Each (policy, sink setting) is one batch row of the streamers; docs/analysis.md gives the protocol."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import get_type_hints

import torch
import torch.nn.functional as F
from docstring_parser import parse_from_object

from pipeline.analysis import passkey as pk
from pipeline.analysis.inputs import at_least, comma_list, default_text, held_out_sequences
from pipeline.analysis.kv_results import KvResult, figure, markdown, row_key
from pipeline.analysis.streamers import CacheSpec, Streamer, kv_heads, perplexity
from pipeline.analysis.streaming import Reading, add_text_arguments, bos_id, check_positions, load_subject
from pipeline.analysis.subject import (
    Destination,
    add_model_arguments,
    claim_out,
    device_of,
    log_results_of,
    save_results,
)
from pipeline.metrics import split_extra
from pipeline.model.eviction import POLICIES, Evictor, Policy, Row
from pipeline.model.eviction import SINKS as MODES
from pipeline.secondary_sinks import MIN_QUERIES, secondary_sink_mask
from sinklab_io.mappings import settings_of

BY = "sinklab kv-eval"
OUTPUTS = ("kv_eval.md", "kv_eval.json", "kv_eval.png")
SINKS = dict(zip(("policy", "kept", "dropped"), MODES))  # --sinks name -> a row's sink setting
MIN_TOKENS = 3  # a budget of 2 entries and one token past it


def refuse(message: str) -> SystemExit:
    return SystemExit(f"{BY}: {message}")


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
    out: dict[str, dict | None] = {}
    for f in factors:
        try:
            trials = pk.make_trials(tokenizer, f * entries, list(depths), keys, bos=bos)
        except ValueError as e:
            print(f"  passkey at {f}x{entries} tokens: skipped ({e})", file=sys.stderr)
            out[f"{f}x"] = None
            continue
        new = max(pk.answer_length(tokenizer, t.key) for t in trials)
        got: dict[str, list | None] = {row_key(r.policy.name, r.sinks): [] for r in rows} | {"full": None}
        for t in trials:
            found = None if secondary is None else secondary(torch.tensor(t.ids, device=streamer.device))
            evictor = Evictor(rows, entries, *kv_heads(subject), found, device=streamer.device)
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=BY, description=__doc__.split("\n\n")[0])
    add_model_arguments(p, many=True, logged=True)
    add_text_arguments(p, default="Othello")
    p.add_argument(
        "--budget", action="append", help="cache size: a share of the text (25%%) or entries (256); repeatable"
    )
    p.add_argument("--max-tokens", type=int, default=1024, help="evaluate on the first N tokens of the text")
    p.add_argument(
        "--per-sequence",
        action="store_true",
        help="with --dataset: each val sequence alone, from an empty cache; --budget a share of its length",
    )
    p.add_argument(
        "--passkey", default="1,2", help="comma list of f: passkey prompts of f x the budget's entries ('': none)"
    )
    p.add_argument("--depths", default="0,0.5,1", help=f"passkey depths in [0, 1] (passkey's: {pk.DEFAULT_DEPTHS})")
    p.add_argument("--keys", type=int, default=1, help="passkey keys (trials) per depth")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma list of {','.join(POLICIES)} (below)")
    p.add_argument(
        "--sinks",
        default=",".join(SINKS),
        help="comma list of the rows per policy: policy (its own scores), kept (sinks forced in), dropped (forced out)",
    )
    p.add_argument("--first", type=int, default=4, help="leading entries that are sinks (StreamingLLM: 4)")
    p.add_argument("--eps", type=float, default=0.3, help="secondary sink threshold on α_k")
    p.add_argument("--no-secondary", action="store_true", help="sinks are the first entries only")
    p.add_argument("--out", type=Path, help="output directory (default: analysis/kv-eval/<first model>)")
    for name, cls in POLICIES.items():  # a group per policy, a flag per field: --snapkv.window
        group = p.add_argument_group(f"policy {name}", " ".join(cls.__doc__.replace("``", "").split()))
        about, types = {d.arg_name: d.description for d in parse_from_object(cls).params}, get_type_hints(cls)
        for f in fields(cls):
            help_, flag = f"{about[f.name].rstrip('.')} (default: {f.default})", f"{name}.{f.name}"
            group.add_argument(f"--{flag}", dest=flag, type=types[f.name], metavar=f.name.upper(), help=help_)
    return p


def parse_budget(text: str, n_tokens: int | None = None) -> tuple[float, int]:
    """(percent of the text, entries) for ``25%`` or ``256``; without ``n_tokens`` the form and a number of entries
    are checked."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*", text)
    if not m or (m.group(2) and not 0 < float(m.group(1)) < 100):
        raise refuse(f"--budget {text!r}: expected a share below 100% such as 25%, or a number of entries such as 256")
    if not m.group(2) and float(m.group(1)) < 2:
        raise refuse(f"--budget {text}: a cache needs at least 2 entries")
    if n_tokens is None:
        return 0.0, 0 if m.group(2) else int(float(m.group(1)))
    entries = round(float(m.group(1)) / 100 * n_tokens) if m.group(2) else int(float(m.group(1)))
    if entries < 2:
        raise refuse(f"--budget {text}: {entries} entries of a {n_tokens}-token text; a cache needs at least 2")
    if entries >= n_tokens:
        raise refuse(
            f"--budget {text}: {entries} entries hold the whole {n_tokens}-token text, so nothing is evicted; give a "
            f"budget below {n_tokens} entries or a longer text"
        )
    return 100 * entries / n_tokens, entries


def check_first(first: int, budget: str, entries: int) -> None:
    """Refuse sinks that fill a cache of ``entries`` (it keeps entries − 1 beside the incoming token)."""
    if first > entries - 2:
        raise refuse(
            f"--first {first} with --budget {budget} ({entries} entries): the sinks would fill the cache; "
            f"need --first <= {entries - 2} (or a larger --budget)"
        )


@dataclass(frozen=True)
class KvEval:
    """kv-eval's settings beside the model loading's (a ``Reading``)."""

    policies: list[Policy]
    sinks: list[str]  # the rows' sink settings: policy, keep, drop
    budget: list[str]
    first: int
    eps: float
    no_secondary: bool
    per_sequence: bool
    passkey: list[int]  # passkey prompt lengths, in multiples of the budget's entries
    depths: list[float]
    keys: int
    bos: str
    max_tokens: int
    reading: Reading
    destination: Destination  # its options: --passkey and --depths as given, for the MLflow tag


def check_args(args) -> KvEval:
    names = comma_list(args.policies, "--policies", BY, allowed=POLICIES)
    sinks = comma_list(args.sinks, "--sinks", BY, SINKS.__getitem__, allowed=SINKS)
    chosen = {
        n: {f.name: v for f in fields(c) if (v := getattr(args, f"{n}.{f.name}")) is not None}
        for n, c in POLICIES.items()
    }
    if stray := next((f"--{n}.{k}" for n, values in chosen.items() if n not in names for k in values), None):
        raise refuse(f"{stray}: sets a policy that --policies {args.policies} leaves out")
    try:
        policies = [POLICIES[n](**chosen[n]) for n in names]
    except ValueError as e:
        raise refuse(f"--{e}") from None
    at_least(args, BY, first=0, max_tokens=8)
    if not 0 <= args.eps < 1:
        raise refuse(f"--eps {args.eps}: α lies in [0, 1], so ε must be in [0, 1) (default 0.3)")
    for text in args.budget or []:  # the form and a number of entries now, a share once the text's length is known
        if entries := parse_budget(text)[1]:
            check_first(args.first, text, entries)
    if args.per_sequence and args.dataset is None:
        raise refuse("--per-sequence reads a prepared dataset's val split: add --dataset DIR")
    factors = pk.parse_factors(args.passkey, BY)
    if factors and args.keys < 1:
        raise refuse(f"--keys {args.keys}: must be >= 1 (no passkey: --passkey '')")
    depths = pk.parse_depths(args.depths, BY) if factors else []
    options = vars(args) | {f"{p.name}.{k}": v for p in policies for k, v in asdict(p).items()}
    given = dict(policies=policies, sinks=sinks, budget=args.budget or ["25%"], passkey=factors, depths=depths)
    destination = settings_of(Destination, args, options=options)
    return settings_of(KvEval, args, reading=settings_of(Reading, args), destination=destination, **given)


@torch.no_grad()
def full_pass(subject, ids: torch.Tensor, eps: float, first: int) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """Full attention over the text: the NLL of ids[1:] (None past the model's positions, read in windows) and, per
    layer, the stream positions of its secondary sinks in any head."""
    limit = subject.max_positions() or ids.numel()  # a SinkLab model's sink tokens have positions of their own
    found, nll = None, None
    for start in range(0, ids.numel(), limit):
        window = ids[start : start + limit]
        if subject.kind == "sinklab":
            out = subject.model(window[None], output_attentions=True)
            maps = [split_extra(a, out.n_extra_queries, out.n_extra_keys)[1] for a in out.attentions]
            offset = out.n_extra_queries
        else:
            subject.model.set_attn_implementation("eager")
            out = subject.model(input_ids=window[None], output_attentions=True, use_cache=False)
            maps, offset = out.attentions, 0
        if limit >= ids.numel():
            nll = F.cross_entropy(out.logits[0, :-1].float(), window[1:], reduction="none")
        lead = max(first - offset - start, 0)  # the first entries are no secondary sinks
        masks = [secondary_sink_mask(a.float(), eps, lead, MIN_QUERIES)[0].any(0) for a in maps]
        here = [m.nonzero()[:, 0].cpu() + offset + start for m in masks]
        found = here if found is None else [torch.cat(pair) for pair in zip(found, here)]
    return nll, found


def stream_evicting(subject, streamer, ids, rows: list[Row], entries: int, secondary) -> tuple[torch.Tensor, Evictor]:
    """(rows, len(ids) - 1) NLL, ids streamed once per row through a cache of ``entries`` entries, and the evictor that
    chose them (what it kept of the first token)."""
    specs = [CacheSpec(0, entries)] * len(rows)
    evictor = Evictor(rows, entries, *kv_heads(subject), secondary, device=ids.device)
    return streamer.nll(ids, specs, label=f"{entries} entries x {len(rows)} rows", evictor=evictor), evictor


def evaluate(subject, streamer, sequences: list[torch.Tensor], s: KvEval) -> KvResult:
    """Perplexity over every sequence's tokens, each streamed from an empty cache; the budget a share of its length."""
    length = min(s.numel() for s in sequences)
    budgets = {text: parse_budget(text, length) for text in s.budget}  # refused before any work
    for text, (_, entries) in budgets.items():
        check_first(s.first, text, entries)
        check_positions(subject, {CacheSpec(0, entries): ""}, "lower --budget", option=f"--budget {text}")
    started = time.perf_counter()
    passes = [full_pass(subject, ids, s.eps, s.first) for ids in sequences]
    secondary = [None if s.no_secondary else found for _, found in passes]
    full = None if any(nll is None for nll, _ in passes) else perplexity(torch.cat([nll for nll, _ in passes]))
    rows = [Row(p, first=s.first, sinks=sinks) for p in s.policies for sinks in s.sinks]
    result = {"tokens": sum(s.numel() for s in sequences), "sequences": len(sequences), "budgets": {}, "full": full}
    result["full_seconds"] = round(time.perf_counter() - started, 1)
    if len(sequences) == 1:  # per layer, the secondary sinks' positions in the text
        result["secondary"] = secondary[0] and [(k - streamer.sink_tokens).tolist() for k in secondary[0]]
    for text, (percent, entries) in budgets.items():
        started = time.perf_counter()
        parts = [stream_evicting(subject, streamer, ids, rows, entries, f) for ids, f in zip(sequences, secondary)]
        nll = torch.cat([p[0] for p in parts], dim=1)
        seconds = round(time.perf_counter() - started, 1)
        ppl = {row_key(r.policy.name, r.sinks): perplexity(row) for r, row in zip(rows, nll)}
        b = result["budgets"][f"{percent:g}"] = {"entries": entries, "perplexity": ppl, "seconds": seconds}
        if "policy" in s.sinks:  # per policy, the share of (eviction, layer, kv head) that kept position 0
            held, total = sum(e.first_held.cpu() for _, e in parts), sum(e.evictions for _, e in parts)
            shares = [float(h) / total if total else None for h in held]
            b["first_kept"] = {r.policy.name: x for r, x in zip(rows, shares) if r.sinks == "policy"}
        print(f"  budget {text} ({entries} entries): {len(rows)} rows in {seconds} s", file=sys.stderr)
        if s.passkey and not s.per_sequence:
            started = time.perf_counter()
            oracle = None if s.no_secondary else (lambda ids: full_pass(subject, ids, s.eps, s.first)[1])
            passkey = passkey_at(subject, streamer, rows, entries, s.passkey, s.depths, s.keys, s.bos, oracle)
            seconds = round(time.perf_counter() - started, 1)
            b |= {"passkey": passkey, "passkey_seconds": seconds}
            print(f"  budget {text}: passkey in {seconds} s", file=sys.stderr)
    return KvResult([(r.policy.name, r.sinks) for r in rows], result)


def main(argv: list[str] | None = None) -> int:
    s = check_args(build_parser().parse_args(argv))
    r, d = s.reading, s.destination
    device_of(r.device, "kv-eval")
    names, out, by = claim_out(d.models, d.out, BY, "kv-eval", OUTPUTS)
    results, subjects = {}, {}
    for spec, name in zip(d.models, names):
        streamer, ids, subjects[name] = load_subject(spec, r, s.max_tokens, "kv-eval", default_text("othello"))
        if subjects[name].kind == "sinklab":  # a sequence fits its learned positions: no re-indexing
            streamer.stream_positions = s.per_sequence
        chunks = [ids[: s.max_tokens]]
        if s.per_sequence:
            chunks = held_out_sequences(r.dataset, s.max_tokens, "kv-eval")
        if (shortest := min(map(len, chunks))) < MIN_TOKENS:
            where = f"--dataset {r.dataset}" if r.dataset else f"--text {r.text or 'Othello'}"
            raise refuse(
                f"{where}: {shortest} token{'s' * (shortest != 1)} (a BOS counted), empty or too short for any budget "
                f"(at least {MIN_TOKENS}: a cache of 2 entries and a token past it); give a longer text"
            )
        sequences = [torch.tensor(c, dtype=torch.long, device=streamer.device) for c in chunks]
        print(f"{name}: {len(sequences)} sequences, {sum(map(len, chunks))} tokens", file=sys.stderr)
        results[name] = evaluate(subjects[name], streamer, sequences, s)
    save_results(out, "kv_eval", markdown(results, s.first), d.options, results, by, figure)
    given = {k: d.options[k] for k in ("passkey", "depths", "keys")} if s.passkey else {}
    given |= {f"{p.name}.{k}": v for p in s.policies for k, v in asdict(p).items()}

    def settings(result: KvResult) -> dict:
        r = result.entry
        return {"tokens": r["tokens"], "first": s.first, "eps": s.eps, "budgets": list(r["budgets"])} | given

    log_results_of(subjects, "kv", results, settings, out, d)
    return 0
