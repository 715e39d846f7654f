"""Agreement's metric ranges: every metric it reports has a declared range, and its intervals stay inside it."""

from __future__ import annotations

import math

import pytest

from pipeline import metric_names as N
from pipeline.experiments.agreement import RANGES, bounds
from pipeline.experiments.spec import experiment_files, load_experiment
from pipeline.experiments.stats import UNBOUNDED, spread


def declared(metric: str) -> bool:
    return any(metric.startswith(start) for start, _ in RANGES)


def test_every_metric_an_experiment_reports_has_a_declared_range():
    undeclared = []
    for path in experiment_files():
        experiment = load_experiment(path)
        for scale in experiment.scales:
            metrics = {experiment.metric(c, scale) for c in experiment.columns} | {N.ALPHA1_MEAN}
            undeclared += [f"{path.name} ({scale}): {m}" for m in sorted(metrics) if not declared(m)]
    assert undeclared == [], "add each metric's range to pipeline.experiments.agreement.RANGES"


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("act/kurtosis_pooled", (1.0, math.inf)),  # Pearson's form: 3 for a normal, never below 1
        ("act/kurtosis_first", (1.0, math.inf)),
        ("eval/arc_challenge", (0.0, 100.0)),
        ("sink/sink1", (0.0, 100.0)),
        ("sink/alpha1_mean", (0.0, 1.0)),
        ("val/loss", (0.0, math.inf)),
        ("stream/ppl_1_63", (1.0, math.inf)),
        ("attn/max_logit", (-math.inf, math.inf)),  # declared: a logit takes either sign
    ],
)
def test_ranges_by_metric(metric, expected):
    assert declared(metric) and bounds(metric) == expected


def test_an_undeclared_metric_is_unbounded_and_said_to_be():
    assert not declared("my/metric") and bounds("my/metric") == UNBOUNDED


def test_a_kurtosis_interval_never_goes_below_one():
    """The pooled kurtosis of three seeds, 3.1, 4.0 and 43.6: the t-interval of the mean reaches below 0."""
    s = spread([3.1, 4.0, 43.6], bounds=bounds("act/kurtosis_pooled"))
    assert s.mean == pytest.approx(16.9) and s.lo == 1.0 and s.hi > 60
