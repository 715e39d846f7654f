"""What the information-flow metrics add to training, measured side by side in one process.

The last lines, ``overhead=<flow seconds per probe / (sink_every x step seconds)>`` and ``overhead_all=``,
are upper bounds (docs/analysis.md).
"""

from __future__ import annotations

import argparse
import timeit

import torch
import torch.nn.functional as F

from data_prep.dataset import load_manifest, load_probe
from pipeline.flow import TRAINING_MIXING_SEQUENCES
from pipeline.model import ModelConfig, Transformer
from pipeline.probe import run_probe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="prepared dataset (its probe set and vocabulary)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--every", type=int, default=200, help="run.sink_every (the default 200; embedded: 500)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (embedded: 8 of C)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    manifest = load_manifest(args.data)
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset(args.preset, vocab_size=manifest.vocab_size)
    model = Transformer(cfg)
    probe = torch.from_numpy(load_probe(args.data)).long()
    run_probe(model, probe[:4])  # warm-up
    plain = training = every_sequence = float("inf")
    for _ in range(args.repeats):  # alternated, so that a busy machine weighs on all alike
        plain = min(plain, timeit.timeit(lambda: run_probe(model, probe, flow=False), number=1))
        training = min(
            training,
            timeit.timeit(lambda: run_probe(model, probe, mixing_sequences=TRAINING_MIXING_SEQUENCES), number=1),
        )
        every_sequence = min(every_sequence, timeit.timeit(lambda: run_probe(model, probe, flow=True), number=1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, manifest.vocab_size, (args.batch, manifest.context_length + 1))

    def step() -> None:
        logits = model(tokens[:, :-1]).logits
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

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
