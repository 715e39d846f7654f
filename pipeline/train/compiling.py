"""`--model.compile true`: torch.compile each block in place, and train eager instead, saying so once, if
compiling fails; the backward is compiled at the forward call, so its failure is caught there too."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.utils._pytree import tree_leaves

BACKWARD_WITH_FORWARD = hasattr(torch._functorch.config, "force_non_lazy_backward_lowering")  # not in every torch


def _compile_backward_now(block: nn.Module, args: tuple, out) -> None:
    """The backward of ``out``'s graph on zero gradients, accumulating nothing, so that it compiles (or fails) here."""
    outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    inputs = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor) and t.requires_grad]
    inputs = inputs or [p for p in block.parameters() if p.requires_grad]
    if outputs and inputs:
        grads = [torch.zeros_like(t) for t in outputs]
        torch.autograd.grad(outputs, inputs, grads, retain_graph=True, allow_unused=True)


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
            with_forward = (
                torch._functorch.config.patch(force_non_lazy_backward_lowering=True) if BACKWARD_WITH_FORWARD else None
            )
            graphs, out = counters["stats"]["unique_graphs"], None
            try:
                with with_forward or contextlib.nullcontext():
                    out = _compiled(*args, **kwargs)
                if with_forward is None and torch.is_grad_enabled() and counters["stats"]["unique_graphs"] != graphs:
                    _compile_backward_now(_block, args, out)
                return out
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:
                lazy_backward = with_forward is None and out is not None  # raises the compiler's own error
                if not (isinstance(exc, torch._dynamo.exc.TorchDynamoException) or lazy_backward):
                    raise
                fall_back(exc)
                return _block._call_impl(*args, **kwargs)

        block._compiled_call_impl = call


def uncompiled():
    """Compiled blocks run eager inside this context (the sink probe, which would compile graphs of its own)."""
    return torch.compiler.set_stance("force_eager")


def failure_line(exc: BaseException) -> str:
    """The compiler's error in one line: its type and the first line that says something."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.strip().endswith("raised:")]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]
