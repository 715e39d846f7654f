"""`sinklab quant-eval`: perplexity at full precision and under simulated W8A8, and what keeping
the sink intact buys (docs/analysis.md, "`sinklab quant-eval`")."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline import metric_names as N
from pipeline.analysis import inputs
from pipeline.analysis.fake_quant import SETTINGS, fake_quantized
from pipeline.analysis.hf_capture import decoder_blocks
from pipeline.analysis.streamers import perplexity
from pipeline.analysis.streaming import Reading, add_text_arguments, bos_id
from pipeline.analysis.subject import Subject, add_model_arguments, claimed, log_back, model_name, write_json, writer
from pipeline.outliers import OutlierAccumulator, capturing_block_outputs, capturing_linear_inputs, summary_table
from sinklab_io.mappings import settings_of
from sinklab_io.outputs import write_output

BY = "sinklab quant-eval"
DEFAULT_SETTINGS = tuple(SETTINGS)
RECOVERY_MIN_GAP_PCT = 1.0  # below this a setting's gap is noise: no recovery share is given


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sinklab quant-eval", description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    add_text_arguments(p)
    p.add_argument("--max-tokens", type=int, default=2048, help="read the first N tokens of the text")
    p.add_argument("-T", "--seq-len", type=int, default=128, help="tokens per window, BOS included")
    p.add_argument(
        "--settings", default=",".join(DEFAULT_SETTINGS), help=f"comma list of {','.join(SETTINGS)} (fp always runs)"
    )
    p.add_argument(
        "--lead",
        type=int,
        help="leading positions kept intact / left out of the int8 step "
        "(default: the model's sink tokens + the first token)",
    )
    p.add_argument("--batch-size", type=int, default=1, help="windows per forward (results do not depend on it)")
    p.add_argument(
        "--out", type=Path, help="output directory (default: analysis/<model>/quant): quant_eval.json and quant_eval.md"
    )
    return p


@dataclass(frozen=True)
class QuantEval(Reading):
    """`sinklab quant-eval`'s settings: the text's first ``max_tokens`` tokens in windows of ``seq_len``, fp first."""

    model: str
    max_tokens: int
    seq_len: int
    settings: list[str]
    lead: int | None
    batch_size: int
    out: Path


def check_args(args: argparse.Namespace) -> QuantEval:
    names = inputs.comma_list(args.settings, "--settings", BY, allowed=SETTINGS, empty=True)
    if args.dataset is not None and args.text is not None:
        raise SystemExit("sinklab quant-eval: give --text or --dataset, not both")
    inputs.at_least(args, BY, seq_len=3, batch_size=1)
    out = args.out or Path("analysis") / model_name(args.model) / "quant"
    settings = ["fp"] + [s for s in dict.fromkeys(names) if s != "fp"]
    return settings_of(QuantEval, args, settings=settings, out=out, device="cpu")


def make_windows(ids: list[int], seq_len: int, bos: int | None) -> torch.Tensor:
    """Consecutive windows ``[N, seq_len]`` of ``ids``, each BOS first when ``bos`` is given; no partial window."""
    step = seq_len - (bos is not None)
    n = len(ids) // step
    rows = [([] if bos is None else [bos]) + ids[i * step : (i + 1) * step] for i in range(n)]
    return torch.tensor(rows, dtype=torch.long).view(n, seq_len)


class Evaluator:
    def __init__(self, model: torch.nn.Module, kind: str, windows: torch.Tensor, lead: int, batch_size: int = 1):
        self.model, self.kind, self.windows, self.batch_size = model.eval(), kind, windows, batch_size
        self.blocks = model.blocks if kind == "sinklab" else decoder_blocks(model)
        self.sink_tokens = model.config.sink_tokens if kind == "sinklab" else 0
        self.lead, self.kwargs = lead, {} if kind == "sinklab" else {"use_cache": False}
        self.skip = max(1, lead - self.sink_tokens)  # predictions made at these real positions are not scored

    @torch.no_grad()
    def nll(self, setting: str, outliers: OutlierAccumulator | None = None) -> torch.Tensor:
        """NLL of every scored prediction ``[N, T − 1 − skip]`` under one setting; ``outliers`` collects the pass's."""
        rows = []
        with fake_quantized(self.blocks, SETTINGS[setting], self.lead):
            for start in range(0, len(self.windows), self.batch_size):
                ids = self.windows[start : start + self.batch_size]
                if outliers is None:
                    logits = self.model(ids, **self.kwargs).logits
                else:
                    with capturing_linear_inputs(self.blocks, outliers), capturing_block_outputs(self.blocks) as hidden:
                        logits = self.model(ids, **self.kwargs).logits
                    outliers.add_hidden(hidden)
                scored = logits[:, self.skip : -1].float()
                rows.append(F.cross_entropy(scored.transpose(1, 2), ids[:, self.skip + 1 :], reduction="none"))
        return torch.cat(rows)

    def run(self, settings: list[str]) -> tuple[dict[str, dict], OutlierAccumulator]:
        outliers = OutlierAccumulator(self.lead)
        results: dict[str, dict] = {}
        for name in settings:
            start = time.perf_counter()
            nll = self.nll(name, outliers if name == "fp" else None)
            results[name] = {
                "description": SETTINGS[name].description,
                "nll": nll.double().mean().item(),
                "perplexity": perplexity(nll),
                "seconds": round(time.perf_counter() - start, 3),
            }
        # gap_pct and recovered_pct as docs/analysis.md ("sinklab quant-eval") defines them
        fp = results["fp"]["perplexity"]
        for name, r in results.items():
            r["gap_pct"] = 100.0 * (r["perplexity"] / fp - 1.0)
            setting = SETTINGS[name]
            base = results.get(f"w8a8-{setting.activations}") if setting.lead != "none" else None
            recoverable = base is not None and base["gap_pct"] >= RECOVERY_MIN_GAP_PCT
            r["recovered_pct"] = (
                100.0 * (base["perplexity"] - r["perplexity"]) / (base["perplexity"] - fp) if recoverable else None
            )
        return results, outliers


def markdown(result: dict) -> str:
    s = result["settings"]
    head = (
        f"{result['model']}: perplexity of {s['scored']} predictions ({s['windows']} windows of {s['seq_len']} "
        f"tokens, {'BOS first' if s['bos_first'] else 'no BOS'}; {s['text']}); leading positions: {s['lead']}"
    )
    lines = [head, "", "| setting | perplexity | gap vs fp (%) | gap recovered (%) |", "|---|---|---|---|"]
    for name, r in result["results"].items():
        recovered = "" if r["recovered_pct"] is None else f"{r['recovered_pct']:.1f}"
        lines.append(f"| {name} | {r['perplexity']:.3f} | {r['gap_pct']:.2f} | {recovered} |")
    if result.get("outliers"):
        lines += ["", "Activation outliers at full precision (largest over layers)", ""]
        lines += summary_table({result["model"]: result["outliers"]["summary"]})
    return "\n".join(lines)


def load_tokens(subject, q: QuantEval) -> tuple[list[int], int | None, str]:
    """The token stream, the BOS id to start each window with (or None) and a label of the text."""
    if q.dataset is not None:
        inputs.check_dataset_tokenizer(subject, q.dataset)
    text = f"dataset {q.dataset} (val)" if q.dataset else str(q.text or inputs.default_text())
    ids = inputs.text_stream(subject, q.text, q.dataset, q.max_tokens)[: q.max_tokens]
    return ids, bos_id(subject, q.bos), text


def main(argv: list[str] | None = None) -> int:
    q = check_args(build_parser().parse_args(argv))
    claimed(q.out, ("quant_eval.md", "quant_eval.json"), BY, [q.model])
    result = run(Subject(q.model, q.kind, q.tokenizer_file, "quant-eval"), q)
    print(markdown(result))
    if "mlflow_run_id" in result:
        print(f"logged to MLflow run {result['mlflow_run_id']} as quant/perplexity_<setting>")
    print(f"wrote {result['out']}/quant_eval.json")
    return 0


def lead_of(subject, q: QuantEval) -> int:
    """--lead, by default the sink tokens and BOS; refused (one line) where it leaves under two positions."""
    sink_tokens = subject.model.config.sink_tokens if subject.kind == "sinklab" else 0
    lead = q.lead if q.lead is not None else sink_tokens + 1
    if not sink_tokens < lead < q.seq_len + sink_tokens - 1:
        raise SystemExit(
            f"sinklab quant-eval: --lead {lead}: must cover the {sink_tokens} sink token(s) and leave "
            f"at least two of the {q.seq_len} window positions (between {sink_tokens + 1} and "
            f"{q.seq_len + sink_tokens - 2})"
        )
    return lead


def run(subject, q: QuantEval) -> dict:
    subject.check_seq_len(q.seq_len)
    lead = lead_of(subject, q)
    ids, bos, text = load_tokens(subject, q)
    windows = make_windows(ids, q.seq_len, bos)
    if len(windows) == 0:
        raise SystemExit(
            f"sinklab quant-eval: {text}: {len(ids)} tokens do not fill one window of {q.seq_len}; "
            "give more text (--max-tokens) or lower --seq-len"
        )
    evaluator = Evaluator(subject.model, subject.kind, windows, lead, q.batch_size)
    results, outliers = evaluator.run(q.settings)
    measures = outliers.measures()
    result = {
        **subject.header(q.out),
        "settings": {
            "text": text,
            "tokens": len(ids),
            "windows": len(windows),
            "seq_len": q.seq_len,
            "bos_first": bos is not None,
            "lead": lead,
            "scored": windows.shape[0] * (q.seq_len - 1 - evaluator.skip),
        },
        "results": results,
        "outliers": measures.to_json() if measures is not None else None,
    }
    by = writer(BY, [subject.spec])
    write_output(q.out / "quant_eval.md", markdown(result) + "\n", by)
    write_json(result, q.out / "quant_eval.json", by)
    if subject.run_id is not None:  # runs:/<id>: back on the training run, under quant/
        values = {
            N.quant(f"{key}_{n.replace('-', '_')}"): r[key]
            for n, r in results.items()
            for key in ("perplexity", "gap_pct", "recovered_pct")
            if r[key] is not None
        }
        if measures is not None:
            values.update({N.quant(N.act(k)): v for k, v in measures.summary().items() if not k.endswith("_at")})
        result["mlflow_run_id"] = log_back(subject, "quant", values, result["settings"], q.out)
        write_json(result, q.out / "quant_eval.json", by)
    return result
