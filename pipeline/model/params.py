"""Print each preset's parameter count: ``python -m pipeline.model.params [--vocab 32000]``."""

from __future__ import annotations

import argparse

import torch

from .config import PRESETS, ModelConfig
from .transformer import Transformer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args(argv)
    print(
        f"{'preset':10s} {'d':>5s} {'L':>3s} {'H':>3s} {'KV':>3s} {'ffn':>5s} {'non-embedding':>14s} {'total (V=' + str(args.vocab) + ')':>16s}"
    )
    for name in PRESETS:
        with torch.device("meta"):  # no memory, no initialisation
            model = Transformer(ModelConfig.from_preset(name, vocab_size=args.vocab))
        c, body, total = model.config, model.num_parameters(embeddings=False), model.num_parameters()
        print(
            f"{name:10s} {c.d_model:5d} {c.n_layers:3d} {c.n_heads:3d} {c.kv_heads:3d} {c.d_ffn:5d} {body / 1e6:13.2f}M {total / 1e6:15.2f}M"
        )


if __name__ == "__main__":
    main()
