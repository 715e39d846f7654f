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


# ---- name templates, filled in order: sink_k(1) is sink/sink_k1, layer(FLOW_ENTROPY, 0) flow/entropy_l0 ----
sink_k = (SINK + "sink_k{}").format
sink_star = (SINK + "sink_star_{}").format
alpha_k_mean = (SINK + "alpha{}_mean").format
emerged_step = (EMERGED_STEP + "{}").format
act = (ACT + "{}").format  # an activation-outlier figure (pipeline.outliers)
layer = "{}_l{}".format
head = "{}_l{}_h{}".format

# ---- analysis (pipeline.analysis) and reports (pipeline.experiments.report) ----------------------
analysis = (ANALYSIS + "{}").format  # a `sinklab analyze` metric logged on the training run it analysed
table1 = (TABLE1 + "{}").format
of_input = "{}/{}".format  # (kind, name): name measured on one kind of probe input (natural, random, ...)
input_sink_k = "{}/sink_k{}".format
domain = (DOMAIN + "{}").format
passkey_accuracy = (PASSKEY + "acc_{}").format
length_loss = (LENGTH + "loss_{}_b{}").format  # (mode: full, 0_128, ..., bucket): a position bucket's mean loss
length_passkey = (LENGTH + "passkey_{}_x{}").format  # (mode, factor): passkey accuracy at factor x the training length
stream_perplexity = (STREAM + "ppl_{}").format
# `sinklab kv-eval`, the cache budget in percent of the text
kv_perplexity = (STREAM + "kv_{}_{}_b{:g}").format  # (policy, sinks: keep, drop or policy, budget)
kv_first_kept = (STREAM + "kv_first_kept_{}_b{:g}").format  # (policy, budget): % of evictions that kept the first
kv_passkey = (STREAM + "kv_passkey_{}_b{:g}_x{}").format  # (policy_sinks or full, budget, factor x the cache)

# secondary sinks per layer (pipeline.secondary_sinks), with layer(): count per head and ‖h‖ ratio (the
# attention share is the probe's registered secondary_share)
SECONDARY_COUNT, SECONDARY_NORM = SINK + "secondary_count", SINK + "secondary_norm_ratio"
quant = (QUANT + "{}").format
agreement = (AGREEMENT + "{}/{}").format  # (key, statistic): a report's rank agreement
over_seeds = (SEEDS + "{}/{}/{}").format  # (variant, key, statistic: n, mean, std, lo, hi) over a variant's seeds


def is_metric(name: str) -> bool:
    """Whether ``name`` lies in one of SinkLab's namespaces (what an experiment's column may read)."""
    return name.startswith(NAMESPACES) and len(name) > name.index("/") + 1
