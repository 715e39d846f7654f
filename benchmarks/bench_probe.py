"""One live sink probe against the training steps between two probes, measured side by side, and what its
information-flow metrics add (the probe without them and with every sequence perturbed, docs/analysis.md).

The last line, ``ratio=<probe seconds / (every x step seconds)>``, is the probe's share of training in
wall time (docs/training.md); ``overhead=`` and ``overhead_all=`` before it, the flow metrics' share.
"""

from __future__ import annotations

import cProfile
import math
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from side_by_side import arguments, interleaved, train_step

from data_prep.dataset import load_manifest, load_probe
from pipeline.flow import TRAINING_MIXING_SEQUENCES
from pipeline.model import ModelConfig, Transformer
from pipeline.probe import run_probe
from pipeline.train.callbacks import probe_figures

# parts of one probe, by the (file, function) whose cumulative time is theirs
PARTS = {
    "perturbed forward and flow entropies (flow.add_pass)": ("flow.py", "add_pass"),
    "  flow entropies (flow.matrix_entropy)": ("flow.py", "matrix_entropy"),
    "metrics of the forward's tensors (SinkAccumulator.add)": ("probe.py", "add"),
    "  registered metrics (probe_metrics.measure)": ("probe_metrics.py", "measure"),
    "    of which the largest logit": ("probe_metrics.py", "max_logit"),
    "    of which the attention entropy": ("probe_metrics.py", "entropy"),
    "  outlier statistics of the states (add_hidden)": ("outliers.py", "add_hidden"),
    "outlier hooks on the linear inputs (add_linear)": ("outliers.py", "add_linear"),
    "reductions over sequences (SinkAccumulator.measures)": ("probe.py", "measures"),
    "MLflow names (to_metrics, head_metrics)": ("sink_measures.py", "to_metrics"),
}


def profile(fn) -> dict[str, float]:
    """Cumulative seconds of each of PARTS in one call of ``fn``, and the whole call's."""
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.runcall(fn)
    total = time.perf_counter() - start
    stats = pstats.Stats(prof).stats  # (file, line, function) -> (calls, primitive, own, cumulative, callers)
    seconds = {}
    for label, (file, function) in PARTS.items():
        seconds[label] = sum(v[3] for (f, _, n), v in stats.items() if f.endswith("/" + file) and n == function)
    outside = sum(seconds[k] for k in PARTS if not k.startswith(" "))
    return {"probe forward with maps, states, q/k/v (the rest)": total - outside, **seconds, "whole probe": total}


def main() -> None:
    p = arguments(__doc__, preset="tiny", context=128, repeats=3)
    p.add_argument("--data", default="data/embedded", help="prepared dataset (its probe set and vocabulary)")
    p.add_argument("--op", default="kernel", help="arch.attention.op (make run: kernel)")
    p.add_argument("--every", type=int, default=500, help="run.sink_every (embedded: 500; paper-60m: 200)")
    p.add_argument("--plot-every", type=int, default=1000, help="run.plot_every (embedded: 1000; paper-60m: 2000)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (embedded: 8 of 128)")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps timed per round")
    args = p.parse_args()
    manifest = load_manifest(args.data)
    attention = {"op": args.op} | ({"feature_map": "elu1"} if args.op == "kernel" else {})
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset(args.preset, vocab_size=manifest.vocab_size, attention=attention))
    probe = torch.from_numpy(load_probe(args.data)).long()
    plot_dir = Path(tempfile.mkdtemp(prefix="bench-probe-"))
    step = train_step(model, torch.randint(0, manifest.vocab_size, (args.batch, args.context + 1)), lr=1e-4)

    def probe_as_trained(flow: bool = True, mixing_sequences: int | None = TRAINING_MIXING_SEQUENCES):
        measures = run_probe(model, probe, flow=flow, mixing_sequences=mixing_sequences)
        measures.to_metrics() | measures.head_metrics()
        return measures

    step()
    measures = probe_as_trained()  # warm-up
    works = {
        "probe": probe_as_trained,
        "probe without flow": lambda: probe_as_trained(flow=False),
        "probe, every sequence perturbed": lambda: probe_as_trained(mixing_sequences=None),
        "figures": lambda: probe_figures(measures, 0, plot_dir, None),
        "step": lambda: [step() for _ in range(args.steps)],
    }
    both = lambda: np.array([time.perf_counter(), time.process_time()])  # wall and CPU seconds
    seconds, _ = interleaved(works, args.repeats, both)
    best = {name: np.min(s, axis=0) for name, s in seconds.items()}
    best["step"] /= args.steps
    for name, seconds in profile(probe_as_trained).items():
        print(f"profile: {name:56s} {seconds * 1000:9.1f} ms")
    for name, (wall, cpu) in best.items():
        print(f"{name:40s} {wall * 1000:9.1f} ms wall {cpu * 1000:9.1f} ms cpu")
    step_wall, step_cpu = best["step"]
    plain, every = best["probe without flow"][0], best["probe, every sequence perturbed"][0]
    extra, extra_all = best["probe"][0] - plain, every - plain
    print(f"flow per probe, training ({TRAINING_MIXING_SEQUENCES} sequences perturbed) / every sequence: ", end="")
    print(f"{extra:.3f} / {extra_all:.3f} s; flow_ratio={extra / extra_all:.3f}")
    print(f"overhead={extra / (args.every * step_wall):.4f} overhead_all={extra_all / (args.every * step_wall):.4f}")
    print(f"figures_ratio={best['figures'][0] / (args.plot_every * step_wall):.4f}")
    print(f"cpu_ratio={best['probe'][1] / (args.every * step_cpu):.4f}")
    print(f"every_for_1pct={math.ceil(best['probe'][1] / (0.01 * step_cpu))}  (the least sink_every at 1% in CPU time)")
    print(f"ratio={best['probe'][0] / (args.every * step_wall):.4f}")


if __name__ == "__main__":
    main()
