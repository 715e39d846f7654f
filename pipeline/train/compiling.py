"""`--model.compile true`: torch.compile each block in place, and train eager instead, saying so
once, if compiling fails.

A missing C++ compiler on a CPU node, an Inductor or Triton error on some GPU, or an op that
Dynamo cannot trace should not cost a queued job: the same model trains uncompiled, only
slower. Dynamo compiles a block at its first call (and again for a new shape or mode, e.g. the
first validation); AOTAutograd would compile the backward only at the first backward, so it is
asked to compile both at the forward call, where a failure can still be caught and the call
repeated eagerly. Every block then runs eager (they share one compiled graph). Errors that are
not the compiler's (out of memory, a shape mismatch in the model) pass through unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
from torch import nn

COMPILE_FAILURES = (torch._dynamo.exc.TorchDynamoException,)


def _backward_compiled_with_forward():
    config = torch._functorch.config
    if hasattr(config, "force_non_lazy_backward_lowering"):  # not in every torch release
        return config.patch(force_non_lazy_backward_lowering=True)
    return contextlib.nullcontext()


def compile_blocks(blocks: Sequence[nn.Module], on_failure: Callable[[BaseException], None]) -> None:
    """``block.compile()`` for each block; the first compiler failure turns every block back to
    eager, calls ``on_failure(exc)`` once and repeats the failed call eagerly."""
    failed: list[BaseException] = []

    def fall_back(exc: BaseException) -> None:
        for block in blocks:
            block._compiled_call_impl = None  # what nn.Module.compile() set: __call__ is eager again
        if not failed:
            failed.append(exc)
            on_failure(exc)

    for block in blocks:
        block.compile()
        compiled = block._compiled_call_impl

        def call(*args, _compiled=compiled, _block=block, **kwargs):
            try:
                with _backward_compiled_with_forward():
                    return _compiled(*args, **kwargs)
            except COMPILE_FAILURES as exc:
                fall_back(exc)
                return _block._call_impl(*args, **kwargs)

        block._compiled_call_impl = call


def uncompiled():
    """Compiled blocks run their eager code inside this context (the sink probe: a few small
    forward passes that ask for attention weights, which would otherwise compile graphs of
    their own, once per probe shape)."""
    set_stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def failure_line(exc: BaseException) -> str:
    """The compiler's error in one line: its type and the first line that says something."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.strip().endswith("raised:")]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
