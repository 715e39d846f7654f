"""Rank agreement of a study with the paper: Spearman rho and Kendall tau-b of the per-variant
means against the paper's values, a bootstrap interval over seeds, the permutation p of rho, and a
verdict in words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline import metrics as M
from pipeline.experiments import stats
from pipeline.experiments.report_names import ALPHA1, ALPHA1_KEY, SINK1, bounds
from pipeline.experiments.spec import Experiment
from pipeline.experiments.stats import Interval, Permutation, Spread

if TYPE_CHECKING:
    from pipeline.experiments.report import Row


def table_row(cells) -> str:
    """One Markdown table row, each cell's pipes escaped (``|sum|`` in a label)."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def fmt_corr(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def fmt_interval(interval: Interval | None) -> str:
    if interval is None or interval.lo is None:
        return ""
    return f" [{interval.lo:+.2f}, {interval.hi:+.2f}]"


def fmt_p(p: Permutation | None) -> str:
    """ "0.0014 (all 720)": the one-sided p in the paper's direction and the permutations behind it."""
    if p is None:
        return "n/a"
    return f"{p.p:.2g} ({f'all {p.permutations:,}' if p.exact else f'{p.permutations:,} drawn'})"


def fmt_defined(interval: Interval | None) -> str:
    return stats.MISSING if interval is None else f"{interval.defined}/{interval.resamples}"


@dataclass
class Agreement:
    """Rank agreement of per-variant means with one paper column over the variants with both (None: undefined)."""

    key: str  # metric-name part: the column key, or alpha1_vs_sink1
    label: str
    n: int
    rho: float | None
    tau: float | None
    rho_interval: Interval | None = None
    tau_interval: Interval | None = None
    min_seeds: int = 0  # the fewest seeds of a variant in the comparison
    p: Permutation | None = None  # of rho over the variant means
    distinct: int = 0  # distinct means at the printed precision

    @property
    def verdict(self) -> str:
        return stats.verdict(self.rho, self.tau, self.rho_interval, self.p, self.distinct, self.min_seeds)


def compare(
    key: str,
    label: str,
    ours: list[Spread],
    paper: list[float | None],
    digits: int = 2,
    metric_bounds: tuple[float, float] = stats.UNBOUNDED,
) -> Agreement:
    """`digits`: the decimals the report prints the means with (ties within them count once);
    `metric_bounds`: the measured metric's range, where the resampled means are clipped."""
    both = [(s, p) for s, p in zip(ours, paper) if s.mean is not None and p is not None]
    means, values = [s.mean for s, _ in both], [p for _, p in both]
    rho, tau = M.spearman_rho(means, values), M.kendall_tau_b(means, values)
    fewest = min((s.n for s, _ in both), default=0)
    found = Agreement(key, label, len(both), rho, tau, min_seeds=fewest, distinct=stats.distinct(means, digits))
    if len(both) < 2:
        return found
    found.p = stats.permutation(means, values)
    if fewest < 2:  # with one seed there is no spread to resample
        return found
    groups = [s.values for s, _ in both]
    found.rho_interval = stats.bootstrap(groups, lambda m: M.spearman_rho(m, values), bounds=metric_bounds)
    found.tau_interval = stats.bootstrap(groups, lambda m: M.kendall_tau_b(m, values), bounds=metric_bounds)
    return found


def agreement(experiment: Experiment, rows: list[Row]) -> list[Agreement]:
    """Per column with paper values: ours against the paper's; then the mean alpha_1 against the paper's Sink_1."""
    out = []
    for i, column in enumerate(experiment.columns):
        paper = [r.paper[i] for r in rows]
        if any(v is not None for v in paper):
            measured = [r.measured[i] for r in rows]
            out.append(compare(column.key, column.label, measured, paper, column.digits, bounds(column.metric)))
    sink1 = next((i for i, c in enumerate(experiment.columns) if c.metric == SINK1), None)
    if sink1 is not None and any(r.paper[sink1] is not None for r in rows):
        label = "mean alpha_1 (ours) vs Sink_1 (paper)"
        paper = [r.paper[sink1] for r in rows]
        out.append(compare(ALPHA1_KEY, label, [r.alpha1 for r in rows], paper, 3, bounds(ALPHA1)))
    return out


def agreement_markdown(found: list[Agreement]) -> list[str]:
    if not found:
        return []
    lines = [
        "",
        "Rank agreement with the paper, on the per-variant means over the variants with both values "
        "(Spearman rho on average ranks, Kendall tau-b; n/a: fewer than 2 variants or no spread), each with "
        f"the 2.5-97.5% range of its {stats.RESAMPLES} resamples over seeds (a resample draws every variant's "
        "mean from its t-distribution, mean + s/sqrt(n) t(n-1), the draws of one mean spanning its 95% "
        f"t-interval; RNG seed {stats.BOOTSTRAP_SEED}; defined: the resamples in which rho has a value), the "
        "one-sided permutation p of rho in the paper's direction (exact over every permutation up to "
        f"{stats.EXACT_UP_TO} variants, else {stats.PERMUTATIONS:,} drawn) and the distinct means at the printed "
        f"precision. A verdict needs rho's range to exclude 0, p < {stats.ALPHA} in rho's direction, tau of "
        f"rho's sign and {stats.MIN_DISTINCT} distinct means:",
        "",
        "| measured vs paper | variants | seeds (fewest) | Spearman rho [resampled] | p | defined "
        "| Kendall tau [resampled] | distinct | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for a in found:
        rho, tau = fmt_corr(a.rho) + fmt_interval(a.rho_interval), fmt_corr(a.tau) + fmt_interval(a.tau_interval)
        cells = [a.label, a.n, a.min_seeds, rho, fmt_p(a.p), fmt_defined(a.rho_interval), tau, a.distinct, a.verdict]
        lines.append(table_row(cells))
    lines += ["", "Verdict: " + "; ".join(f"{a.label}: {a.verdict}" for a in found) + "."]
    return lines
