"""pipeline/train/module.py: the prefix-LM loss, and the speed options (activation checkpointing,
compile) that leave the loss and gradients unchanged."""

from __future__ import annotations

import pytest
import torch

from pipeline.model import ModelConfig
from pipeline.train.module import SinkLabModule


def test_prefix_lm_loss_starts_after_p_tokens():
    from pipeline.model import Transformer

    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("micro", mask="prefix", prefix_len=3)
    module = SinkLabModule(cfg)
    module.model = Transformer(cfg)
    tokens = torch.randint(0, 64, (2, 10))
    logits = module.model(tokens).logits
    # L = sum_{t=p+1..C} log p(x_t | ...): targets x_4..x_10 (1-based) = tokens[:, 3:]
    expected = torch.nn.functional.cross_entropy(logits[:, 2:-1].reshape(-1, 64), tokens[:, 3:].reshape(-1))
    assert module.loss_start() == 2
    assert torch.allclose(module.lm_loss(tokens), expected)


@pytest.mark.parametrize("option", ["activation_checkpointing", "compile"])
def test_speed_options_leave_loss_and_gradients_unchanged(option, monkeypatch):
    from pipeline.train import module as module_mod

    recomputed = []
    real_checkpoint = module_mod.checkpoint
    monkeypatch.setattr(module_mod, "checkpoint", lambda *a, **kw: recomputed.append(1) or real_checkpoint(*a, **kw))

    def loss_and_grads(**flags):
        torch.manual_seed(0)
        module = SinkLabModule(ModelConfig.from_preset("micro", vocab_size=64), **flags)
        module.configure_model()
        tokens = torch.randint(0, 64, (2, 16))
        loss = module.lm_loss(tokens)
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in module.model.named_parameters()}, module

    loss, grads, _ = loss_and_grads()
    loss2, grads2, module = loss_and_grads(**{option: True})
    torch.testing.assert_close(loss2, loss, rtol=1e-5, atol=1e-6)
    assert grads2.keys() == grads.keys()  # in-place: checkpoints keep their parameter names
    for name in grads:
        torch.testing.assert_close(grads2[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)
    if option == "compile":
        assert all(block._compiled_call_impl is not None for block in module.model.blocks)
    else:
        assert len(recomputed) == len(module.model.blocks)
