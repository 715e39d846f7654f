"""Rank agreement of a study with the paper: Spearman rho and Kendall tau-b of the per-variant
means against the paper's values, a bootstrap interval over seeds, the permutation p of rho, Holm's
adjustment over a family of rows, and a verdict in words."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from pipeline import metric_names as N
from pipeline import metrics as M
from pipeline import probe_metrics as P
from pipeline.experiments import stats
from pipeline.experiments.spec import Experiment
from pipeline.experiments.stats import Interval, Permutation, Spread

if TYPE_CHECKING:
    from pipeline.experiments.report import Row


EMERGED = {name: N.emerged_step(name) for name in (*M.EMERGENCE_SINK1, *M.EMERGENCE_ALPHA1)}
ALPHA1_KEY = "alpha1_vs_sink1"  # the row of the mean alpha_1 against the paper's Sink_1
PERCENT, SHARE, NONNEGATIVE = (0.0, 100.0), (0.0, 1.0), (0.0, math.inf)
# a metric's range by how its name starts; a family's start is its name without the example's tail
RANGES = (
    (N.SINK1, PERCENT),
    (N.sink_k(1).removesuffix("1"), PERCENT),
    (N.sink_star("0").removesuffix("0"), PERCENT),
    (N.DORMANT_PCT, PERCENT),
    (N.passkey_accuracy("x").removesuffix("x"), PERCENT),
    (N.length_passkey("m", 1).removesuffix("m_x1"), PERCENT),
    (N.EVAL, PERCENT),  # lm-eval's accuracies: a share in [0, 1], or a percentage
    (N.alpha_k_mean(1).removesuffix("1_mean"), SHARE),  # alpha_k means and the uniform alpha_1
    (P.name("bos_share_trigger"), SHARE),
    (P.name("bos_share_other"), SHARE),
    (N.FLOW_ENTROPY, SHARE),  # normalised: 0 for rank 1, 1 at most
    (N.TRAIN_LOSS, NONNEGATIVE),
    (N.VAL_LOSS, NONNEGATIVE),
    (N.length_loss("m", 0).removesuffix("m_b0"), NONNEGATIVE),
    (P.name("massive_ratio"), NONNEGATIVE),
    (P.name("value_norm_ratio"), NONNEGATIVE),
    (N.SKIPPED_STEPS, NONNEGATIVE),
    (N.FLOW_MIXING, NONNEGATIVE),
    (N.stream_perplexity("x").removesuffix("x"), (1.0, math.inf)),
    (N.act("kurtosis"), (1.0, math.inf)),  # Pearson's form, E[z⁴] >= E[z²]² = 1
    (P.name("max_logit"), stats.UNBOUNDED),  # q·k/√d_h takes either sign
)


def bounds(metric: str) -> tuple[float, float]:
    """The range a metric's values (and an interval of their mean) can take; unbounded where none is declared."""
    return next((r for start, r in RANGES if metric.startswith(start)), stats.UNBOUNDED)


def table_row(cells) -> str:
    """One Markdown table row, each cell's pipes escaped (``|sum|`` in a label)."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def fmt_corr(value: float | None, interval: Interval | None = None) -> str:
    """ "+0.80 [+0.75, +0.85]": a correlation, then its resampled range where there is one."""
    shown = stats.MISSING if value is None else f"{value:+.2f}"
    if interval is None or interval.lo is None:
        return shown
    return f"{shown} [{interval.lo:+.2f}, {interval.hi:+.2f}]"


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
    p_holm: float | None = None  # p in rho's direction, Holm-adjusted over `family` rows
    family: int = 0

    @property
    def verdict(self) -> str:
        args = (self.rho, self.tau, self.rho_interval, self.p, self.distinct, self.min_seeds)
        return stats.verdict(*args, self.p_holm if self.family else None)

    def shown(self) -> list[str]:
        """rho [range], p ("0.0014 (all 720)": one-sided in rho's direction, of so many permutations) and Holm p."""
        tail, level = stats.directional(self.rho, self.p), stats.ALPHA / 2
        holm = stats.MISSING if self.p_holm is None else stats.show_p(self.p_holm, level)
        if tail is None:
            return [fmt_corr(self.rho, self.rho_interval), stats.MISSING, holm]
        drawn = f"all {self.p.permutations:,}" if self.p.exact else f"{self.p.permutations:,} drawn"
        return [fmt_corr(self.rho, self.rho_interval), f"{stats.show_p(tail, level)} ({drawn})", holm]


def adjust(found: list[Agreement]) -> list[Agreement]:
    """Holm over the family of `found`: its rows with a permutation p, each in rho's direction."""
    family = [a for a in found if stats.directional(a.rho, a.p) is not None]
    for a in found:
        a.p_holm, a.family = None, 0
    for a, adjusted in zip(family, stats.holm([stats.directional(a.rho, a.p) for a in family])):
        a.p_holm, a.family = adjusted, len(family)
    return found


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
    fewest, count = min((s.n for s, _ in both), default=0), stats.distinct(means, digits)
    if count < 2:  # means printed alike: no ordering to rank
        rho = tau = None
    found = Agreement(key, label, len(both), rho, tau, min_seeds=fewest, distinct=count)
    if rho is None:
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
    sink1 = next((i for i, c in enumerate(experiment.columns) if c.metric == N.SINK1), None)
    if sink1 is not None and any(r.paper[sink1] is not None for r in rows):
        label = "mean alpha_1 (ours) vs Sink_1 (paper)"
        paper = [r.paper[sink1] for r in rows]
        out.append(compare(ALPHA1_KEY, label, [r.alpha1 for r in rows], paper, 3, bounds(N.ALPHA1_MEAN)))
    return adjust(out)


def legend(family: list[str], rows_of: str) -> str:
    """What p, Holm p and the verdict are, naming the `family` (its rows' names) that the rows of `rows_of` form."""
    rows = f"{len(family)} row{'s' if len(family) > 1 else ''}"
    named = f"its {rows} with a p ({', '.join(family)})" if family else "empty (no row has a p)"
    return (
        "p: the one-sided permutation p of rho in rho's own direction (exact over every permutation up to "
        f"{stats.EXACT_UP_TO} variants, else {stats.PERMUTATIONS:,} drawn). Holm p: p after Holm's step-down "
        f"adjustment over the family of {rows_of}, {named}. A verdict needs rho's range to exclude 0, Holm p < "
        f"{stats.ALPHA / 2} (two-sided {stats.ALPHA}), tau of rho's sign and {stats.MIN_DISTINCT} distinct means. "
        f"{stats.MISSING} for rho, tau and p: not defined, as fewer than 2 variants have both values or the means (at "
        "the printed precision) or the paper's values are all equal: there is no ordering to rank, so no range and no "
        "verdict; a resampled range needs 2 seeds of every variant."
    )


def agreement_markdown(found: list[Agreement]) -> list[str]:
    if not found:
        return []
    lines = [
        "",
        "Rank agreement with the paper, on the per-variant means over the variants with both values "
        "(Spearman rho on average ranks, Kendall tau-b), each with "
        f"the 2.5-97.5% range of its {stats.RESAMPLES} resamples over seeds (a resample draws every variant's "
        "mean from its t-distribution, mean + s/sqrt(n) t(n-1), the draws of one mean spanning its 95% "
        f"t-interval; RNG seed {stats.BOOTSTRAP_SEED}; defined: the resamples in which rho has a value), "
        "and the distinct means at the printed precision. "
        + legend([a.label for a in found if a.family], "this report"),
        "",
        "| measured vs paper | variants | seeds (fewest) | Spearman rho [resampled] | p | Holm p | defined "
        "| Kendall tau [resampled] | distinct | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for a in found:
        defined = stats.MISSING if a.rho_interval is None else f"{a.rho_interval.defined}/{a.rho_interval.resamples}"
        cells = [a.label, a.n, a.min_seeds, *a.shown(), defined, fmt_corr(a.tau, a.tau_interval), a.distinct, a.verdict]
        lines.append(table_row(cells))
    lines += ["", "Verdict: " + "; ".join(f"{a.label}: {a.verdict}" for a in found) + "."]
    return lines


DATA = "<!-- agreement rows: "  # a results page's line of its agreement rows, for the index


def data_line(found: list[Agreement]) -> str:
    """The agreement rows as one Markdown comment line of JSON, exact where the tables round."""
    return f"{DATA}{json.dumps([asdict(a) for a in found])} -->"


def from_data(text: str) -> list[Agreement]:
    """The agreement rows of a page's DATA line, none where it has none."""
    line = next((line for line in text.splitlines() if line.startswith(DATA)), None)
    if line is None:
        return []
    kinds = {"rho_interval": Interval, "tau_interval": Interval, "p": Permutation}
    rows = json.loads(line.removeprefix(DATA).removesuffix(" -->"))
    return [Agreement(**row | {k: kind(**row[k]) for k, kind in kinds.items() if row[k] is not None}) for row in rows]


def index_markdown(pages: list[tuple[str, list[Agreement]]]) -> list[str]:
    """Every page's agreement rows in one table, Holm over all of them (each row is re-adjusted)."""
    found = adjust([a for _, rows in pages for a in rows])
    if not found:
        return ["", "Rank agreement: no generated page has an agreement row, so the index's family is empty."]
    lines = [
        "",
        "Rank agreement of every generated page, its rows as the page prints them but re-judged over the index's "
        "family. " + legend([f"{page}: {a.label}" for page, rows in pages for a in rows if a.family], "this index"),
        "",
        "| study | measured vs paper | variants | seeds (fewest) | Spearman rho [resampled] | p | Holm p "
        "| distinct | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    cells = [[page, a.label, a.n, a.min_seeds, *a.shown(), a.distinct, a.verdict] for page, rows in pages for a in rows]
    return lines + [table_row(row) for row in cells]
