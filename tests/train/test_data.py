"""pipeline/train/data.py: the global order of sequences over epochs and budgets, and its split
over ranks and steps (a resume skips exactly what was done)."""

from __future__ import annotations

from pipeline.train.batching import plan_batch
from pipeline.train.data import GlobalOrder, RankBatchSampler


def test_epochs_are_permutations_and_budget_repeats_a_subset():
    order = GlobalOrder(50, seed=3)
    for e in range(3):
        assert sorted(order.lookup(e * 50 + i)[1] for i in range(50)) == list(range(50))
    budget = GlobalOrder(50, seed=3, budget_sequences=10)
    seen = [budget.lookup(g) for g in range(30)]
    pool = {i for _, i in seen}
    assert len(pool) == 10
    for e in range(3):
        assert sorted(i for ep, i in seen if ep == e) == sorted(pool)


def test_ranks_split_each_step_and_resume_skips_exactly():
    plan = plan_batch(8 * 16, 16, 2, 2)  # 8 seqs, world 2, micro 2 -> accum 2
    samplers = [RankBatchSampler(plan, r, total_steps=3) for r in range(2)]
    per_rank = [list(s) for s in samplers]
    assert len(per_rank[0]) == len(samplers[0]) == 6
    for step in range(3):
        got = sorted(i for r in range(2) for b in per_rank[r][2 * step : 2 * step + 2] for i in b)
        assert got == list(range(8 * step, 8 * step + 8))
    samplers[1].start_sample = 16  # two steps done
    assert list(samplers[1]) == per_rank[1][4:]
