"""What a report reads from training runs and writes to the experiment's parent run (MLflow metrics;
the names themselves live in pipeline.metric_names).

Read: Sink_1, the mean alpha_1 and its uniform value, the emergence steps (docs/analysis.md).
Written, NaN where undefined so that the newest report never leaves an older value standing:

- ``agreement/<column key>/{n,min_seeds,spearman,kendall}`` and the bootstrap interval's ends
  ``agreement/<key>/{spearman,kendall}_{lo,hi}`` (key ``alpha1_vs_sink1``: mean alpha_1 against the
  paper's Sink_1);
- ``seeds/<variant>/<column key>/{n,mean,std,lo,hi}``: a metric over the variant's seeds, the 95%
  t-interval as lo and hi (column key ``alpha1_mean`` for the mean alpha_1).
"""

from __future__ import annotations

import re

from pipeline import metric_names as N
from pipeline import metrics as M

SINK1, ALPHA1 = N.SINK1, N.ALPHA1_MEAN
UNIFORM = N.ALPHA1_UNIFORM  # logged by every probe
EMERGED = {name: N.emerged_step(name) for name in (*M.EMERGENCE_SINK1, *M.EMERGENCE_ALPHA1)}
# the emergence steps a report shows: Sink_1 above 10%, and the alpha_1 version
EMERGENCE_SHOWN = (("sink1_10pct", "emerged: Sink_1 > 10%"), ("alpha1_125pct", "emerged: alpha_1 > 1.25 x uniform"))
ALPHA1_KEY = "alpha1_vs_sink1"
ALPHA1_COLUMN = "alpha1_mean"
NAN = float("nan")


def _number(value: float | None) -> float:
    return NAN if value is None else float(value)


def agreement_metrics(found) -> dict[str, float]:
    """The agreement rows (report.Agreement) as MLflow metrics."""
    out = {}
    for a in found:
        out |= {N.agreement(a.key, "n"): float(a.n), N.agreement(a.key, "min_seeds"): float(a.min_seeds)}
        for name, value, interval in (("spearman", a.rho, a.rho_interval), ("kendall", a.tau, a.tau_interval)):
            out[N.agreement(a.key, name)] = _number(value)
            out[N.agreement(a.key, f"{name}_lo")] = _number(interval.lo if interval else None)
            out[N.agreement(a.key, f"{name}_hi")] = _number(interval.hi if interval else None)
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^\w./ -]", "_", name)  # MLflow's metric-name characters


def spread_metrics(experiment, rows) -> dict[str, float]:
    """Each variant's metrics over its seeds (report.Row) as MLflow metrics."""
    out = {}
    for row in rows:
        columns = [(c.key, s) for c, s in zip(experiment.columns, row.measured)] + [(ALPHA1_COLUMN, row.alpha1)]
        for key, s in columns:
            for statistic, value in (("n", s.n), ("mean", s.mean), ("std", s.std), ("lo", s.lo), ("hi", s.hi)):
                out[_safe(N.over_seeds(row.variant, key, statistic))] = _number(value)
    return out
