"""What the information-flow metrics add to training, measured side by side in one process.

The last lines, ``overhead=<flow seconds per probe / (sink_every x step seconds)>`` and ``overhead_all=``,
are upper bounds (docs/analysis.md).
"""

from __future__ import annotations

import timeit

import torch
from side_by_side import arguments, interleaved, train_step

from data_prep.dataset import load_manifest, load_probe
from pipeline.flow import TRAINING_MIXING_SEQUENCES
from pipeline.model import ModelConfig, Transformer
from pipeline.probe import run_probe


def main() -> None:
    p = arguments(__doc__, preset="tiny", repeats=3, steps=10)
    p.add_argument("--data", required=True, help="prepared dataset (its probe set and vocabulary)")
    p.add_argument("--every", type=int, default=200, help="run.sink_every (the default 200; embedded: 500)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (embedded: 8 of C)")
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    manifest = load_manifest(args.data)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset(args.preset, vocab_size=manifest.vocab_size))
    probe = torch.from_numpy(load_probe(args.data)).long()
    run_probe(model, probe[:4])  # warm-up
    works = {
        "plain": lambda: run_probe(model, probe, flow=False),
        "training": lambda: run_probe(model, probe, mixing_sequences=TRAINING_MIXING_SEQUENCES),
        "every sequence": lambda: run_probe(model, probe, flow=True),
    }
    seconds, _ = interleaved(works, args.repeats)
    plain, training, every_sequence = (min(seconds[name]) for name in works)
    step = train_step(model, torch.randint(0, manifest.vocab_size, (args.batch, manifest.context_length + 1)), lr=1e-3)
    step()
    step_s = min(timeit.repeat(step, number=args.steps, repeat=args.repeats)) / args.steps
    extra, extra_all = training - plain, every_sequence - plain
    print(f"model {args.preset}, probe {tuple(probe.shape)}, steps of {args.batch} x {manifest.context_length} tokens")
    print("| measured | seconds |\n|---|---|")
    print(f"| sink probe without flow | {plain:.3f} |")
    print(
        f"| sink probe with flow, first {TRAINING_MIXING_SEQUENCES} sequences perturbed (training) | {training:.3f} |"
    )
    print(f"| sink probe with flow, every sequence perturbed | {every_sequence:.3f} |")
    print(f"| flow per probe, training / every sequence | {extra:.3f} / {extra_all:.3f} |")
    print(f"| optimizer step | {step_s:.4f} |")
    print(f"probe_ratio={training / plain:.3f} probe_ratio_all={every_sequence / plain:.3f}")
    print(f"flow_ratio={extra / extra_all:.3f} (training's flow seconds over every sequence perturbed)")
    print(f"overhead={extra / (args.every * step_s):.4f} (flow seconds per probe / ({args.every} steps))")
    print(f"overhead_all={extra_all / (args.every * step_s):.4f}")


if __name__ == "__main__":
    main()
