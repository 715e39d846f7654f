"""What the bench scripts share: their plain options, works timed in turn, and the training step they time."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def arguments(doc: str, **defaults) -> argparse.ArgumentParser:
    """Described by ``doc``'s first paragraph; ``--name`` for each default (of its type)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, default in defaults.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    return p


def interleaved(works: dict, repeats: int, clock=time.perf_counter, sync=lambda: None) -> tuple[dict, dict]:
    """Each work's seconds in every repeat and its last result; the works take turns, in alternating order,
    so that drift on a busy machine weighs on all alike."""
    seconds, results = {name: [] for name in works}, {}
    for r in range(repeats):
        for name in list(works) if r % 2 == 0 else list(works)[::-1]:
            sync()
            start = clock()
            results[name] = works[name]()
            sync()
            seconds[name].append(clock() - start)
    return seconds, results


def logits_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Full logits, then F.cross_entropy in fp32 (HF's ForCausalLMLoss)."""
    logits = model(tokens).logits[:, :-1]
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def train_step(model: torch.nn.Module, tokens: torch.Tensor, loss_fn: Callable = logits_loss, **adamw) -> Callable:
    """One optimizer step of AdamW (``adamw``: its settings) on ``loss_fn(model, tokens)``."""
    optimizer = torch.optim.AdamW(model.parameters(), **adamw)

    def step() -> None:
        loss_fn(model, tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
