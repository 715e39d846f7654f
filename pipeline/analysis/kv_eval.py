"""`sinklab kv-eval`: perplexity under KV-cache eviction policies, with the sinks kept or dropped.

Each (policy, sinks kept or dropped) is one batch row of the streamers; docs/analysis.md gives the protocol."""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline import metric_names as N
from pipeline import plots
from pipeline.analysis.inputs import comma_choices, default_text, held_out_sequences
from pipeline.analysis.kv_passkey import BY, add_passkey_arguments, check_passkey_args, passkey_at, passkey_cell
from pipeline.analysis.streamers import CacheSpec, kv_heads, perplexity
from pipeline.analysis.streaming import Reading, add_text_arguments, check_positions, load_subject
from pipeline.analysis.subject import add_model_arguments, claim_out, device_of, log_results_of, save_results
from pipeline.metrics import split_slots
from pipeline.model.eviction import POLICIES, Evictor, Row
from pipeline.secondary_sinks import MIN_QUERIES, secondary_sink_mask
from sinklab_io.mappings import settings_of

OUTPUTS = ("kv_eval.md", "kv_eval.json", "kv_eval.png")
SINKS = ("keep", "drop")


def refuse(message: str) -> SystemExit:
    return SystemExit(f"{BY}: {message}")


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
    add_passkey_arguments(p)
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma list of {','.join(POLICIES)}")
    p.add_argument("--first", type=int, default=4, help="leading entries that are sinks (StreamingLLM: 4)")
    p.add_argument("--eps", type=float, default=0.3, help="secondary sink threshold on α_k")
    p.add_argument("--no-secondary", action="store_true", help="sinks are the first entries only")
    p.add_argument("--out", type=Path, help="output directory (default: analysis/kv-eval/<first model>)")
    return p


def parse_budget(text: str, n_tokens: int | None = None) -> tuple[float, int]:
    """(percent of the text, entries) for ``25%`` or ``256``; without ``n_tokens`` only the form is checked."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*", text)
    if not m or (m.group(2) and not 0 < float(m.group(1)) < 100):
        raise refuse(f"--budget {text!r}: expected a share below 100% such as 25%, or a number of entries such as 256")
    if n_tokens is None:
        return 0.0, 0
    entries = round(float(m.group(1)) / 100 * n_tokens) if m.group(2) else int(float(m.group(1)))
    if not 2 <= entries < n_tokens:
        raise refuse(f"--budget {text}: {entries} entries of {n_tokens} tokens; need 2 <= entries < {n_tokens}")
    return 100 * entries / n_tokens, entries


@dataclass(frozen=True)
class KvEval:
    """kv-eval's settings beside the model loading's (a ``Reading``)."""

    policies: list[str]
    budget: list[str]
    first: int
    eps: float
    no_secondary: bool
    per_sequence: bool
    passkey: list[int]  # passkey prompt lengths, in multiples of the budget's entries
    depths: list[float]
    keys: int
    bos: str


def check_args(args) -> KvEval:
    names = comma_choices(args.policies, "--policies", POLICIES, BY)
    for text in args.budget or []:  # the form now, the size once the text's length is known
        parse_budget(text)
    if args.per_sequence and args.dataset is None:
        raise refuse("--per-sequence reads a prepared dataset's val split: add --dataset DIR")
    if args.first < 0 or not 0 <= args.eps < 1 or args.max_tokens < 8:
        raise refuse(f"--first {args.first}, --eps {args.eps}, --max-tokens {args.max_tokens}: need >= 0, [0, 1), >= 8")
    factors, depths = check_passkey_args(args)
    return settings_of(KvEval, args, policies=names, budget=args.budget or ["25%"], passkey=factors, depths=depths)


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
            maps = [split_slots(a, out.n_query_slots, out.n_key_slots)[1] for a in out.attentions]
            offset = out.n_query_slots
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


def stream_rows(subject, streamer, ids: torch.Tensor, rows: list[Row], entries: int, secondary) -> torch.Tensor:
    """(rows, len(ids) - 1) NLL: ids streamed once per row through a cache of ``entries`` entries."""
    layers, heads = kv_heads(subject)
    specs = [CacheSpec(0, entries)] * len(rows)
    evictor = Evictor(rows, entries, layers, heads, secondary, device=ids.device)
    return streamer.nll(ids, specs, label=f"{entries} entries x {len(rows)} rows", evictor=evictor)


def evaluate(subject, streamer, sequences: list[torch.Tensor], s: KvEval) -> dict:
    """Perplexity over every sequence's tokens, each streamed from an empty cache; the budget a share of its length."""
    started = time.perf_counter()
    passes = [full_pass(subject, ids, s.eps, s.first) for ids in sequences]
    secondary = [None if s.no_secondary else found for _, found in passes]
    full = None if any(nll is None for nll, _ in passes) else torch.cat([nll for nll, _ in passes])
    rows = [Row(POLICIES[p](), first=s.first, sinks=sinks) for p in s.policies for sinks in SINKS]
    result = {"tokens": sum(s.numel() for s in sequences), "sequences": len(sequences), "budgets": {}}
    result["full"] = None if full is None else perplexity(full)
    result["full_seconds"] = round(time.perf_counter() - started, 1)
    if len(sequences) == 1:
        result["secondary"] = (
            None if secondary[0] is None else [(k - streamer.sink_tokens).tolist() for k in secondary[0]]
        )
    length = min(s.numel() for s in sequences)
    for text in s.budget:
        percent, entries = parse_budget(text, length)
        spec = CacheSpec(0, entries)
        check_positions(subject, {spec: str(spec)}, "lower --budget")
        started = time.perf_counter()
        parts = [stream_rows(subject, streamer, ids, rows, entries, found) for ids, found in zip(sequences, secondary)]
        nll = torch.cat(parts, dim=1)
        seconds = round(time.perf_counter() - started, 1)
        ppl = {f"{r.policy.name}/{r.sinks}": perplexity(row) for r, row in zip(rows, nll)}
        result["budgets"][f"{percent:g}"] = {"entries": entries, "perplexity": ppl, "seconds": seconds}
        print(f"  budget {text} ({entries} entries): {len(rows)} rows in {seconds} s", file=sys.stderr)
        if s.passkey and not s.per_sequence:
            started = time.perf_counter()
            oracle = None if s.no_secondary else (lambda ids: full_pass(subject, ids, s.eps, s.first)[1])
            passkey = passkey_at(subject, streamer, rows, entries, s.passkey, s.depths, s.keys, s.bos, oracle)
            seconds = round(time.perf_counter() - started, 1)
            result["budgets"][f"{percent:g}"] |= {"passkey": passkey, "passkey_seconds": seconds}
            print(f"  budget {text}: passkey in {seconds} s", file=sys.stderr)
    return result


def metrics_of(result: dict) -> dict[str, float]:
    out = {} if result["full"] is None else {N.stream_perplexity("full"): result["full"]}
    for budget, r in result["budgets"].items():
        for key, value in r["perplexity"].items():
            policy, sinks = key.split("/")
            out[N.kv_perplexity(policy, sinks, float(budget))] = value
        for factor, p in r.get("passkey", {}).items():
            for key, value in (p or {}).get("accuracy", {}).items():
                if value is not None:
                    out[N.kv_passkey(key.replace("/", "_"), float(budget), factor.removesuffix("x"))] = value
    return out


def markdown(results: dict[str, dict], first: int) -> str:
    factors = list(
        dict.fromkeys(f for r in results.values() for b in r["budgets"].values() for f in b.get("passkey", {}))
    )
    lines = [
        f"Perplexity under each eviction policy; sinks = the first {first} entries and the secondary sinks found "
        "on the text; budget = cache entries as a share of the text"
        + (
            "; passkey f× = right answers / trials (depths × keys) on prompts of f × the budget's entries streamed "
            "through the same cache (full cache: the whole prompt cached)"
            if factors
            else ""
        ),
        "",
        "| model | tokens | full | budget | policy | sinks kept | sinks dropped | dropped / kept |"
        + "".join(f" passkey {f} kept | passkey {f} dropped |" for f in factors),
        "|---|---|---|---|---|---|---|---|" + "---|---|" * len(factors),
    ]
    for name, r in results.items():
        full = "n/a" if r["full"] is None else f"{r['full']:.2f}"
        tokens = r["tokens"] if r["sequences"] == 1 else f"{r['sequences']} seqs, {r['tokens']}"
        for budget, b in r["budgets"].items():
            head = f"| {name} | {tokens} | {full} | {budget}% ({b['entries']}) |"
            passkey = [b.get("passkey", {}).get(f) for f in factors]
            for p in dict.fromkeys(k.split("/")[0] for k in b["perplexity"]):
                keep, drop = b["perplexity"][f"{p}/keep"], b["perplexity"][f"{p}/drop"]
                cells = [passkey_cell(pk, f"{p}/{sinks}") for pk in passkey for sinks in SINKS]
                lines.append(
                    f"{head} {p} | {keep:.2f} | {drop:.2f} | {drop / keep:.2f} |" + "".join(f" {c} |" for c in cells)
                )
            if factors:
                lines.append(
                    f"{head} full cache | — | — | — |" + "".join(f" {passkey_cell(pk, 'full')} | — |" for pk in passkey)
                )
    return "\n".join(lines)


def figure(results: dict[str, dict], path: Path, by: str) -> Path:
    panels, perplexity = {}, [f"perplexity: {name}" for name in results]
    for name, r in results.items():
        budgets = sorted(r["budgets"], key=float)
        keys = dict.fromkeys(k for b in budgets for k in r["budgets"][b]["perplexity"])
        x = [float(b) for b in budgets]
        curves = {k.replace("/", ", sinks "): (x, [r["budgets"][b]["perplexity"][k] for b in budgets]) for k in keys}
        if r["full"] is not None:
            curves["full attention"] = (x, [r["full"]] * len(budgets))
        panels[f"perplexity: {name}"] = curves
        for factor in dict.fromkeys(f for b in budgets for f in r["budgets"][b].get("passkey", {})):
            points: dict[str, list] = {}
            for b in budgets:
                p = r["budgets"][b].get("passkey", {}).get(factor)
                for key, value in (p or {}).get("accuracy", {}).items():
                    if value is not None:
                        label = "full cache" if key == "full" else key.replace("/", ", sinks ")
                        points.setdefault(label, []).append((float(b), value))
            if points:
                panels[f"passkey {factor} (% right): {name}"] = {
                    k: tuple(map(list, zip(*v))) for k, v in points.items()
                }
    return plots.curve_panels(
        panels, path, "KV-cache eviction", xlabel="cache budget (% of the text)", log_panels=perplexity, by=by
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    s = check_args(args)
    device_of(args.device, "kv-eval")
    names, out, by = claim_out(args.models, args.out, BY, "kv-eval", OUTPUTS)
    results, subjects, reading = {}, {}, settings_of(Reading, args)
    for spec, name in zip(args.models, names):
        streamer, ids, subjects[name] = load_subject(spec, reading, args.max_tokens, "kv-eval", default_text("othello"))
        if subjects[name].kind == "sinklab":  # a sequence fits its learned positions: no re-indexing
            streamer.stream_positions = args.per_sequence
        chunks = [ids[: args.max_tokens]]
        if args.per_sequence:
            chunks = held_out_sequences(args.dataset, args.max_tokens, "kv-eval")
        sequences = [torch.tensor(c, dtype=torch.long, device=streamer.device) for c in chunks]
        print(f"{name}: {len(sequences)} sequences, {sum(map(len, chunks))} tokens", file=sys.stderr)
        results[name] = evaluate(subjects[name], streamer, sequences, s)
    save_results(out, "kv_eval", markdown(results, s.first), args, results, by, figure)
    passkey = {"passkey": args.passkey, "depths": args.depths, "keys": s.keys} if s.passkey else {}

    def settings(r: dict) -> dict:
        return {"tokens": r["tokens"], "first": s.first, "eps": s.eps, "budgets": list(r["budgets"])} | passkey

    log_results_of(subjects, "kv", results, metrics_of, settings, out, args)
    return 0
