"""pipeline/train/compiling.py on a torch without ``force_non_lazy_backward_lowering`` (older
releases; here: the switch left unused, so AOTAutograd compiles each backward lazily, as they
do): a backward graph that fails to compile still falls back to eager, at the forward call."""

from __future__ import annotations

import pytest
import torch

from pipeline.model import ModelConfig, Transformer
from pipeline.train import compiling
from pipeline.train.compiling import compile_blocks


@pytest.fixture
def backward_compiler_fails(monkeypatch):
    """Inductor raises on every backward graph, as a node without a working compiler would; the
    compile caches are off (they would skip the compiler)."""
    import torch._inductor.compile_fx as compile_fx

    real = compile_fx._compile_fx_inner

    def no_backward(*args, **kwargs):
        if kwargs.get("is_backward"):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_fx, "_compile_fx_inner", no_backward)
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("lazy_backward_only", [True, False])
def test_a_failing_backward_compile_trains_eager(backward_compiler_fails, monkeypatch, lazy_backward_only):
    if lazy_backward_only:
        monkeypatch.setattr(compiling, "BACKWARD_WITH_FORWARD", False)  # as where the switch is missing
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", vocab_size=64))
    eager = Transformer(ModelConfig.from_preset("micro", vocab_size=64))
    eager.load_state_dict(model.state_dict())
    failures = []
    compile_blocks(model.blocks, on_failure=failures.append)
    idx = torch.randint(0, 64, (2, 16))
    for _ in range(2):
        model(idx).logits.sum().backward()
    eager(idx).logits.sum().backward()
    eager(idx).logits.sum().backward()
    assert len(failures) == 1 and "No working C++ compiler found" in str(failures[0])
    assert all(block._compiled_call_impl is None for block in model.blocks)  # eager from now on
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)  # the probe accumulated nothing


def test_without_the_switch_a_working_compile_keeps_its_graphs(monkeypatch):
    """The backward compiled at the forward call is the one the real backward runs."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(compiling, "BACKWARD_WITH_FORWARD", False)  # as where the switch is missing
    torch._dynamo.reset()
    model = Transformer(ModelConfig.from_preset("micro", vocab_size=64))
    compile_blocks(model.blocks, on_failure=lambda exc: pytest.fail(f"compile failed: {exc}"))
    idx = torch.randint(0, 64, (2, 16))
    model(idx).logits.sum().backward()
    graphs = counters["stats"]["unique_graphs"]
    model(idx).logits.sum().backward()
    assert graphs > 0 and counters["stats"]["unique_graphs"] == graphs
    assert all(block._compiled_call_impl is not None for block in model.blocks)
    torch._dynamo.reset()
