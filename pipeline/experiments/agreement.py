"""Rank agreement of a study with the paper: Spearman rho and Kendall tau-b of the per-variant
means against the paper's values, a bootstrap interval over seeds, and a verdict in words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline import metrics as M
from pipeline.experiments import stats
from pipeline.experiments.report_names import ALPHA1_KEY, SINK1
from pipeline.experiments.spec import Experiment
from pipeline.experiments.stats import Interval, Spread

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


@dataclass
class Agreement:
    """Rank agreement of one measured quantity's per-variant means with one paper column over the
    variants that have both (None: undefined), with bootstrap intervals over seeds."""

    key: str  # metric-name part: the column key, or alpha1_vs_sink1
    label: str
    n: int
    rho: float | None
    tau: float | None
    rho_interval: Interval | None = None
    tau_interval: Interval | None = None
    min_seeds: int = 0  # the fewest seeds of a variant in the comparison

    @property
    def verdict(self) -> str:
        return stats.verdict(self.rho, self.rho_interval, self.min_seeds)


def compare(key: str, label: str, ours: list[Spread], paper: list[float | None]) -> Agreement:
    both = [(s, p) for s, p in zip(ours, paper) if s.mean is not None and p is not None]
    means, values = [s.mean for s in ours], [p for _, p in both]
    rho, tau = M.spearman_rho(means, paper), M.kendall_tau_b(means, paper)
    fewest = min((s.n for s, _ in both), default=0)
    if len(both) < 2 or fewest < 2:  # with one seed a bootstrap would only repeat the value
        return Agreement(key, label, len(both), rho, tau, min_seeds=fewest)
    groups = [s.values for s, _ in both]
    return Agreement(
        key,
        label,
        len(both),
        rho,
        tau,
        stats.bootstrap(groups, lambda m: M.spearman_rho(m, values)),
        stats.bootstrap(groups, lambda m: M.kendall_tau_b(m, values)),
        fewest,
    )


def agreement(experiment: Experiment, rows: list[Row]) -> list[Agreement]:
    """Per column with paper values: ours against the paper's; then the mean alpha_1 against
    the paper's Sink_1 (it moves where Sink_1 stays zero at a small scale)."""
    out = []
    for i, column in enumerate(experiment.columns):
        paper = [r.paper[i] for r in rows]
        if any(v is not None for v in paper):
            out.append(compare(column.key, column.label, [r.measured[i] for r in rows], paper))
    sink1 = next((i for i, c in enumerate(experiment.columns) if c.metric == SINK1), None)
    if sink1 is not None and any(r.paper[sink1] is not None for r in rows):
        out.append(
            compare(
                ALPHA1_KEY,
                "mean alpha_1 (ours) vs Sink_1 (paper)",
                [r.alpha1 for r in rows],
                [r.paper[sink1] for r in rows],
            )
        )
    return out


def agreement_markdown(found: list[Agreement]) -> list[str]:
    if not found:
        return []
    lines = [
        "",
        "Rank agreement with the paper, on the per-variant means over the variants with both values "
        "(Spearman rho on average ranks, Kendall tau-b; n/a: fewer than 2 variants or no spread), with "
        f"a 95% bootstrap interval over seeds ({stats.RESAMPLES} resamples of each variant's seeds, "
        f"RNG seed {stats.BOOTSTRAP_SEED}):",
        "",
        "| measured vs paper | variants | seeds (fewest) | Spearman rho [95%] | Kendall tau [95%] | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for a in found:
        rho, tau = fmt_corr(a.rho) + fmt_interval(a.rho_interval), fmt_corr(a.tau) + fmt_interval(a.tau_interval)
        lines.append(table_row([a.label, a.n, a.min_seeds, rho, tau, a.verdict]))
    lines += ["", "Verdict: " + "; ".join(f"{a.label}: {a.verdict}" for a in found) + "."]
    return lines
