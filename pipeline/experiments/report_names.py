"""What a report reads from training runs: metric names and their ranges (docs/experiments.md)."""

from __future__ import annotations

import math

from pipeline import metric_names as N
from pipeline import metrics as M
from pipeline import probe_metrics as P

SINK1, ALPHA1 = N.SINK1, N.ALPHA1_MEAN
UNIFORM = N.ALPHA1_UNIFORM  # logged by every probe
EMERGED = {name: N.emerged_step(name) for name in (*M.EMERGENCE_SINK1, *M.EMERGENCE_ALPHA1)}
# the emergence steps a report shows: Sink_1 above 10%, and the alpha_1 version
EMERGENCE_SHOWN = (("sink1_10pct", "emerged: Sink_1 > 10%"), ("alpha1_125pct", "emerged: alpha_1 > 1.25 x uniform"))
ALPHA1_KEY = "alpha1_vs_sink1"
ALPHA1_COLUMN = "alpha1_mean"


PERCENT, SHARE, NONNEGATIVE, REAL = (0.0, 100.0), (0.0, 1.0), (0.0, math.inf), (-math.inf, math.inf)
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
    (P.name("max_logit"), REAL),  # q·k/√d_h takes either sign
)


def bounds(metric: str) -> tuple[float, float]:
    """The range a metric's values (and an interval of their mean) can take; unbounded where none is declared."""
    return next((r for start, r in RANGES if metric.startswith(start)), REAL)
