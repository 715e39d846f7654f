"""pipeline/train/batching.py: a batch of tokens as sequences per step, micro-batches and gradient
accumulation, checked against hand-computed values; an impossible batch says what works."""

from __future__ import annotations

import re

import pytest

from pipeline.train.batching import BatchConfigError, plan_batch


def test_paper_batch_is_512_sequences():
    plan = plan_batch(2**20, 2048, 16, 8)
    assert (plan.global_batch_seqs, plan.grad_accum) == (512, 4)


@pytest.mark.parametrize(
    "args, fragment",
    [
        ((1000, 16, 4, 1), "use 960 or 1024"),
        ((128, 16, 4, 3), "3 processes cannot share evenly"),
        ((128, 16, 3, 1), "micro batch sizes that work: [1, 2, 4]"),
    ],
)
def test_impossible_batches_say_what_works(args, fragment):
    with pytest.raises(BatchConfigError) as err:
        plan_batch(*args)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "args", [(100, 16, 4, 1), (0, 16, 4, 1), (96, 16, 4, 1), (40, 16, 4, 1), (144, 16, 2, 2), (160, 16, 4, 3)]
)
def test_every_suggested_batch_is_accepted(args):
    """Every batch a refusal suggests ("use 96 or 112" for 100 tokens at C=16, micro 4) is accepted."""
    tokens, context, micro, world = args
    with pytest.raises(BatchConfigError) as err:
        plan_batch(*args)
    message = str(err.value)
    batches = re.findall(r"(?:use|change the batch to|multiple of) (\d+)(?: or (\d+))?", message)
    worlds = re.search(r"world sizes that divide it: \[([\d, ]*)\]", message)
    micros = re.search(r"micro batch sizes that work: \[([\d, ]*)\]", message)
    assert batches or worlds or micros, message
    for value in [int(v) for pair in batches for v in pair if v]:
        plan_batch(value, context, micro, world)
    for w in [int(v) for v in worlds.group(1).split(",") if v.strip()] if worlds else []:
        plan_batch(tokens, context, micro, w)
    for m in [int(v) for v in micros.group(1).split(",") if v.strip()] if micros else []:
        plan_batch(tokens, context, m, world)
