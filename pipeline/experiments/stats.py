"""Statistics over seeds: spreads, the rank agreement's interval and permutation p, verdicts, emergence steps.

Definitions and their rationale: docs/experiments.md (Reports).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from pipeline import metrics as M

LEVEL = 0.95
RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # the report's bootstrap and Monte Carlo p are the same on every run of it
ALPHA = 0.05  # a directional verdict's one-sided level
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
    if n == 0:
        return Spread(xs, None, None, None, None, kept)
    mean = sum(xs) / n
    if n == 1:
        return Spread(xs, mean, None, None, None, kept)
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


def all_permutations(k: int) -> np.ndarray:
    """Every permutation of range(k): [k!, k] int8."""
    perms = np.zeros((1, 0), dtype=np.int8)
    for m in range(k):  # insert m at every position of each permutation of range(m)
        perms = np.concatenate([np.insert(perms, i, m, axis=1) for i in range(m + 1)])
    return perms


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
        perms = all_permutations(len(x))
        chunks = [tails(x[perms[start : start + (1 << 18)]] @ y) for start in range(0, len(perms), 1 << 18)]
        above, below = map(sum, zip(*chunks))
        return Permutation(above / len(perms), below / len(perms), len(perms), True)
    above, below = tails(np.random.default_rng(seed).permuted(np.tile(x, (draws, 1)), axis=1) @ y)
    return Permutation((above + 1) / (draws + 1), (below + 1) / (draws + 1), draws, False)


def distinct(means: Sequence[float], digits: int) -> int:
    """How many different values `means` hold as the report prints them (`digits` decimals)."""
    return len({round(m, digits) + 0.0 for m in means})  # + 0.0: -0.0 is 0.0


def verdict(
    rho: float | None,
    tau: float | None,
    interval: Interval | None,
    p: Permutation | None,
    distinct_means: int,
    min_seeds: int,
) -> str:
    """ "ordering reproduced" / "reversed" where the verdict's four conditions hold (docs/experiments.md), else which
    failed, in words."""
    if rho is None:
        return "undefined (fewer than 2 variants, or no spread)"
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
    tail = None if p is None else (p.p if up else p.p_reversed)
    if tail is None or tail >= ALPHA:
        which = "" if up else " for a reversal"  # the other tail than the p printed beside rho
        failed.append("no permutation p" if tail is None else f"p = {tail:.2g}{which}: chance explains this ordering")
    if tau is None or (tau > 0) != up or tau == 0:
        failed.append(f"rho and tau disagree in sign (tau {'n/a' if tau is None else f'{tau:+.2f}'})")
    if failed:
        return "no verdict: " + "; ".join(failed)
    return "ordering reproduced" if up else "ordering reversed"


NEVER = "never"
MISSING = "—"  # no value, in every table of a report


def emergence(steps: Sequence[float | None]) -> str:
    """ "100 (100–150), 3/3": median and range of the steps and how many runs emerged; a run that never emerged
    (None) counts as later than any step."""
    if not steps:
        return MISSING
    values = sorted(math.inf if s is None else float(s) for s in steps)
    n = len(values)
    median = (values[(n - 1) // 2] + values[n // 2]) / 2

    def show(v: float) -> str:
        return NEVER if math.isinf(v) else f"{v:.0f}"

    emerged = sum(s is not None for s in steps)
    if values[0] == values[-1]:
        return f"{show(median)}, {emerged}/{n}"
    return f"{show(median)} ({show(values[0])}–{show(values[-1])}), {emerged}/{n}"


def ordering(names: Sequence[str], spreads: Sequence[Spread], digits: int = 2) -> str | None:
    """The variants by mean, highest first, then every pair whose 95% intervals are disjoint ("a > b,
    c": a's interval lies above b's and c's); None unless every variant has an interval."""
    pairs = [(name, s) for name, s in zip(names, spreads) if s.mean is not None]
    if len(pairs) < 2 or any(s.lo is None for _, s in pairs):
        return None
    pairs.sort(key=lambda p: -p[1].mean)
    means = ", ".join(f"{name} {s.mean:.{digits}f}" for name, s in pairs)
    apart = []
    for i, (name, upper) in enumerate(pairs):
        below = [other for other, lower in pairs[i + 1 :] if lower.hi < upper.lo]
        if below:
            apart.append(f"{name} > {', '.join(below)}")
    return f"{means}; apart: {'; '.join(apart)}" if apart else f"{means}; no two apart"
