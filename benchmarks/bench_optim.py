"""One optimizer step of Muon (+ AdamW) and OrthoAdam against AdamW, side by side, on CPU.

The last line is ``ratio muon=<x> orthoadam=<y>``, seconds per step over AdamW's (docs/training.md).
"""

from __future__ import annotations

import statistics
import time

import torch
from side_by_side import arguments, interleaved

from pipeline.model import ModelConfig, Transformer
from pipeline.train.optim import OPTIMIZERS, OptimConfig, build_optimizer, optimizer_split

NAMES = tuple(name for name in OPTIMIZERS if name != "sgd")  # the adaptive ones, side by side


def step_seconds(preset: str, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(preset=preset))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    steps = {}
    for name in NAMES:
        cfg = OptimConfig(name=name, lr=4e-4)
        for half, line in optimizer_split(model, cfg).items():
            print(f"{name:10s} {half.rsplit('.', 1)[1]:9s} {line}", flush=True)
        steps[name] = build_optimizer(model, cfg).step
        steps[name]()  # state, and OrthoAdam's rotations, before timing
    seconds, _ = interleaved(steps, repeats, time.process_time)
    return {name: statistics.median(s) for name, s in seconds.items()}


def main(argv: list[str] | None = None) -> None:
    args = arguments(__doc__, preset="llama-60m", repeats=3).parse_args(argv)
    print(f"preset {args.preset}, CPU, {torch.get_num_threads()} thread(s), median of {args.repeats}", flush=True)
    seconds = step_seconds(args.preset, args.repeats)
    for name, s in seconds.items():
        print(f"{name:10s} {s:8.3f} s per step  ({s / seconds['adamw']:.2f}x AdamW)")
    print(
        f"ratio muon={seconds['muon'] / seconds['adamw']:.2f} orthoadam={seconds['orthoadam'] / seconds['adamw']:.2f}"
    )


if __name__ == "__main__":
    main()
