"""Statistics over seeds, pinned on hand-made values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from pipeline import metrics as M
from pipeline.experiments import stats


def test_spread_of_known_values():
    # mean 3, sample variance ((−1)² + 0 + 1²) / 2 = 1, t(0.975, 2) = 4.302652729749464
    s = stats.spread([2.0, 3.0, 4.0])
    assert (s.n, s.mean, s.std) == (3, 3.0, 1.0)
    half = 4.302652729749464 / math.sqrt(3)
    assert s.lo == pytest.approx(3.0 - half, abs=1e-12) and s.hi == pytest.approx(3.0 + half, abs=1e-12)
    # two values: t(0.975, 1) = 12.706204736174698; mean 1, std sqrt(2), half = t * sqrt(2) / sqrt(2)
    two = stats.spread([0.0, 2.0, None, float("nan")])  # None and NaN are not values
    assert (two.n, two.mean, two.std) == (2, 1.0, pytest.approx(math.sqrt(2)))
    assert two.hi - two.mean == pytest.approx(12.706204736174698)


def test_spread_of_one_or_no_value_has_no_interval():
    assert stats.spread([5.0]) == stats.Spread((5.0,), 5.0, None, None, None)
    assert stats.spread([]).n == 0 and stats.spread([None]).mean is None
    same = stats.spread([0.25, 0.25, 0.25])
    assert (same.std, same.lo, same.hi) == (0.0, 0.25, 0.25)


def test_the_bootstrap_is_exactly_degenerate_when_all_seeds_agree():
    groups = [[1.0, 1.0, 1.0], [3.0, 3.0], [2.0, 2.0, 2.0]]
    paper = [10.0, 20.0, 30.0]
    rho = M.spearman_rho([1.0, 3.0, 2.0], paper)
    interval = stats.bootstrap(groups, lambda means: M.spearman_rho(means, paper))
    assert rho == pytest.approx(0.5)
    assert (interval.lo, interval.hi, interval.defined) == (rho, rho, stats.RESAMPLES)


def test_the_bootstrap_spreads_with_the_seeds_and_repeats_itself():
    groups = [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0], [2.0, 4.0, 6.0]]  # overlapping variants
    paper = [1.0, 2.0, 3.0]

    def statistic(means):
        return M.spearman_rho(means, paper)

    first, again = stats.bootstrap(groups, statistic), stats.bootstrap(groups, statistic)
    assert first == again  # fixed RNG seed
    assert first.lo < 0 < first.hi and first.hi == 1.0
    far = stats.bootstrap([[0.0, 0.1, 0.2], [10.0, 10.1, 10.2], [20.0, 20.1, 20.2]], statistic)
    assert (far.lo, far.hi) == (1.0, 1.0)  # separated by ~170 standard errors: every resample agrees
    flat = stats.bootstrap([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], statistic)  # rho undefined in every resample
    assert (flat.lo, flat.hi, flat.defined) == (None, None, 0)
    with pytest.raises(ValueError, match=r"2 values or more in every group, got sizes \[3, 1\]"):
        stats.bootstrap([[1.0, 2.0, 3.0], [1.0]], statistic)


@pytest.mark.parametrize("n", [3, 10])
def test_the_bootstrap_interval_of_a_mean_covers_it_95_percent_of_the_time(n):
    """Coverage of what every resample draws, one variant's mean, on normal seeds: the interval
    from the resampled means must hold the population mean in 95% of simulated studies at the
    seed counts used. Resampling the seeds with replacement covered about 75% at n = 3."""
    rng = np.random.default_rng(20261127)
    cases, mu = 2000, 5.0
    covered = 0
    for case in range(cases):
        seeds = rng.normal(mu, 2.0, n)
        interval = stats.bootstrap([seeds], lambda means: means[0], resamples=1000, seed=case)
        covered += interval.lo <= mu <= interval.hi
    assert 0.92 <= covered / cases <= 0.98


def test_a_bounded_metric_s_interval_stays_in_its_range():
    share = stats.spread([98.0, 100.0, 78.0], bounds=(0.0, 100.0))
    assert share.hi == 100.0 and share.lo == pytest.approx(92.0 - 4.302652729749464 * share.std / math.sqrt(3))
    assert stats.spread([0.0, 0.0, 0.3], bounds=(0.0, 100.0)).lo == 0.0
    drawn = stats.bootstrap([[0.0, 0.0, 0.3]], lambda means: means[0], bounds=(0.0, 100.0))
    assert drawn.lo == 0.0 and drawn.hi > 0.0  # resampled means are clipped too


def test_the_permutation_p_of_a_perfect_ordering_of_six_is_one_in_720():
    p = stats.permutation([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    assert (p.p, p.permutations, p.exact) == (1 / 720, 720, True) and p.p_reversed == 1.0
    reversed_ = stats.permutation([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], [10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    assert (reversed_.p, reversed_.p_reversed) == (1.0, 1 / 720)
    # one swap of four: rho 0.8; rho >= 0.8 for the identity and the 3 adjacent swaps of 24
    assert stats.permutation([1.0, 3.0, 2.0, 4.0], [10.0, 20.0, 30.0, 40.0]).p == 4 / 24
    # ties: rho of (0, 0, 0, 5) against 1..4 is reached by every permutation that puts 5 last
    assert stats.permutation([0.0, 0.0, 0.0, 5.0], [1.0, 2.0, 3.0, 4.0]).p == 6 / 24
    assert stats.permutation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None  # no spread: rho undefined


def test_beyond_ten_variants_the_permutation_p_is_monte_carlo_and_repeats_itself():
    ours, paper = [float(i) for i in range(12)], [float(i) for i in range(12)]
    p = stats.permutation(ours, paper, draws=5000)
    assert (p.p, p.permutations, p.exact) == (1 / 5001, 5000, False)  # (1 + hits) / (1 + draws)
    swapped = [1.0, 0.0, 3.0, 2.0, 4.0, 6.0, 5.0, 7.0, 9.0, 8.0, 10.0]
    first = stats.permutation(swapped, paper[:11], draws=5000)
    assert first == stats.permutation(swapped, paper[:11], draws=5000) and first.p < 0.001


def test_means_equal_at_the_printed_precision_count_once():
    assert stats.distinct([0.0, 0.0, -0.0, 0.001, 5.0], 2) == 2  # a floor of Sink_1 = 0 counts once
    assert stats.distinct([0.0, 0.001, 5.0], 3) == 3
    assert stats.distinct([4.3672, 4.3674, 4.52], 2) == 2


def test_the_verdict_needs_all_four_conditions_and_names_the_one_that_failed():
    def verdict(rho=0.9, tau=0.8, lo=0.4, hi=1.0, p=0.001, p_reversed=1.0, distinct=6, seeds=3, adjusted=None):
        permutation = stats.Permutation(p, p_reversed, 720, True)
        return stats.verdict(rho, tau, stats.Interval(lo, hi, 2000, 2000), permutation, distinct, seeds, adjusted)

    assert verdict() == "ordering reproduced"
    assert verdict(rho=-0.9, tau=-0.8, lo=-1.0, hi=-0.4, p=1.0, p_reversed=0.001) == "ordering reversed"
    assert verdict(lo=-0.1) == "no verdict: the interval [-0.10, +1.00] includes 0"
    assert verdict(p=0.12) == "no verdict: p = 0.12: not below 0.025"
    assert verdict(tau=-0.07) == "no verdict: rho and tau disagree in sign (tau -0.07)"
    assert verdict(distinct=2) == "no verdict: too few distinct values: 2"
    # a reversal is judged on the other tail: a small p in the paper's direction does not make one
    assert verdict(rho=-0.9, tau=-0.8, lo=-1.0, hi=-0.4, p=0.001, p_reversed=0.2) == (
        "no verdict: p = 0.2 for a reversal: not below 0.025"
    )
    assert verdict(distinct=2, p=0.5) == "no verdict: too few distinct values: 2; p = 0.5: not below 0.025"
    assert verdict(seeds=1).startswith("no verdict (one seed")
    assert stats.verdict(None, None, None, None, 0, 3) == "undefined"


def test_a_directional_verdict_needs_its_own_tail_below_half_the_level_after_holm():
    def verdict(tail, adjusted=None, up=True):
        sign = 1 if up else -1
        p = stats.Permutation(tail, 1.0, 720, True) if up else stats.Permutation(1.0, tail, 720, True)
        interval = stats.Interval(0.4, 1.0, 2000, 2000) if up else stats.Interval(-1.0, -0.4, 2000, 2000)
        return stats.verdict(0.9 * sign, 0.8 * sign, interval, p, 6, 3, adjusted)

    # one-sided 0.04 passed the old one-sided 0.05 in either direction: about 10% of orderings under chance
    assert verdict(0.04, up=False) == "no verdict: p = 0.04 for a reversal: not below 0.025"
    assert verdict(0.04) == "no verdict: p = 0.04: not below 0.025"
    assert verdict(0.024) == "ordering reproduced" and verdict(0.024, up=False) == "ordering reversed"
    assert verdict(0.01, adjusted=0.03) == "no verdict: p = 0.01, Holm 0.03: not below 0.025"
    assert verdict(0.01, adjusted=0.02) == "ordering reproduced"


def test_holm_matches_its_step_down_definition():
    # sorted 0.01, 0.02, 0.04, 0.5 scaled by 4, 3, 2, 1: 0.04, 0.06, 0.08, 0.5, each at least the one before
    assert stats.holm([0.04, 0.5, 0.01, 0.02]) == pytest.approx([0.08, 0.5, 0.04, 0.06])
    assert stats.holm([0.03, 0.02]) == pytest.approx([0.04, 0.04])  # monotone: 2·0.02, then max(0.04, 0.03)
    assert stats.holm([0.6, 0.7]) == [1.0, 1.0] and stats.holm([0.2]) == [0.2] and stats.holm([]) == []
    assert stats.directional(-0.5, stats.Permutation(0.9, 0.2, 24, True)) == 0.2
    assert stats.directional(0.5, stats.Permutation(0.1, 0.95, 24, True)) == 0.1
    assert stats.directional(None, None) is None


def ranked(x, y, axis=-1):
    """Spearman rho of each row of x against y, as Pearson's r of their ranks (scipy's ranks)."""
    rx, ry = scipy_stats.rankdata(x, axis=axis), scipy_stats.rankdata(y)
    rx = rx - rx.mean(axis=axis, keepdims=True)
    ry = ry - ry.mean()
    return (rx * ry).sum(axis=axis) / np.sqrt((rx**2).sum(axis=axis) * (ry**2).sum())


@pytest.mark.parametrize("k", [4, 5, 6, 7])
def test_the_exact_permutation_p_is_scipys(k):
    rng = np.random.default_rng(k)
    for case in range(6):
        means = rng.normal(size=k).round(1 if case % 2 else 3)  # the coarse half holds ties
        paper = rng.integers(0, 4 if case % 3 == 0 else 100, size=k).astype(float)
        mine = stats.permutation(means.tolist(), paper.tolist())
        if mine is None:
            continue
        for alternative, tail in (("greater", mine.p), ("less", mine.p_reversed)):
            reference = scipy_stats.permutation_test(
                (means,),
                lambda x, axis, paper=paper: ranked(x, paper, axis),
                permutation_type="pairings",
                vectorized=True,
                n_resamples=np.inf,
                alternative=alternative,
            )
            assert tail == pytest.approx(reference.pvalue, abs=1e-12), (k, case, alternative)


def test_the_drawn_permutation_p_agrees_with_scipy_s_within_monte_carlo_error():
    rng = np.random.default_rng(12)
    draws = 20_000
    for case in range(3):
        means = (np.arange(12) * 0.15 + rng.normal(size=12)).tolist()
        paper = list(range(12))
        mine = stats.permutation(means, paper, draws=draws, seed=case)
        assert not mine.exact
        reference = scipy_stats.permutation_test(
            (np.array(means),),
            lambda x, axis, paper=paper: ranked(x, np.array(paper, dtype=float), axis),
            permutation_type="pairings",
            vectorized=True,
            n_resamples=draws,
            alternative="greater",
            rng=np.random.default_rng(100 + case),
        )
        error = 4 * math.sqrt(2 * reference.pvalue * (1 - reference.pvalue) / draws) + 1e-4
        assert abs(mine.p - reference.pvalue) < error, (case, mine.p, reference.pvalue)


def test_emergence_counts_runs_that_never_emerged():
    assert stats.emergence([100.0, 150.0, 100.0]) == "100 (100–150), 3/3"
    assert stats.emergence([100.0, 100.0]) == "100, 2/2"
    assert stats.emergence([100.0, None, 200.0]) == "200 (100–never), 2/3"  # never is the latest
    assert stats.emergence([100.0, None]) == "never (100–never), 1/2"  # the median of 100 and never
    assert stats.emergence([None, None]) == "never, 0/2"
    assert stats.emergence([]) == "—"


def test_ordering_names_the_pairs_its_tests_resolve_after_holm():
    a, b, c = stats.spread([10.0, 11.0, 12.0]), stats.spread([0.0, 1.0, 2.0]), stats.spread([0.5, 1.5, 1.0])
    wide = stats.spread([-20.0, 5.0, 30.0])  # resolves from nothing
    # a vs b: t = 10 / sqrt(1/3 + 1/3) on 4 df; a vs c: t = 10 / sqrt(1/3 + 1/12) on Welch's
    # (5/12)² / ((1/3)² / 2 + (1/12)² / 2) df; b vs c: equal means, p = 1. Holm scales them by 3 and 2.
    p_ab = 2 * scipy_stats.t.sf(10 / math.sqrt(2 / 3), 4)
    p_ac = 2 * scipy_stats.t.sf(10 / math.sqrt(5 / 12), (5 / 12) ** 2 / ((1 / 3) ** 2 / 2 + (1 / 12) ** 2 / 2))
    assert stats.ordering(["a", "b", "c"], [a, b, c], 1) == (
        f"a 11.0, b 1.0, c 1.0; a > b (Welch, Holm p = {3 * p_ab:.2g}); a > c (Welch, Holm p = {2 * p_ac:.2g}); "
        "every other pair not resolved at 3 seeds"
    )
    assert f"{3 * p_ab:.2g}" == "0.00077" and f"{2 * p_ac:.2g}" == "0.0013"
    assert stats.ordering(["a", "w", "b"], [a, wide, b], 1) == (
        "a 11.0, w 5.0, b 1.0; a > b (Welch, Holm p = 0.00077); every other pair not resolved at 3 seeds"
    )
    assert stats.ordering(["b", "c"], [b, c]) == "b 1.00, c 1.00; every pair not resolved at 3 seeds"
    assert stats.ordering(["a", "b"], [a, stats.spread([3.0])]) is None  # one seed: no test
    two = stats.spread([0.0, 1.0])
    assert stats.ordering(["b", "two"], [b, two]) == "b 1.00, two 0.50; every pair not resolved at 2–3 seeds"
    assert stats.ordering(["a", "two"], [a, two]) == "a 11.00, two 0.50; a > two (Welch, Holm p = 0.001)"
    same = [stats.spread([1.0, 1.0]), stats.spread([1.0, 1.0]), stats.spread([2.0, 2.0])]  # constant seeds
    assert stats.ordering(["x", "y", "z"], same) == "z 2.00, x 1.00, y 1.00; every pair not resolved at 2 seeds"


def test_the_welch_p_is_scipys_and_holm_spans_the_pairs_of_a_column():
    a, b = stats.spread([1.0, 2.0, 3.5]), stats.spread([3.0, 4.5, 6.0, 5.0])
    welch = scipy_stats.ttest_ind([1.0, 2.0, 3.5], [3.0, 4.5, 6.0, 5.0], equal_var=False).pvalue
    assert stats.pair_test(a, b) == ("Welch", welch)
    # 0.021 alone; the smallest of three pairs' p, it is scaled by 3 and no longer resolves
    _, p = stats.pair_test(stats.spread([0.0, 0.5, 1.0]), stats.spread([1.5, 2.0, 2.5]))
    assert p < stats.ALPHA < 3 * p
    pair = [stats.spread([0.0, 0.5, 1.0]), stats.spread([1.5, 2.0, 2.5])]
    assert "y > x (Welch, Holm p = 0.021)" in stats.ordering(["x", "y"], pair)
    assert "y > x" not in stats.ordering(["x", "y", "z"], [*pair, stats.spread([-9.0, 0.0, 9.0])])


def test_a_pair_constant_over_seeds_gets_the_exact_permutation_p_not_welch_s_zero():
    hundred, zero = stats.spread([100.0] * 3), stats.spread([0.0] * 3)
    # 2 of the C(6, 3) = 20 splits are as far apart as the one seen: the least p 3 against 3 seeds can give
    assert stats.pair_test(hundred, zero) == ("permutation", 2 / 20)
    assert stats.pair_test(hundred, stats.spread([98.0] * 3)) == ("permutation", 2 / 20)
    assert stats.pair_test(hundred, stats.spread([100.0] * 3)) == ("permutation", 1.0)
    assert stats.ordering(["a", "b"], [zero, hundred]) == "b 100.00, a 0.00; every pair not resolved at 3 seeds"
    four = [stats.spread([1.0] * 4), stats.spread([0.0] * 4)]  # 2 of C(8, 4) = 70
    assert stats.ordering(["a", "b"], four) == "a 1.00, b 0.00; a > b (permutation, Holm p = 0.029)"
    many = [stats.spread([1.0] * 10), stats.spread([0.0] * 10)]  # C(20, 10) > PERMUTATIONS: random splits, seeded
    assert stats.pair_test(*many) == stats.pair_test(*many) and stats.pair_test(*many)[1] < 1e-4
    # one constant group and one that varies: Welch, on the varying group's n - 1 = 2 df
    test, p = stats.pair_test(hundred, stats.spread([98.0, 99.0, 97.0]))
    assert test == "Welch" and p == pytest.approx(2 * scipy_stats.t.sf(2 / (1 / math.sqrt(3)), 2))


def test_show_p_never_rounds_a_p_below_its_level_up_to_it():
    assert stats.show_p(0.0498) == "0.0498"
    assert stats.show_p(0.02499, 0.025) == "0.02499"
    assert stats.show_p(0.012) == "0.012"
    assert stats.show_p(0.3) == "0.3"
