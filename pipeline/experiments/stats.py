"""Statistics over seeds: spreads, the rank agreement's interval and permutation p, Holm's adjustment, verdicts,
emergence steps and orderings by pairwise tests.

Definitions and their rationale: docs/experiments.md (Reports).
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from pipeline import metrics as M

LEVEL = 0.95
RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # the report's bootstrap and Monte Carlo p are the same on every run of it
ALPHA = 0.05  # two-sided level of every test: a directional verdict's tail must be below ALPHA / 2
EXACT_UP_TO = 10  # variants whose every permutation is enumerated (10! = 3,628,800)
PERMUTATIONS = 100_000  # random permutations beyond that
MIN_DISTINCT = 3  # distinct measured means a directional verdict needs
UNBOUNDED = (-math.inf, math.inf)


@dataclass(frozen=True)
class Spread:
    """One metric over a variant's seeds; std and the interval are None below 2 values."""

    values: tuple[float, ...]
    mean: float | None
    std: float | None
    lo: float | None
    hi: float | None
    seeds: tuple[int | None, ...] = ()  # the seed of each value, where given

    @property
    def n(self) -> int:
        return len(self.values)


def spread(
    values: Sequence[float | None],
    seeds: Sequence[int | None] | None = None,
    bounds: tuple[float, float] = UNBOUNDED,
) -> Spread:
    """n, mean, sample std (ddof 1) and the 95% t-interval of the mean (mean ± t₀.₉₇₅,ₙ₋₁ · s/√n) of the known
    values, clipped to `bounds`, the metric's range; with `seeds`, each value's seed is kept."""
    pairs = [(float(v), s) for v, s in zip(values, seeds or [None] * len(values)) if v is not None and v == v]
    xs, kept = tuple(v for v, _ in pairs), tuple(s for _, s in pairs) if seeds is not None else ()
    n = len(xs)
    if n < 2:
        return Spread(xs, xs[0] if xs else None, None, None, None, kept)
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(scipy_stats.t.ppf(0.5 + LEVEL / 2, n - 1)) * std / math.sqrt(n)
    return Spread(xs, mean, std, max(mean - half, bounds[0]), min(mean + half, bounds[1]), kept)


@dataclass(frozen=True)
class Interval:
    """A bootstrap interval; `defined` of `resamples` resamples gave the statistic a value."""

    lo: float | None
    hi: float | None
    defined: int
    resamples: int


def bootstrap(
    groups: Sequence[Sequence[float]],
    statistic: Callable[[list[float]], float | None],
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    bounds: tuple[float, float] = UNBOUNDED,
) -> Interval:
    """95% percentile interval of ``statistic(means)`` where each resample draws every group's mean (a variant's seeds:
    n ≥ 2 values, mean m, std s) as m + s/√n · T, T ~ t(n − 1), clipped to `bounds`."""
    arrays = [np.asarray(g, dtype=float) for g in groups]
    sizes = np.array([len(a) for a in arrays])
    if (sizes < 2).any():
        raise ValueError(f"bootstrap needs 2 values or more in every group, got sizes {sizes.tolist()}")
    means = np.array([a.mean() for a in arrays])
    errors = np.array([a.std(ddof=1) for a in arrays]) / np.sqrt(sizes)
    t = np.random.default_rng(seed).standard_t(sizes - 1, size=(resamples, len(arrays)))
    drawn = np.clip(means + errors * t, *bounds)
    draws = [v for v in (statistic(row.tolist()) for row in drawn) if v is not None]
    if not draws:
        return Interval(None, None, 0, resamples)
    lo, hi = np.quantile(draws, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return Interval(float(lo), float(hi), len(draws), resamples)


@dataclass(frozen=True)
class Permutation:
    """One-sided permutation p of Spearman ρ: `p` in the paper's direction (P(ρ* ≥ ρ), ρ* over
    reassignments of the measured means to the paper's values), `p_reversed` the other tail."""

    p: float
    p_reversed: float
    permutations: int
    exact: bool


def permutation(
    means: Sequence[float], paper: Sequence[float], draws: int = PERMUTATIONS, seed: int = BOOTSTRAP_SEED
) -> Permutation | None:
    """The permutation p of ρ(means, paper), ties at average ranks, counting permutations that tie
    the observed ρ as at least as extreme; None where ρ is undefined. ρ is a fixed affine function
    of Σ rank(means)ᵢ · rank(paper)ᵢ under permutation, so that sum is what is compared."""
    if M.spearman_rho(means, paper) is None:
        return None
    x, y = np.array(M.average_ranks(means)), np.array(M.average_ranks(paper))
    y -= y.mean()
    observed, tolerance = float(x @ y), 1e-9 * (1 + float(np.abs(x) @ np.abs(y)))

    def tails(scores: np.ndarray) -> tuple[int, int]:  # how many score at least / at most the observed, ties in both
        return int((scores >= observed - tolerance).sum()), int((scores <= observed + tolerance).sum())

    if len(x) <= EXACT_UP_TO:
        perms = np.zeros((1, 0), dtype=np.int8)  # every permutation of range(len(x)), [k!, k]
        for m in range(len(x)):  # insert m at every position of each permutation of range(m)
            perms = np.concatenate([np.insert(perms, i, m, axis=1) for i in range(m + 1)])
        chunks = [tails(x[perms[start : start + (1 << 18)]] @ y) for start in range(0, len(perms), 1 << 18)]
        above, below = map(sum, zip(*chunks))
        return Permutation(above / len(perms), below / len(perms), len(perms), True)
    above, below = tails(np.random.default_rng(seed).permuted(np.tile(x, (draws, 1)), axis=1) @ y)
    return Permutation((above + 1) / (draws + 1), (below + 1) / (draws + 1), draws, False)


def distinct(means: Sequence[float], digits: int) -> int:
    """How many different values `means` hold as the report prints them (`digits` decimals)."""
    return len({round(m, digits) + 0.0 for m in means})  # + 0.0: -0.0 is 0.0


def directional(rho: float | None, p: Permutation | None) -> float | None:
    """The permutation p in rho's own direction: `p` for rho >= 0, `p_reversed` below."""
    if rho is None or p is None:
        return None
    return p.p if rho >= 0 else p.p_reversed


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p values, in the order given: the i-th smallest of m is scaled by m − i
    (i from 0), made non-decreasing in that order and capped at 1."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [1.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def verdict(
    rho: float | None,
    tau: float | None,
    interval: Interval | None,
    p: Permutation | None,
    distinct_means: int,
    min_seeds: int,
    adjusted: float | None = None,
) -> str:
    """ "ordering reproduced" / "reversed" where the verdict's four conditions hold (docs/experiments.md), else which
    failed, in words; `adjusted`: the Holm-adjusted p in rho's direction (None: a family of one)."""
    if rho is None:
        return "undefined"
    if min_seeds < 2 or interval is None or interval.lo is None:
        return "no verdict (one seed for some variant: no interval)"
    if rho == 0:
        return "no verdict (rho = 0: no ordering)"
    up = rho > 0
    failed = []
    if distinct_means < MIN_DISTINCT:
        failed.append(f"too few distinct values: {distinct_means}")
    if (interval.lo <= 0) if up else (interval.hi >= 0):
        failed.append(f"the interval [{interval.lo:+.2f}, {interval.hi:+.2f}] includes 0")
    tail = directional(rho, p)  # defined wherever rho is
    if (tail if adjusted is None else adjusted) >= ALPHA / 2:
        holm_p = "" if adjusted is None else f", Holm {adjusted:.2g}"
        failed.append(f"p = {tail:.2g}{'' if up else ' for a reversal'}{holm_p}: not below {ALPHA / 2}")
    if tau is None or (tau > 0) != up or tau == 0:
        failed.append(f"rho and tau disagree in sign (tau {'—' if tau is None else f'{tau:+.2f}'})")
    if failed:
        return "no verdict: " + "; ".join(failed)
    return "ordering reproduced" if up else "ordering reversed"


MISSING = "—"  # no value, in every table of a report


def emergence(steps: Sequence[float | None]) -> str:
    """ "100 (100–150), 3/3": median and range of the steps and how many runs emerged; a run that never emerged
    (None) counts as later than any step."""
    if not steps:
        return MISSING
    values = sorted(math.inf if s is None else float(s) for s in steps)
    median, first, last = (
        "never" if math.isinf(v) else f"{v:.0f}" for v in (statistics.median(values), values[0], values[-1])
    )
    counted = f"{sum(s is not None for s in steps)}/{len(values)}"
    return f"{median}, {counted}" if values[0] == values[-1] else f"{median} ({first}–{last}), {counted}"


def pair_test(a: Spread, b: Spread) -> tuple[str, float]:
    """The test that compares a's seeds with b's and its two-sided p: Welch's t-test, or where both are constant
    over seeds (Welch's t infinite or undefined) the permutation test of the difference in means."""
    if len(set(a.values)) > 1 or len(set(b.values)) > 1:
        with warnings.catch_warnings():  # a constant group: scipy warns of precision loss, its variance is still 0
            warnings.simplefilter("ignore", RuntimeWarning)
            return "Welch", float(scipy_stats.ttest_ind(a.values, b.values, equal_var=False).pvalue)
    p = scipy_stats.permutation_test(  # exact up to PERMUTATIONS splits of the seeds, random beyond
        (a.values, b.values), _mean_difference, n_resamples=PERMUTATIONS, rng=np.random.default_rng(BOOTSTRAP_SEED)
    ).pvalue
    return "permutation", min(float(p), 1.0)


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def show_p(p: float, level: float = ALPHA) -> str:
    """p to 2 significant digits, or more where 2 would round a p below `level` up to it."""
    digits = 2
    while float(text := f"{p:.{digits}g}") >= level > p:
        digits += 1
    return text


def ordering(names: Sequence[str], spreads: Sequence[Spread], digits: int = 2) -> str | None:
    """The variants by mean, highest first, then every pair its `pair_test` tells apart, Holm-adjusted over all
    pairs ("a > b (Welch, Holm p = 0.012)"), and the rest as not resolved; None unless every variant has 2
    seeds or more. Means equal at `digits` decimals are never told apart."""
    pairs = [(name, s) for name, s in zip(names, spreads) if s.mean is not None]
    if len(pairs) < 2 or any(s.n < 2 for _, s in pairs):
        return None
    pairs.sort(key=lambda p: -p[1].mean)
    means = ", ".join(f"{name} {s.mean:.{digits}f}" for name, s in pairs)
    tested = [(a, sa, b, sb) for i, (a, sa) in enumerate(pairs) for b, sb in pairs[i + 1 :]]
    tests = [pair_test(sa, sb) for _, sa, _, sb in tested]
    adjusted = holm([p for _, p in tests])
    resolved = [
        f"{a} > {b} ({test}, Holm p = {show_p(q)})"
        for (a, sa, b, sb), (test, _), q in zip(tested, tests, adjusted)
        if q < ALPHA and distinct([sa.mean, sb.mean], digits) == 2
    ]
    counts = sorted({s.n for _, s in pairs})
    at = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    rest = f"{'every other pair' if resolved else 'every pair'} not resolved at {at} seeds"
    return f"{means}; " + "; ".join(resolved + ([rest] if len(resolved) < len(tested) else []))
