"""The key slots (sink logit, K and KV biases) on the fused SDPA path: exact against the eager
path that concatenates the slot columns to a dense mask, differentiable, and without any
[T, T] tensor in forward or backward."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from pipeline.model import ModelConfig, StreamingCache, Transformer

SLOTS = {
    "sink_logit": {"attention": {"sink_logit": True}},
    "off_by_one": {"attention": {"op": "softmax_off_by_one"}},
    "k_zero_value": {"biases": {"kind": "k"}},
    "k_fixed_value": {"biases": {"kind": "k", "value_norm": 3.0}},
    "kv": {"biases": {"kind": "kv"}},
    "kv_key_dims": {"biases": {"kind": "kv", "key_dims": 4}},
    "k_shared_key_dims": {"biases": {"kind": "k", "value_norm": 2.0, "shared_heads": True, "key_dims": 3}},
    "kv_shared_and_sink_logit": {"biases": {"kind": "kv", "shared_heads": True}, "attention": {"sink_logit": True}},
    "ssmax_kv_sink_logit": {"biases": {"kind": "kv"}, "attention": {"op": "ssmax", "sink_logit": True}},
}
MASKS = {
    "causal": {},
    "sliding_alibi": {"mask": "sliding", "window": 5, "positional": "alibi"},
    "sinks": {"sink_tokens": 2},
}
CASES = [(s, m) for s in SLOTS for m in MASKS if not (s.startswith("ssmax") and "alibi" in m)]  # SSMax takes no bias


def _model(overrides: dict, **extra) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", init_std=0.2, **overrides, **extra))
    with torch.no_grad():  # slots that take a real share of attention
        for name, p in model.named_parameters():
            if name.endswith("sink_logit") or "kv_slot" in name:
                p.copy_(2.0 * torch.randn_like(p) + 1.0)
    return model


@pytest.mark.parametrize("slot, mask", CASES)
def test_fast_path_logits_equal_the_eager_path_in_float64(slot, mask):
    model = _model(SLOTS[slot], **MASKS[mask]).double().eval()
    idx = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = model(idx, output_attentions=True)
        fast = model(idx).logits
        cache = StreamingCache(model.config, n_initial=0, n_recent=64)
        chunks = [model(idx[:, a:b], cache=cache).logits for a, b in ((0, 6), (6, 7), (7, 13))]
    assert eager.attentions[0][..., : model.config.n_bias_slots].sum(-1).mean() > 0.05  # the slots matter
    torch.testing.assert_close(fast, eager.logits, atol=1e-9, rtol=0)
    torch.testing.assert_close(torch.cat(chunks, 1), eager.logits, atol=1e-9, rtol=0)


def test_fast_path_equals_eager_with_an_evicting_cache():
    model = _model(SLOTS["kv_shared_and_sink_logit"], sink_tokens=1).double().eval()
    idx = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    logits = {}
    with torch.no_grad():
        for weights in (False, True):
            cache = StreamingCache(model.config, n_initial=2, n_recent=4)
            steps = [model(idx[:, t : t + 1], cache=cache, output_attentions=weights).logits for t in range(12)]
            logits[weights] = torch.cat(steps, 1)
    torch.testing.assert_close(logits[False], logits[True], atol=1e-9, rtol=0)


@pytest.mark.parametrize("slot", ["sink_logit", "k_fixed_value", "kv_shared_and_sink_logit", "kv_key_dims"])
def test_fast_path_passes_gradcheck_and_its_gradients_equal_the_eager_paths(slot):
    """Gradients reach q, k, v (through W_QKV), s_h, k* and v*."""
    model = _model(SLOTS[slot], d_model=8, n_layers=1, d_ffn=8).double()
    idx = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(3))
    names = [n for n, _ in model.named_parameters() if n.endswith(("sink_logit", "kv_slot.key", "kv_slot.value"))]
    names.append("blocks.0.attn.qkv.weight")
    params = tuple(dict(model.named_parameters())[n].detach().clone().requires_grad_() for n in names)

    def logits(*ps, weights=False):
        return torch.func.functional_call(model, dict(zip(names, ps)), (idx,), {"output_attentions": weights}).logits

    assert torch.autograd.gradcheck(logits, params, eps=1e-6, atol=1e-6)
    probe = torch.randn(2, 6, 64, dtype=torch.float64)
    fast = torch.autograd.grad((logits(*params) * probe).sum(), params)
    eager = torch.autograd.grad((logits(*params, weights=True) * probe).sum(), params)
    for name, a, b in zip(names, fast, eager):
        assert a.abs().max() > 0, name
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-9)


@pytest.mark.parametrize("slot", ["kv_shared_and_sink_logit"])
def test_two_hundred_training_steps_match_the_eager_path_in_float32(slot):
    data = torch.randint(0, 64, (200, 4, 17), generator=torch.Generator().manual_seed(4))
    losses = {}
    for weights in (False, True):
        model = _model(SLOTS[slot])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[weights] = []
        for batch in data:
            logits = model(batch[:, :-1], output_attentions=weights).logits
            loss = F.cross_entropy(logits.reshape(-1, 64), batch[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[weights].append(loss.item())
    assert losses[False][-1] < losses[False][0] - 0.1  # it learned something
    torch.testing.assert_close(torch.tensor(losses[False]), torch.tensor(losses[True]), atol=1e-5, rtol=0)


class LargestTensor(TorchDispatchMode):
    """The most bytes of any one storage an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.nbytes = max(self.nbytes, t.untyped_storage().nbytes())
        return out


def test_slots_allocate_no_tensor_larger_than_plain_softmax_and_none_is_t_by_t():
    T, largest = 4096, {}
    for name, overrides in (("softmax", {}), ("sink_logit", SLOTS["sink_logit"]), ("kv", SLOTS["kv"])):
        cfg = ModelConfig.from_preset("micro", n_layers=1, d_model=64, n_heads=4, d_ffn=128, max_seq_len=T, **overrides)
        model = Transformer(cfg)
        idx = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(5))
        with LargestTensor() as probe:
            model(idx).logits.square().mean().backward()
        largest[name] = probe.nbytes
    assert largest["softmax"] < T * T  # not even a boolean [T, T] matrix
    assert largest["sink_logit"] <= largest["softmax"] and largest["kv"] <= largest["softmax"], largest


def test_slot_parameter_names_are_unchanged():
    """Checkpoints written before the O(T) path load by these names."""
    model = _model(SLOTS["kv_shared_and_sink_logit"])
    slot_names = {n for n in model.state_dict() if ".attn." in n and "slot" in n or n.endswith("sink_logit")}
    assert slot_names == {
        f"blocks.{i}.attn.{n}" for i in (0, 1) for n in ("kv_slot.key", "kv_slot.value", "sink_logit")
    }
