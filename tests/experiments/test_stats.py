"""Statistics over seeds, pinned on hand-made values."""

from __future__ import annotations

import math

import pytest

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
    far = stats.bootstrap([[0.0, 0.1], [1.0, 1.1], [2.0, 2.1]], statistic)  # separated: every resample agrees
    assert (far.lo, far.hi) == (1.0, 1.0)
    flat = stats.bootstrap([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], statistic)  # rho undefined in every resample
    assert (flat.lo, flat.hi, flat.defined) == (None, None, 0)


def test_the_verdict_needs_an_interval_that_excludes_zero():
    interval = stats.Interval
    assert stats.verdict(0.9, interval(0.4, 1.0, 2000, 2000), 3) == "ordering reproduced"
    assert stats.verdict(-0.9, interval(-1.0, -0.2, 2000, 2000), 3) == "ordering reversed"
    assert stats.verdict(0.9, interval(-0.1, 1.0, 2000, 2000), 3).startswith("not distinguishable from noise")
    assert stats.verdict(0.9, interval(0.9, 0.9, 2000, 2000), 1).startswith("no verdict (one seed")
    assert stats.verdict(None, None, 3).startswith("undefined")


def test_emergence_counts_runs_that_never_emerged():
    assert stats.emergence([100.0, 150.0, 100.0]) == "100 (100–150), 3/3"
    assert stats.emergence([100.0, 100.0]) == "100, 2/2"
    assert stats.emergence([100.0, None, 200.0]) == "200 (100–never), 2/3"  # never is the latest
    assert stats.emergence([100.0, None]) == "never (100–never), 1/2"  # the median of 100 and never
    assert stats.emergence([None, None]) == "never, 0/2"
    assert stats.emergence([]) == "—"


def test_ordering_claims_only_what_the_intervals_separate():
    a, b, c = stats.spread([10.0, 11.0, 12.0]), stats.spread([0.0, 1.0, 2.0]), stats.spread([0.5, 1.5, 1.0])
    wide = stats.spread([-20.0, 5.0, 30.0])  # overlaps everything
    assert stats.ordering(["a", "b", "c"], [a, b, c], 1) == "a 11.0, b 1.0, c 1.0; apart: a > b, c"
    assert stats.ordering(["a", "w", "b"], [a, wide, b], 1) == "a 11.0, w 5.0, b 1.0; apart: a > b"
    assert stats.ordering(["b", "c"], [b, c]).endswith("; no two apart")
    assert stats.ordering(["a", "b"], [a, stats.spread([3.0])]) is None  # one seed: no interval
