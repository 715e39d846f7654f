"""`sinklab quant-eval`'s cost against one plain perplexity pass, in one process, on the same windows.

MODEL and the options are quant-eval's (--max-tokens 512 here); the last line is
``ratio=<all of quant-eval / plain pass>``, after ``probe_ratio=`` and ``pass_ratio=``.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
from side_by_side import interleaved

from data_prep.dataset import load_probe
from pipeline.analysis.fake_quant import SETTINGS
from pipeline.analysis.quant_eval import Evaluator, build_parser, check_args, lead_of, load_tokens, make_windows
from pipeline.analysis.subject import Subject
from pipeline.model import ModelConfig, Transformer
from pipeline.outliers import OutlierAccumulator
from pipeline.probe import run_probe


def probe_ratio(dataset: Path) -> float:
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("tiny", vocab_size=4096))
    tokens = torch.from_numpy(load_probe(dataset)).long()
    run_probe(model, tokens[:10])
    times, _ = interleaved({o: lambda o=o: run_probe(model, tokens, outliers=o) for o in (False, True)}, 8)
    with_, without = statistics.median(times[True]), statistics.median(times[False])
    print(
        f"sink probe of the embedded model, {tokens.shape[0]} x {tokens.shape[1]} tokens: {without:.3f} s without "
        f"the outlier metrics, {with_:.3f} s with them (median of 8)"
    )
    return with_ / without


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.prog = "bench_quant.py"
    parser.set_defaults(max_tokens=512)
    args = parser.parse_args(argv)
    q = check_args(args)
    subject = Subject(q.model, q.kind, q.tokenizer_file, "quant-eval")
    ids, bos, _ = load_tokens(subject, q)
    windows = make_windows(ids, q.seq_len, bos)
    lead = lead_of(subject, q)
    evaluator = Evaluator(subject.model, subject.kind, windows, lead, q.batch_size)
    works = {
        "plain": lambda: evaluator.nll("fp"),
        "w8a8": lambda: evaluator.nll("w8a8-tensor"),
        "recorded": lambda: evaluator.nll("fp", OutlierAccumulator(lead)),
        "all": lambda: evaluator.run(q.settings),
    }
    times, out = interleaved(works, 2)
    plain, recorded, (results, _) = out["plain"], out["recorded"], out["all"]
    t_plain, t_w8a8, t_recorded, t_all = (min(times[name]) for name in works)

    same = torch.equal(plain, recorded) and abs(results["fp"]["nll"] - plain.double().mean().item()) < 1e-9
    print(
        f"{args.model}: {len(windows)} windows of {args.seq_len} tokens, {torch.get_num_threads()} threads, "
        f"best of 2, interleaved"
    )
    print(
        f"plain full-precision pass {t_plain:.2f} s; one W8A8 pass {t_w8a8:.2f} s; "
        f"full precision recording outliers {t_recorded:.2f} s; quant-eval, {len(q.settings)} settings {t_all:.2f} s"
    )
    shown = [setting for setting in ("fp", "w8a8-tensor") if setting in results]
    print("perplexity " + ", ".join(f"{setting} {results[setting]['perplexity']:.3f}" for setting in shown))
    print(f"same full-precision nll: {same}; settings: {', '.join(s for s in q.settings if s in SETTINGS)}")
    if Path("data/embedded/probe.bin").is_file():
        print(f"probe_ratio={probe_ratio(Path('data/embedded')):.2f}")
    print(f"pass_ratio={t_w8a8 / t_plain:.2f}")
    print(f"ratio={t_all / t_plain:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
