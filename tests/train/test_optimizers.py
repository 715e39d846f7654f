"""Muon (with AdamW beside it) and OrthoAdam: the split, exactness against torch's AdamW, the
rotations, and a state that survives state_dict/load_state_dict bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch

from pipeline.model import ConfigError, ModelConfig, Transformer
from pipeline.train.optim import OptimConfig, build_optimizer, build_scheduler, optimizer_split
from pipeline.train.optimizers import MuonAdamW, OrthoAdam, _Rotation, fused_rows, muon_split

CFG = ModelConfig(vocab_size=48, d_model=32, n_layers=2, n_heads=4, d_ffn=64, max_seq_len=16)


def model(seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(CFG.replace(**changes) if changes else CFG)


def train(net: Transformer, opt: torch.optim.Optimizer, steps: int, seed: int = 1) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, CFG.vocab_size, (4, 16), generator=gen)
        logits = net(tokens).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_orthoadam_with_identity_rotations_is_adamw_bit_for_bit():
    a, b = model(), model()
    groups = lambda m: [  # noqa: E731 - a decaying and a non-decaying group, as param_groups makes
        {"params": [p for p in m.parameters() if p.ndim == 2], "weight_decay": 0.1},
        {"params": [p for p in m.parameters() if p.ndim < 2], "weight_decay": 0.0},
    ]
    kw = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8}
    ref = torch.optim.AdamW(groups(a), **kw, foreach=False)
    ortho = OrthoAdam(groups(b), **kw, identity=True, block=8)  # several blocks per dimension
    assert train(a, ref, 5) == train(b, ortho, 5)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_orthoadam_rotations_are_orthogonal_and_change_the_update():
    gen = torch.Generator().manual_seed(3)
    rot = _Rotation(torch.Size([10, 7]), 4, gen, torch.device("cpu"))
    assert [q.shape[0] for q in rot.left] == [4, 3, 3] and [q.shape[0] for q in rot.right] == [4, 3]
    x = torch.randn(10, 7)
    assert torch.allclose(rot.back(rot.forward(x)), x, atol=1e-5)
    assert torch.allclose(rot.forward(x).norm(), x.norm(), atol=1e-5)
    assert not torch.allclose(rot.forward(x), x, atol=1e-2)
    vector = _Rotation(torch.Size([5]), 1024, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert vector.left == [] and len(vector.right) == 1  # a vector is rotated along its length

    a, b = model(), model()
    kw = {"lr": 3e-3, "weight_decay": 0.0}
    plain = train(a, OrthoAdam(a.parameters(), **kw, identity=True), 3)
    rotated = train(b, OrthoAdam(b.parameters(), **kw, seed=0), 3)
    assert plain[0] == rotated[0] and plain[-1] != rotated[-1]


def test_orthoadam_state_round_trip_re_derives_the_rotations():
    a = model()
    opt = OrthoAdam(a.parameters(), lr=3e-3, seed=7)
    train(a, opt, 3)
    state, weights = copy.deepcopy(opt.state_dict()), {k: v.clone() for k, v in a.state_dict().items()}
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in state["state"].values())  # no matrices stored
    expected = train(a, opt, 3, seed=2)
    b = model(seed=5)
    b.load_state_dict(weights)
    fresh = OrthoAdam(b.parameters(), lr=3e-3, seed=7)
    fresh.load_state_dict(state)
    assert train(b, fresh, 3, seed=2) == expected
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_orthoadam_rotates_only_the_d_model_axis_of_the_embedding_and_head():
    net = model()
    opt = build_optimizer(net, OptimConfig(name="orthoadam", lr=3e-3, weight_decay=0.0))
    params = dict(net.named_parameters())
    for name in ("embed.weight", "lm_head.weight"):
        table, before = params[name], {n: p.detach().clone() for n, p in params.items()}
        opt.zero_grad()
        table.grad = torch.zeros_like(table)
        table.grad[5] = torch.randn(CFG.d_model)  # one token's row
        opt.step()
        assert {n for n, p in params.items() if not torch.equal(p, before[n])} == {name}
        assert (table.detach() != before[name]).any(dim=1).nonzero().flatten().tolist() == [5]
        rotation = opt._rotations[table]
        assert rotation.left == [] and len(rotation.right) == 1  # the vocabulary axis is the identity
        right = rotation.right[0]
        assert torch.allclose(right @ right.T, torch.eye(CFG.d_model), atol=1e-5)
        assert not torch.allclose(right, torch.eye(CFG.d_model), atol=1e-2)


def test_muon_orthogonalises_each_fused_matrix_as_muon_on_the_separate_matrices():
    net = model(ffn="swiglu")
    rows = fused_rows(net)
    attn, ffn = net.blocks[0].attn.qkv.weight, net.blocks[0].ffn.gate_up.weight
    assert rows[attn] == (CFG.d_model,) * 3 and rows[ffn] == (CFG.d_ffn,) * 2
    cfg = OptimConfig(name="muon", lr=1e-2, weight_decay=0.1)
    opt = build_optimizer(net, cfg)
    separate = {w: [torch.nn.Parameter(part.detach().clone()) for part in w.split(rows[w])] for w in (attn, ffn)}
    ref = torch.optim.Muon(
        [p for parts in separate.values() for p in parts],
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        momentum=cfg.muon_momentum,
        adjust_lr_fn="match_rms_adamw",
    )
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p in net.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        for w, parts in separate.items():
            for part, grad in zip(parts, w.grad.split(rows[w])):
                part.grad = grad.clone()
        opt.step()
        ref.step()
    for w, parts in separate.items():
        assert torch.equal(w.detach(), torch.cat([p.detach() for p in parts]))
    assert all(
        set(opt.state[w]) == {"momentum_buffer"} and opt.state[w]["momentum_buffer"].shape == w.shape for w in separate
    )


def test_muon_split_puts_block_matrices_on_muon_and_the_rest_on_adamw():
    net = model(sink_tokens=1, positional="learned")
    hidden, rest = muon_split(net)
    assert hidden and all(n.startswith("blocks.") and n.endswith(".weight") for n in hidden)
    assert all(dict(net.named_parameters())[n].ndim == 2 for n in hidden)
    assert "embed.weight" in rest and "lm_head.weight" in rest and "sink_tokens" in rest
    assert not any("norm" in n for n in hidden)
    cfg = OptimConfig(name="muon", lr=1e-3, muon_lr=2e-2)
    opt = build_optimizer(net, cfg)
    assert isinstance(opt, MuonAdamW)
    muon_ids = {id(p) for g in opt.param_groups if g["muon"] for p in g["params"]}
    assert muon_ids == {id(dict(net.named_parameters())[n]) for n in hidden}
    assert [g["lr"] for g in opt.param_groups] == [2e-2, 1e-3]
    split = optimizer_split(net, cfg)
    assert split["optim.split.muon"].startswith(f"{len(hidden)} tensors") and "lr 0.02" in split["optim.split.muon"]
    assert split["optim.split.adamw"].startswith(f"{len(rest)} tensors")


def test_muon_trains_follows_the_schedule_and_round_trips():
    net = model()
    cfg = OptimConfig(name="muon", lr=3e-3, min_lr=3e-4, warmup_steps=2)
    opt = build_optimizer(net, cfg)
    sched = build_scheduler(opt, cfg, 10)
    losses = []
    for _ in range(4):
        losses += train(net, opt, 1, seed=0)  # one batch again: its loss must fall
        sched.step()
    assert losses[-1] < losses[0]
    assert {g["lr"] for g in opt.param_groups} == {sched.get_last_lr()[0]}  # both halves scheduled
    muon_state = [opt.state[p] for g in opt.param_groups if g["muon"] for p in g["params"]]
    assert all(set(s) == {"momentum_buffer"} for s in muon_state)
    state, weights = copy.deepcopy(opt.state_dict()), {k: v.clone() for k, v in net.state_dict().items()}
    expected = train(net, opt, 2, seed=9)
    other = model(seed=4)
    other.load_state_dict(weights)
    fresh = build_optimizer(other, cfg)
    fresh.load_state_dict(state)
    assert train(other, fresh, 2, seed=9) == expected


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("name", "lion", "allowed values are adamw, sgd, muon, orthoadam"),
        ("muon_lr", 0.0, "muon_lr=0.0"),
        # above ~9.2e12 it crashed at the first optimizer step, after the run had started
        ("rotation_seed", 10**13, r"rotation_seed=10000000000000: must be in 0\.\.4294967295"),
        ("rotation_seed", -1, r"rotation_seed=-1: must be in 0\.\.4294967295"),
    ],
)
def test_bad_optimizer_fields_are_named(field, value, message):
    with pytest.raises(ConfigError, match=message):
        OptimConfig(**{field: value}).validate(1000)
