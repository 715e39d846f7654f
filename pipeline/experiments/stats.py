"""Statistics over seeds: a variant's spread, the bootstrap of a rank agreement, emergence steps.

- :func:`spread`: n, mean, sample standard deviation and the 95% t-interval of the mean
  (mean ± t₀.₉₇₅,ₙ₋₁ · s/√n) of one metric over a variant's seeds;
- :func:`bootstrap`: a 95% percentile interval of a statistic of the per-variant means (Spearman ρ,
  Kendall τ against the paper), resampling each variant's seeds with replacement, fixed RNG seed;
- :func:`verdict`: what such an interval lets a study say, in words;
- :func:`emergence`: median and range of per-seed emergence steps, a run that never emerged
  counted as later than every step;
- :func:`ordering`: the variants by mean, and the pairs whose 95% intervals are disjoint.

Definitions and their rationale: docs/experiments.md (Reports).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

LEVEL = 0.95
RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # the report's bootstrap is the same on every run of it


def known(values: Sequence[float | None]) -> list[float]:
    """The values that are numbers (None and NaN dropped)."""
    return [float(v) for v in values if v is not None and v == v]


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


def spread(values: Sequence[float | None], seeds: Sequence[int | None] | None = None) -> Spread:
    """n, mean, sample std (ddof 1) and the 95% t-interval of the mean of the known values (with
    `seeds`, the seed of each value is kept beside it)."""
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
    return Spread(xs, mean, std, mean - half, mean + half, kept)


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
) -> Interval:
    """95% percentile interval of ``statistic(means)`` where each resample draws every group's
    values (a variant's seeds) with replacement and takes their mean. Groups must be non-empty."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(g, dtype=float) for g in groups]
    draws = []
    for _ in range(resamples):
        means = [float(a[rng.integers(0, len(a), len(a))].mean()) for a in arrays]
        value = statistic(means)
        if value is not None:
            draws.append(value)
    if not draws:
        return Interval(None, None, 0, resamples)
    lo, hi = np.quantile(draws, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return Interval(float(lo), float(hi), len(draws), resamples)


def verdict(value: float | None, interval: Interval | None, min_seeds: int) -> str:
    """In words: "ordering reproduced" only where the interval excludes 0 from above."""
    if value is None:
        return "undefined (fewer than 2 variants, or no spread)"
    if min_seeds < 2 or interval is None or interval.lo is None:
        return "no verdict (one seed for some variant: no interval)"
    if interval.lo > 0:
        return "ordering reproduced"
    if interval.hi < 0:
        return "ordering reversed"
    return "not distinguishable from noise (the interval includes 0)"


NEVER = "never"


def emergence(steps: Sequence[float | None]) -> str:
    """ "100 (100–150), 3/3": median and range of the steps, and how many runs emerged ("100, 3/3"
    where all agree); a run that never emerged (None) counts as later than any step, so it can make
    the median "never"."""
    if not steps:
        return "—"
    ordered = sorted(steps, key=lambda s: math.inf if s is None else s)
    values = [math.inf if s is None else float(s) for s in ordered]
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
