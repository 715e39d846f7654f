"""benchmarks/side_by_side.py: works timed in turn in alternating order, the plain options, the AdamW step."""

import torch

from pipeline.model import ModelConfig, Transformer


def test_works_take_turns_in_alternating_order_and_keep_their_last_result(load_benchmark):
    side_by_side = load_benchmark("side_by_side")
    calls, ticks = [], iter(range(100))
    works = {name: lambda name=name: calls.append(name) or len(calls) for name in ("a", "b")}
    seconds, results = side_by_side.interleaved(works, 3, clock=lambda: next(ticks))
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert results == {"a": 5, "b": 6} and seconds == {"a": [1, 1, 1], "b": [1, 1, 1]}


def test_plain_options_take_the_type_of_their_default(load_benchmark):
    parser = load_benchmark("side_by_side").arguments("Title.\n\nMore.", seq_len=256, preset="tiny")
    args = parser.parse_args(["--seq-len", "64"])
    assert parser.description == "Title." and args.seq_len == 64 and args.preset == "tiny"


def test_a_train_step_updates_the_model_and_clears_its_gradients(load_benchmark):
    side_by_side = load_benchmark("side_by_side")
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", vocab_size=64, max_seq_len=16))
    before = [p.detach().clone() for p in model.parameters()]
    side_by_side.train_step(model, torch.randint(0, 64, (2, 9)), lr=1e-2)()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
