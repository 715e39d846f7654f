"""Every metric name SinkLab logs, written once (docs/contracts.md section 4); standard library only.

Layers and heads are 0-based; tests/test_metric_names.py fails on a metric name written as a string anywhere else.
"""

from __future__ import annotations

# the namespaces; the MLflow UI gives each its own chart section (pipeline.tracking.views)
SINK, ACT, ATTN, HEADS, TRAIN, VAL, PERF = "sink/", "act/", "attn/", "heads/", "train/", "val/", "perf/"
ANALYSIS, TABLE1, DOMAIN, PASSKEY, STREAM, QUANT = "analysis/", "table1/", "domain/", "passkey/", "stream/", "quant/"
AGREEMENT, SEEDS = "agreement/", "seeds/"  # a report's rank agreement, and its statistics over a variant's seeds
EVAL = "eval/"  # lm-eval task scores, logged by the lm-eval run itself
FLOW, LENGTH = "flow/", "length/"  # information flow per layer (pipeline.flow); sinklab length-eval
NAMESPACES = (SINK, ACT, ATTN, HEADS, TRAIN, VAL, PERF, ANALYSIS, TABLE1, DOMAIN, PASSKEY, STREAM, QUANT)
NAMESPACES += (AGREEMENT, EVAL, SEEDS, FLOW, LENGTH)

# ---- training (pipeline.train.module, pipeline.train.callbacks.Throughput) ----------------------
TRAIN_LOSS = TRAIN + "loss"  # the step's mean over micro-batches and ranks
TRAIN_LR = TRAIN + "lr"
SKIPPED_STEPS = TRAIN + "skipped_steps"  # steps the spike guard did not apply, so far (run.skip_spikes)
GRAD_NORM = TRAIN + "grad_norm"  # the step's global gradient norm before clipping (run.skip_spikes)
VAL_LOSS = VAL + "loss"
TOKENS_PER_S = PERF + "tokens_per_s"
MFU = PERF + "mfu"
MAX_MEMORY_GIB = PERF + "max_memory_gib"

# ---- the sink probe (pipeline.probe, pipeline.train.emergence) ----------------------------------
# its registered metrics are named by their registrations, namespace + key (pipeline.probe_metrics.name)
SINK1 = SINK + "sink1"
ALPHA1_MEAN = SINK + "alpha1_mean"  # mean α₁ over layers, heads and sequences
ALPHA1_UNIFORM = SINK + "alpha1_uniform"  # α₁ under uniform attention with this model's mask
EMERGED_STEP = SINK + "emerged_step_"
HEAD_ALPHA1 = HEADS + "alpha1"  # per head
DORMANT_PCT = HEADS + "dormant_pct"
# information flow (pipeline.flow): per layer unless said otherwise
FLOW_ENTROPY = FLOW + "entropy"  # normalised matrix entropy of the token representations
FLOW_ENTROPY_INPUT = FLOW + "entropy_input"  # the same of the input embeddings
FLOW_MIXING = FLOW + "mixing"  # over-mixing sensitivity
FLOW_MIXING_LAST = FLOW + "mixing_last"  # the last layer's
NORM_JUMP_LAYER = FLOW + "norm_jump_layer"  # where ‖h₁‖ / mean ‖hₜ‖ rises most
ENTROPY_DROP_LAYER = FLOW + "entropy_drop_layer"  # where the matrix entropy falls most
# MLflow image keys (RunLogger.log_image)
ALPHA1_IMAGE = HEADS + "alpha1"  # layer x head heat map, one image per probe step
TRAJECTORY_IMAGE = HEADS + "alpha1_trajectory"  # α₁ of every head over the run, at the last step
MAX_LOGIT_IMAGE = HEADS + "max_logit"  # layer x head heat map of the largest q·k/√d_h, per probe step


def sink_k(k: int) -> str:
    return f"{SINK}sink_k{k}"


def sink_star(name: str) -> str:
    return f"{SINK}sink_star_{name}"


def alpha_k_mean(k: int) -> str:
    return f"{SINK}alpha{k}_mean"


def emerged_step(name: str) -> str:
    return EMERGED_STEP + name


def act(name: str) -> str:
    """An activation-outlier figure (pipeline.outliers): ``act/<name>``."""
    return ACT + name


def layer(name: str, l: int) -> str:
    """``<name>_l<l>``, e.g. ``layer(FLOW_ENTROPY, 0)`` = ``flow/entropy_l0``."""
    return f"{name}_l{l}"


def head(name: str, l: int, h: int) -> str:
    return f"{name}_l{l}_h{h}"


# ---- analysis (pipeline.analysis) and reports (pipeline.experiments.report) ----------------------
def analysis(name: str) -> str:
    """A ``sinklab analyze`` metric logged on the training run it analysed."""
    return ANALYSIS + name


def table1(name: str) -> str:
    return TABLE1 + name


def of_input(kind: str, name: str) -> str:
    """``name`` measured on one kind of probe input (``natural``, ``random``, ...)."""
    return f"{kind}/{name}"


def input_sink_k(kind: str, k: int) -> str:
    return f"{kind}/sink_k{k}"


def domain(name: str) -> str:
    return DOMAIN + name


def passkey_accuracy(cache: str) -> str:
    return f"{PASSKEY}acc_{cache}"


def length_loss(mode: str, bucket: int) -> str:
    """`sinklab length-eval`: the mean loss of position bucket ``bucket`` under ``mode`` (full, 0_128, ...)."""
    return f"{LENGTH}loss_{mode}_b{bucket}"


def length_passkey(mode: str, factor: int | str) -> str:
    """`sinklab length-eval`: passkey accuracy (%) at ``factor`` x the training length under ``mode``."""
    return f"{LENGTH}passkey_{mode}_x{factor}"


def stream_perplexity(cache: str) -> str:
    return f"{STREAM}ppl_{cache}"


def kv_perplexity(policy: str, sinks: str, budget: float) -> str:
    """`sinklab kv-eval`: perplexity under eviction ``policy`` with the sinks ``keep``, ``drop`` or ``policy`` (its own
    scores), the cache ``budget`` percent of the text, e.g. ``stream/kv_h2o_keep_b25``."""
    return f"{STREAM}kv_{policy}_{sinks}_b{budget:g}"


def kv_first_kept(policy: str, budget: float) -> str:
    """`sinklab kv-eval`: the share (%) of evictions, layers and kv heads where ``policy`` on its own scores kept the
    first entry, the cache ``budget`` percent of the text, e.g. ``stream/kv_first_kept_h2o_b25``."""
    return f"{STREAM}kv_first_kept_{policy}_b{budget:g}"


def kv_passkey(row: str, budget: float, factor: int | str) -> str:
    """`sinklab kv-eval`: passkey accuracy (%) on prompts of ``factor`` x the cache's entries, ``row`` a policy and
    sink setting (``h2o_keep``) or ``full``, e.g. ``stream/kv_passkey_h2o_drop_b25_x2``."""
    return f"{STREAM}kv_passkey_{row}_b{budget:g}_x{factor}"


# secondary sinks per layer (pipeline.secondary_sinks), with layer(): count per head and ‖h‖ ratio (the
# attention share is the probe's registered secondary_share)
SECONDARY_COUNT, SECONDARY_NORM = SINK + "secondary_count", SINK + "secondary_norm_ratio"


def quant(name: str) -> str:
    return QUANT + name


def agreement(key: str, statistic: str) -> str:
    return f"{AGREEMENT}{key}/{statistic}"


def over_seeds(variant: str, key: str, statistic: str) -> str:
    """A report's ``statistic`` (n, mean, std, lo, hi) of column ``key`` over a variant's seeds."""
    return f"{SEEDS}{variant}/{key}/{statistic}"


def is_metric(name: str) -> bool:
    """Whether ``name`` lies in one of SinkLab's namespaces (what an experiment's column may read)."""
    return name.startswith(NAMESPACES) and len(name) > name.index("/") + 1
