"""Batch arithmetic: the recipe states the global batch in tokens; everything else follows.

global_batch_tokens = context_length x micro_batch_size x grad_accum x world_size
"""

from __future__ import annotations

from dataclasses import dataclass


class BatchConfigError(ValueError):
    """The batch settings do not multiply out."""


@dataclass(frozen=True)
class BatchPlan:
    context_length: int
    global_batch_tokens: int
    micro_batch_size: int
    world_size: int
    grad_accum: int

    @property
    def global_batch_seqs(self) -> int:
        return self.global_batch_tokens // self.context_length

    def describe(self) -> str:
        return (
            f"{self.global_batch_tokens} tokens/step = {self.global_batch_seqs} seqs x {self.context_length}"
            f" = micro {self.micro_batch_size} x accum {self.grad_accum} x world {self.world_size}"
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _batches_near(tokens: int, quantum: int) -> str:
    """The multiples of ``quantum`` (one step of C x micro x world tokens) around ``tokens``."""
    lo = tokens // quantum * quantum
    return f"{lo} or {lo + quantum}" if lo else f"{quantum}"


def plan_batch(global_batch_tokens: int, context_length: int, micro_batch_size: int, world_size: int) -> BatchPlan:
    """Every value an error suggests is one this function then accepts."""
    if micro_batch_size <= 0 or world_size <= 0:
        raise BatchConfigError(
            f"data.micro_batch_size={micro_batch_size}, world size {world_size}: both must be positive"
        )
    quantum = context_length * micro_batch_size * world_size
    if global_batch_tokens <= 0:
        raise BatchConfigError(
            f"data.global_batch_tokens={global_batch_tokens}: must be positive; use a multiple of "
            f"{quantum} (C {context_length} x micro {micro_batch_size} x world {world_size})"
        )
    if global_batch_tokens % context_length:
        raise BatchConfigError(
            f"data.global_batch_tokens={global_batch_tokens} is not a multiple of the dataset's context "
            f"length {context_length}; use {_batches_near(global_batch_tokens, quantum)}"
        )
    seqs = global_batch_tokens // context_length
    if seqs % world_size:
        ok = [w for w in _divisors(seqs) if w <= 4 * world_size and (seqs // w) % micro_batch_size == 0][-4:]
        raise BatchConfigError(
            f"data.global_batch_tokens={global_batch_tokens} is {seqs} sequences, which {world_size} "
            f"processes cannot share evenly; world sizes that divide it: {ok}, or change the batch to "
            f"{_batches_near(global_batch_tokens, quantum)} tokens"
        )
    per_rank = seqs // world_size
    if per_rank % micro_batch_size:
        ok = [m for m in _divisors(per_rank) if m <= max(micro_batch_size * 2, 1)][-5:]
        raise BatchConfigError(
            f"data.micro_batch_size={micro_batch_size} does not divide the {per_rank} sequences each of the "
            f"{world_size} processes gets per step ({global_batch_tokens} tokens / {context_length} / "
            f"{world_size}); micro batch sizes that work: {ok}"
        )
    return BatchPlan(context_length, global_batch_tokens, micro_batch_size, world_size, per_rank // micro_batch_size)
