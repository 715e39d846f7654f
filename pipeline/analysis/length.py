"""`sinklab length-eval`: length generalisation of one or more models, one table and one figure.

Loss by position and passkey accuracy past the training length C, under full attention and x + y caches of C
entries (docs/analysis.md)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pipeline import metric_names as N
from pipeline import plots
from pipeline.analysis import inputs
from pipeline.analysis import passkey as pk
from pipeline.analysis.streamers import CacheSpec, group_by_capacity, streamer_for
from pipeline.analysis.streaming import Reading, add_cache_argument, add_text_arguments, bos_id, parse_caches
from pipeline.analysis.subject import (
    Destination,
    Subject,
    add_model_arguments,
    claim_out,
    device_of,
    log_results_of,
    save_results,
)
from sinklab_io.mappings import settings_of

FULL = "full"
BY = "sinklab length-eval"
OUTPUTS = ("length.md", "length.json", "length.png")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sinklab length-eval", description=__doc__.split("\n\n")[0])
    add_model_arguments(p, many=True, logged=True)
    p.add_argument("--train-len", type=int, help="C, the training length (default: a SinkLab model's max_seq_len)")
    p.add_argument("--factor", type=int, default=4, help="windows of factor x C tokens (default 4)")
    p.add_argument("--windows", type=int, default=8, help="windows averaged (default 8)")
    p.add_argument("--bucket", type=int, help="positions per bucket (default C/2)")
    add_cache_argument(p, "0+C and 1+(C-1)")
    p.add_argument("--passkey", default="1,2,4,8", help="comma list of f: passkey prompts of f x C tokens ('': none)")
    p.add_argument("--depths", default=pk.DEFAULT_DEPTHS, help="passkey depths in [0, 1]")
    p.add_argument("--keys", type=int, default=2, help="passkey keys per depth")
    p.add_argument("--digits", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    add_text_arguments(p)
    p.add_argument("--out", type=Path, help="output directory (default: analysis/length/<first model>)")
    return p


def refuse(message: str) -> SystemExit:
    return SystemExit(f"sinklab length-eval: {message}")


@dataclass(frozen=True)
class LengthEval(Reading):
    """`sinklab length-eval`'s settings: C (``train_len``), the loss windows, the caches, the passkey factors."""

    train_len: int | None
    factor: int
    windows: int
    bucket: int | None
    cache: list[str] | None
    passkey: list[int]
    depths: list[float]
    keys: int
    digits: int
    seed: int
    destination: Destination


def check_args(args: argparse.Namespace) -> LengthEval:
    inputs.at_least(args, BY, factor=1, windows=1, keys=1, train_len=2, bucket=2)
    if args.text is not None and args.dataset is not None:
        raise refuse("give --text or --dataset, not both")
    factors = pk.parse_factors(args.passkey, BY)
    if factors and args.digits not in pk.DIGITS:
        raise refuse(f"--digits {args.digits}: must be in 1..18 (the passkey's length in digits)")
    depths = pk.parse_depths(args.depths, BY) if factors else []  # refused here, before any model loads
    destination = settings_of(Destination, args, options=dict(vars(args)))
    return settings_of(LengthEval, args, passkey=factors, depths=depths, destination=destination)


@dataclass(frozen=True)
class LengthResult:
    train_len: int  # C
    bucket: int  # target positions per loss bucket
    tokens: int  # per window
    windows: int
    bos: bool
    caches: list[str]
    loss: dict[str, list[float]]  # mode (full, x+y) -> mean NLL per bucket
    passkey: dict[str, dict[int, float | None]]  # mode -> f -> accuracy (%), None where f·C tokens hold no prompt
    seconds: float

    def to_json(self) -> dict:
        return asdict(self)

    def settings(self) -> dict:
        """What the MLflow tag records."""
        return {k: v for k, v in self.to_json().items() if k not in ("loss", "passkey", "seconds")}

    def metrics(self) -> dict[str, float]:
        loss = {N.length_loss(m.replace("+", "_"), b): v for m, vs in self.loss.items() for b, v in enumerate(vs)}
        keys = {N.length_passkey(m.replace("+", "_"), f): v for m, row in self.passkey.items() for f, v in row.items()}
        return loss | {name: v for name, v in keys.items() if v is not None}


def windows(subject, s: LengthEval, length: int, bos: int | None) -> torch.Tensor:
    """``s.windows`` windows [W, length]: BOS (when given) and length (−1) tokens of the text."""
    if s.dataset is not None and (bb := bb_windows(s, length)) is not None:
        return bb
    body = length - (bos is not None)
    stream = inputs.text_stream(subject, s.text, s.dataset, s.windows * body)
    try:
        ids = inputs.natural_windows(stream, s.windows, body)
    except ValueError as e:
        raise refuse(f"{e}; give a longer --text or lower --windows / --factor") from None
    return ids if bos is None else torch.cat([torch.full((len(ids), 1), bos), ids], 1)


def bb_windows(s: LengthEval, length: int) -> torch.Tensor | None:
    """A Bigram-Backcopy dataset's windows: fresh sequences of ``length`` tokens, BOS first; None for another."""
    from data_prep.synthetic_bb import long_sequences

    ids = long_sequences(inputs.dataset_manifest(s.dataset, "length-eval").raw, s.windows, length)
    if ids is not None and s.bos == "no":
        raise refuse(f"--dataset {s.dataset}: a Bigram-Backcopy sequence starts with BOS; drop --bos no")
    return None if ids is None else torch.from_numpy(ids)


def loss_by_position(streamer, ids: torch.Tensor, specs: list[CacheSpec], bucket: int) -> dict[str, list[float]]:
    """mode -> mean NLL per bucket of target positions (target t predicted from tokens 0..t−1)."""
    sums: dict[str, torch.Tensor] = {}
    for window in ids:
        sums[FULL] = sums.get(FULL, 0) + streamer.full_nll(window).double().cpu()
        for group in group_by_capacity(specs):
            for spec, row in zip(group, streamer.nll(window, group)):
                sums[str(spec)] = sums.get(str(spec), 0) + row.double()
    edges = range(0, ids.shape[1], bucket)  # targets 1..L-1; NLL index j is target position j + 1
    return {
        mode: [float(total[max(0, b - 1) : b - 1 + bucket].mean() / len(ids)) for b in edges]
        for mode, total in sums.items()
    }


def passkey_by_length(streamer, subject, s: LengthEval, C, specs, bos) -> dict[str, dict[int, float | None]]:
    """mode -> factor -> mean accuracy (%), None where f·C tokens cannot hold the prompt."""
    out: dict[str, dict[int, float | None]] = {FULL: {}} | {str(spec): {} for spec in specs}
    for f in s.passkey:
        try:
            trials = pk.make_trials(subject.tokenizer, f * C, s.depths, s.keys, s.digits, s.seed, bos)
        except ValueError as e:
            print(f"  passkey at {f}xC = {f * C} tokens: skipped ({e})", file=sys.stderr)
            out = {mode: row | {f: None} for mode, row in out.items()}
            continue
        caches = {CacheSpec(0, f * C + 32): FULL} | {spec: str(spec) for spec in specs}
        table = pk.accuracy(pk.run_trials(streamer, subject.tokenizer, trials, caches), list(out), s.depths)
        for mode, row in table.items():
            out[mode][f] = sum(cell["accuracy"] for cell in row.values()) / len(row)
    return out


def evaluate(subject, s: LengthEval) -> LengthResult:
    if s.train_len is None and subject.kind != "sinklab":
        raise refuse(f"{subject.spec}: --train-len is needed for a Hugging Face model (its training length)")
    C = s.train_len or subject.model.config.max_seq_len
    bucket = s.bucket or max(1, C // 2)
    specs = parse_caches(s.cache, "length-eval", (f"0+{C}", f"1+{C - 1}"))
    bos = bos_id(subject, s.bos)
    longest = max([s.factor * C] + [f * C + 32 for f in s.passkey])
    if subject.kind == "sinklab" and subject.model.config.positional == "learned" and longest > subject.max_positions():
        raise refuse(
            f"{subject.spec}: learned positions end at {subject.max_positions()}; {longest} tokens are asked "
            "(--factor and --passkey times C): lower them"
        )
    try:
        streamer = streamer_for(subject)
    except ValueError as e:
        raise refuse(f"{subject.spec}: {e}") from None
    started = time.perf_counter()
    ids = windows(subject, s, s.factor * C, bos).to(next(subject.model.parameters()).device)
    loss = loss_by_position(streamer, ids, specs, bucket)
    passkey = passkey_by_length(streamer, subject, s, C, specs, bos) if s.passkey else {}
    seconds = round(time.perf_counter() - started, 1)
    return LengthResult(
        C, bucket, ids.shape[1], ids.shape[0], bos is not None, list(map(str, specs)), loss, passkey, seconds
    )


def markdown(results: dict[str, LengthResult]) -> str:
    """A row per model and mode: the loss by position bucket (in units of C) and the passkey accuracy per f x C."""
    first = next(iter(results.values()))
    share = first.bucket / first.train_len
    buckets = [f"{b * share:g}-{(b + 1) * share:g}C" for b in range(len(first.loss[FULL]))]
    factors = sorted({f for r in results.values() for row in r.passkey.values() for f in row})
    lines = [
        "Loss by position (mean NLL per bucket, in multiples of the training length C) and passkey accuracy (%) "
        "at f x C tokens; full = full attention, x+y = a streaming cache of C entries keeping the first x",
        "",
        "| model | C | mode | " + " | ".join(buckets) + "".join(f" | passkey {f}x" for f in factors) + " |",
        "|---|---|---|" + "---|" * (len(buckets) + len(factors)),
    ]
    for name, r in results.items():
        for mode, values in r.loss.items():
            keys = [r.passkey.get(mode, {}).get(f) for f in factors]
            cells = [f"{v:.3f}" for v in values] + ["n/a" if v is None else f"{v:.0f}" for v in keys]
            lines.append(f"| {name} | {r.train_len} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(results: dict[str, LengthResult], path: Path, by: str) -> Path:
    panels: dict[str, dict] = {}
    for name, r in results.items():
        panels[f"loss by position: {name}"] = {
            mode: ([(b + 0.5) * r.bucket / r.train_len for b in range(len(v))], v) for mode, v in r.loss.items()
        }
        for mode, row in r.passkey.items():
            points = [(f, v) for f, v in row.items() if v is not None]
            if points:
                panels.setdefault("passkey accuracy (%)", {})[f"{name} {mode}"] = tuple(zip(*points))
    return plots.curve_panels(panels, path, "length generalisation", xlabel="position (or prompt length) / C", by=by)


def main(argv: list[str] | None = None) -> int:
    s = check_args(build_parser().parse_args(argv))
    device_of(s.device, "length-eval")
    d = s.destination
    names, out, by = claim_out(d.models, d.out, BY, "length", OUTPUTS)
    results, subjects = {}, {}
    for spec, name in zip(d.models, names):
        subjects[name] = Subject(spec, s.kind, s.tokenizer_file, "length-eval", device=s.device)
        if s.dataset is not None:
            inputs.check_dataset_tokenizer(subjects[name], s.dataset)
        print(f"{name}: evaluating", file=sys.stderr)
        results[name] = evaluate(subjects[name], s)
    save_results(out, "length", markdown(results), d.options, results, by, figure)
    log_results_of(subjects, "length", results, LengthResult.settings, out, d)
    print(f"wrote {out}/{', '.join(OUTPUTS)}", file=sys.stderr)
    return 0
