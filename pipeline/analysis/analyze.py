"""`sinklab analyze`: attention-sink metrics and plots of a pretrained model.

Gu et al. 2025 Table 1 (left), B.2, Table 7 and Figures 2, 5, 19-24; docs/analysis.md says what each output holds."""

from __future__ import annotations

import argparse
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from pipeline import metric_names as N
from pipeline import plots, probe_metrics
from pipeline.analysis import inputs, secondary
from pipeline.analysis.subject import Subject, add_model_arguments, claimed, log_back, model_name, write_json, writer
from pipeline.analysis.tables import format_table
from pipeline.sink_measures import SinkMeasures
from sinklab_io.mappings import settings_of

BY = "sinklab analyze"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sinklab analyze", description=__doc__.split("\n\n")[0])
    add_model_arguments(p, logged=True)
    inputs.add_probe_arguments(p)
    p.add_argument("--positions", type=int, default=10, help="Sink_k reported for k = 1..positions")
    p.add_argument("--pile", type=Path, help="Pile-format .jsonl[.zst] shard: add a Sink_1 breakdown per domain")
    p.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer.json of a SinkLab checkpoint (default: --dataset's, "
        "else one beside the checkpoint); gives it --text, --pile and --bos",
    )
    p.add_argument(
        "--gpt2-positions",
        metavar="MODE:T,T..",
        action="append",
        help="Table 7 on models with learned absolute positions: e.g. replace:5,10,25 or swap:5,10",
    )
    p.add_argument(
        "--bos",
        action="store_true",
        help="start every sequence with the tokenizer's BOS (T tokens in all; the paper's protocol has none)",
    )
    p.add_argument("--out", type=Path, help="output directory (default: analysis/<model>)")
    p.add_argument("--no-plots", action="store_true")
    return p


@dataclass(frozen=True)
class Analysis(inputs.ProbeSettings):
    model: str
    kind: str
    tokenizer: Path | None
    device: str
    edits: list[tuple[str, int]]  # --gpt2-positions as (mode, t)
    pile: Path | None
    out: Path
    no_plots: bool
    mlflow_uri: str | None
    experiment: str


def check_args(args: argparse.Namespace) -> Analysis:
    inputs.at_least(args, BY, num_sequences=1, seq_len=2)
    if not 0 <= args.eps < 1:
        raise SystemExit(f"sinklab analyze: --eps {args.eps}: α lies in [0, 1], so ε must be in [0, 1) (paper: 0.3)")
    kinds = tuple(inputs.comma_list(args.inputs, "--inputs", BY, allowed=inputs.INPUT_KINDS))
    edits = parse_position_edits(args.gpt2_positions)
    if outside := [t for _, t in edits if not 2 <= t <= args.seq_len]:
        raise SystemExit(f"sinklab analyze: --gpt2-positions position {outside[0]} outside 2..{args.seq_len}")
    out = args.out or Path("analysis") / model_name(args.model)
    tokenizer = inputs.tokenizer_file(args.tokenizer, args.dataset)
    return settings_of(Analysis, args, inputs=kinds, edits=edits, tokenizer=tokenizer, out=out)


def parse_position_edits(specs: list[str] | None) -> list[tuple[str, int]]:
    edits = []
    for spec in specs or []:
        m = re.fullmatch(r"(replace|swap):(\d+(?:,\d+)*)", spec.strip())
        if not m:
            raise SystemExit(f"sinklab analyze: --gpt2-positions {spec!r}: expected replace:T[,T..] or swap:T[,T..]")
        edits += [(m.group(1), int(t)) for t in m.group(2).split(",")]
    return edits


def learned_positions(subject: Subject) -> torch.nn.Embedding | None:
    wpe = getattr(getattr(subject.model, "transformer", None), "wpe", None)
    return wpe if isinstance(wpe, torch.nn.Embedding) else None


def learned_position_table(subject: Subject, tokens: torch.Tensor, a: Analysis) -> list[dict]:
    """Table 7: Sink_1 and Sink_t after replacing p_1 by p_t or swapping p_1 and p_t."""
    wpe = learned_positions(subject)
    rows = []
    original = wpe.weight.detach().clone()
    probe = replace(a, positions=max([t for _, t in a.edits] + [a.positions]))
    try:
        for mode, t in a.edits:
            with torch.no_grad():
                wpe.weight.copy_(original)
                wpe.weight[0] = original[t - 1]
                if mode == "swap":
                    wpe.weight[t - 1] = original[0]
            measures = subject.measure(tokens, probe)
            rows.append({"mode": mode, "t": t, "sink1": measures.sink1, "sink_t": measures.profile[t - 1]})
    finally:
        with torch.no_grad():
            wpe.weight.copy_(original)
    return rows


def output_names(a: Analysis) -> list[str]:
    """What `sinklab analyze` writes into --out (checked before any work)."""
    if a.no_plots:
        return ["measures.json"]
    alpha1 = [f"alpha1_{k}.png" for k in a.inputs]
    natural = [secondary.FIGURE] if "natural" in a.inputs else []
    figures = ["sink_profile.png", *alpha1, "norm_ratio.png", "qk_decomposition.png", "flow.png", *natural]
    return ["measures.json", *figures]


def probe_bos(probe: inputs.ProbeSettings) -> bool:
    """Whether the natural inputs are ``--dataset``'s probe sequences written BOS first (a Bigram-Backcopy dataset's)."""
    if probe.dataset is None or probe.bos or "natural" not in probe.inputs:
        return False
    from data_prep.dataset import load_manifest

    return load_manifest(probe.dataset).probe.bos


def write_plots(name: str, measures_of: dict[str, SinkMeasures], out: Path, eps: float, by: str) -> list[Path]:
    profiles = {k: r.profile for k, r in measures_of.items()}
    paths = [plots.sink_profile(profiles, out / "sink_profile.png", f"{name}: Sink_k by position", eps, by)]
    for kind, measures in measures_of.items():
        panels = {key: getattr(measures, key) for key in ("entropy", "out_norm", "dormant", "max_logit")}
        title = f"{name} ({kind}): α₁ per layer and head"
        paths.append(plots.alpha1_heatmap(measures.alpha1, out / f"alpha1_{kind}.png", title, **panels, by=by))
    first = measures_of.get("natural") or next(iter(measures_of.values()))
    curves = {"hidden states": first.massive_ratio.tolist()}
    for label, t in (("keys", first.key_norm_ratio), ("values", first.value_norm_ratio)):
        if t is not None:
            curves[label] = t.tolist()
    paths.append(plots.norm_ratio_curves(curves, out / "norm_ratio.png", f"{name}: first-token ℓ2-norm ratio", by))
    if first.qk_decomposition is not None:
        title = f"{name}: QK decomposition"
        paths.append(plots.qk_decomposition(first.qk_decomposition, out / "qk_decomposition.png", title, by))
    if any(measures.flow is not None for measures in measures_of.values()):
        paths.append(flow_figure(name, measures_of, out / "flow.png", by))
    return paths


def flow_figure(name: str, measures_of: dict[str, SinkMeasures], path: Path, by: str) -> Path:
    """Per layer and input kind: the norm ratio, matrix entropy and over-mixing sensitivity (−1: the embeddings)."""
    panels = {"‖h₁‖ / mean ‖h_t≠1‖": {}, "matrix entropy (normalised)": {}, "over-mixing sensitivity": {}}
    for kind, measures in measures_of.items():
        if measures.flow is None:
            continue
        layers = list(range(len(measures.flow.entropy)))
        lead = [-1] if measures.flow.entropy_input is not None else []
        first = [measures.flow.norm_ratio_input] if lead else []
        panels["‖h₁‖ / mean ‖h_t≠1‖"][kind] = (lead + layers, first + measures.massive_ratio.tolist())
        entropy = ([measures.flow.entropy_input] if lead else []) + measures.flow.entropy.tolist()
        panels["matrix entropy (normalised)"][kind] = (lead + layers, entropy)
        if measures.flow.mixing is not None:
            panels["over-mixing sensitivity"][kind] = (layers, measures.flow.mixing.tolist())
    panels = {k: v for k, v in panels.items() if v}
    return plots.curve_panels(
        panels, path, f"{name}: information flow (layer −1: embeddings)", log_panels=panels, by=by
    )


def result_metrics(result: dict) -> dict[str, float]:
    """The analysis as MLflow metrics: per input kind and per Pile domain, and the secondary sinks."""
    metrics = {N.table1(k): v for k, v in result["table1"].items()}
    for kind, measures in result["measures"].items():
        metrics |= {N.input_sink_k(kind, k): v for k, v in enumerate(measures["profile"], start=1)}
        summary = (measures.get("outliers") or {}).get("summary", {})
        metrics |= {N.of_input(kind, N.act(k)): v for k, v in summary.items() if not k.endswith("_at")}
        metrics |= {N.of_input(kind, k): v for k, v in result["probe_metrics"][kind].items()}
        metrics |= {N.of_input(kind, k): v for k, v in result.get("flow", {}).get(kind, {}).items() if v is not None}
    metrics |= {N.domain(re.sub(r"[^A-Za-z0-9_.-]", "_", d)): v for d, v in result.get("domains", {}).items()}
    return metrics | result.get("secondary_sinks", {}).get("metrics", {})


def log_on_run(subject: Subject, result: dict, out: Path) -> str:
    """The metrics (and mean α₁ per input kind) on the training run, the output directory under ``analysis/``."""
    values = {N.analysis(k): v for k, v in result_metrics(result).items()}
    alpha1 = {
        kind: measures["alpha1"] for kind, measures in result["measures"].items() if measures.get("alpha1") is not None
    }
    values |= {N.analysis(N.of_input(kind, "alpha1_mean")): float(torch.tensor(a).mean()) for kind, a in alpha1.items()}
    return log_back(subject, "analysis", values, result["settings"], out)


def main(argv: list[str] | None = None) -> int:
    a = check_args(build_parser().parse_args(argv))
    claimed(a.out, output_names(a), BY, [a.model])
    started = time.perf_counter()
    subject = Subject(a.model, a.kind, a.tokenizer, device=a.device)
    subject.check_seq_len(a.seq_len)
    if a.dataset is not None:
        manifest = inputs.dataset_manifest(a.dataset, "analyze")
        inputs.check_dataset_tokenizer(subject, a.dataset, manifest)
        subject.trigger_ids = manifest.trigger_ids  # a Bigram-Backcopy dataset's, else None
    result = run(subject, a, load_seconds=time.perf_counter() - started)
    print(format_table(result))
    print(
        f"wrote {result['out']}/measures.json"
        + (f"; MLflow run {result['mlflow_run_id']}" if "mlflow_run_id" in result else "")
    )
    return 0


def run(subject: Subject, a: Analysis, load_seconds: float = 0.0) -> dict:
    started = time.perf_counter()
    name, by, out = model_name(a.model), writer(BY, [subject.spec]), a.out
    # refusals before any work, and before the output folder exists: a refused input leaves none
    if a.edits and learned_positions(subject) is None:
        raise SystemExit(
            f"sinklab analyze: --gpt2-positions needs learned absolute positions (transformer.wpe); "
            f"{type(subject.model).__name__} has none"
        )
    if a.pile is not None and subject.tokenizer is None:
        raise SystemExit(
            "sinklab analyze: --pile on a SinkLab checkpoint needs its tokenizer: --tokenizer "
            "<dataset>/tokenizer.json or --dataset DIR"
        )
    sets = inputs.probe_sets(subject, a)
    out.mkdir(parents=True, exist_ok=True)
    measures_of = {kind: subject.measure(tokens, a) for kind, tokens in sets.items()}
    result = {
        **subject.header(out),
        "settings": {k: getattr(a, k) for k in ("num_sequences", "seq_len", "eps", "seed", "positions", "bos")}
        | {"probe_bos": probe_bos(a)},
        "table1": {kind: measures.sink1 for kind, measures in measures_of.items()},
        "measures": {kind: measures.to_json() for kind, measures in measures_of.items()},
        # per layer: residual-state peak, value-state drain, BOS share by query kind (Guo et al. 2024)
        "extreme_tokens": {kind: measures.extreme_token_metrics() for kind, measures in measures_of.items()},
        # every registered probe metric (pipeline.probe_metrics) under its MLflow name
        "probe_metrics": {kind: probe_metrics.to_metrics(measures.values) for kind, measures in measures_of.items()},
        # per layer: matrix entropy, over-mixing sensitivity; where the BOS norm jumps and the entropy drops
        "flow": {
            kind: measures.flow.to_metrics() | measures.flow.landmarks(measures.massive_ratio)
            for kind, measures in measures_of.items()
            if measures.flow is not None
        },
    }
    if "natural" in sets:  # secondary sinks per layer (pipeline.secondary_sinks)
        result["secondary_sinks"] = secondary.secondary_section(
            subject, sets["natural"], a, None if a.no_plots else out, name
        )
    if a.pile is not None:
        domains = inputs.pile_domains(subject.tokenizer, a.pile, a.num_sequences, a.seq_len)
        result["domains"] = {d: subject.measure(toks, a).sink1 for d, toks in domains.items()}
    if a.edits:
        tokens = sets["natural"] if "natural" in sets else inputs.natural_tokens(subject, a)
        result["learned_positions"] = learned_position_table(subject, tokens, a)
    if not a.no_plots:
        result["plots"] = [p.name for p in write_plots(name, measures_of, out, a.eps, by)]
    result["seconds"] = {"load": round(load_seconds, 2), "analysis": round(time.perf_counter() - started, 2)}
    write_json(result, out / "measures.json", by)
    if getattr(subject, "run_id", None) is not None:  # runs:/<id>: on the training run itself, under analysis/
        result["mlflow_run_id"] = log_on_run(subject, result, out)
    elif uri := a.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI"):
        from pipeline.tracking import log_new_run

        tags = {"sinklab.kind": "analysis", "sinklab.model": result["model"]}
        params = {k: result["settings"][k] for k in ("num_sequences", "seq_len", "eps", "seed")}
        metrics = result_metrics(result)
        result["mlflow_run_id"] = log_new_run(uri, a.experiment, f"analyze-{name}", tags, params, metrics, out)
    if "mlflow_run_id" in result:
        write_json(result, out / "measures.json", by)
    return result
