"""`sinklab analyze`'s printed tables, from its JSON result."""

from __future__ import annotations

from pipeline import metric_names as N
from pipeline import probe_metrics as P
from pipeline.outliers import summary_table


def format_table(result: dict) -> str:
    s = result["settings"]
    proxy = any(measures.get("is_proxy") for measures in result.get("measures", {}).values())
    scores = " on proxy scores (attention without softmax)" if proxy else ""
    bos = "no BOS"
    if s.get("bos") or s.get("probe_bos"):
        bos = "BOS first" if s.get("bos") else "natural BOS first (the dataset's probe set), the rest no BOS"
    lines = [
        f"{result['model']}: Sink_1^ε (%){scores}, ε={s['eps']}, T={s['seq_len']}, N={s['num_sequences']}, {bos}",
        "",
        "| " + " | ".join(result["table1"]) + " |",
        "|" + "---|" * len(result["table1"]),
        "| " + " | ".join(f"{v:.2f}" for v in result["table1"].values()) + " |",
    ]
    outliers = {
        kind: measures["outliers"]["summary"]
        for kind, measures in result.get("measures", {}).items()
        if measures.get("outliers")
    }
    if outliers:
        lines += ["", "Activation outliers (largest over layers; docs/analysis.md)", ""] + summary_table(outliers)
    for kind, layers in result.get("extreme_tokens", {}).items():
        if any(k.startswith(P.name("bos_share_other")) for k in layers):  # a Bigram-Backcopy probe: the split is known
            table = extreme_token_table(layers)
            lines += ["", f"Extreme-token phenomena per layer ({kind}; Guo et al. 2024)", "", *table]
    for kind, layers in result.get("flow", {}).items():
        table = flow_table(layers, result["extreme_tokens"][kind])
        lines += ["", f"Information flow per layer ({kind}; docs/analysis.md)", "", *table]
    if why := result.get("secondary_sinks", {}).get("not_judged"):
        lines += ["", f"Secondary sinks: not judged ({why})"]
    if result.get("domains"):
        rows = [f"| {d} | {v:.2f} |" for d, v in result["domains"].items()]
        lines += ["", "| domain | Sink_1 (%) |", "|---|---|", *rows]
    if result.get("learned_positions"):
        lines += ["", "| edit | t | Sink_1 (%) | Sink_t (%) |", "|---|---|---|---|"]
        lines += [
            f"| {r['mode']} | {r['t']} | {r['sink1']:.2f} | {r['sink_t']:.2f} |" for r in result["learned_positions"]
        ]
    return "\n".join(lines)


def extreme_token_table(layers: dict[str, float]) -> list[str]:
    """SinkMeasures.extreme_token_metrics as one row per layer."""
    columns = [P.name(key) for key in ("bos_share_trigger", "bos_share_other", "value_norm_ratio", "massive_ratio")]
    rows = [
        "| layer | BOS share, trigger queries | BOS share, other queries | ‖v₁‖ ratio | ‖h₁‖ ratio |",
        "|---|---|---|---|---|",
    ]
    for l in range(sum(k.startswith(P.name("massive_ratio") + "_l") for k in layers)):
        rows.append(f"| {l} | " + " | ".join(f"{layers.get(N.layer(c, l), float('nan')):.3f}" for c in columns) + " |")
    return rows


def flow_table(flow: dict[str, float], extreme: dict[str, float]) -> list[str]:
    """Per layer the first-token norm ratio, matrix entropy and over-mixing sensitivity; the jump and drop layers."""
    rows = ["| layer | ‖h₁‖ ratio | matrix entropy | over-mixing sensitivity |", "|---|---|---|---|"]
    nan, massive = float("nan"), P.name("massive_ratio")
    for l in range(sum(k.startswith(N.FLOW_ENTROPY + "_l") for k in flow)):
        rows.append(
            f"| {l} | {extreme.get(N.layer(massive, l), nan):.2f} | {flow[N.layer(N.FLOW_ENTROPY, l)]:.3f} "
            f"| {flow.get(N.layer(N.FLOW_MIXING, l), nan):.3g} |"
        )
    jump, drop = flow.get(N.NORM_JUMP_LAYER), flow.get(N.ENTROPY_DROP_LAYER)
    jump = "none (the ‖h₁‖ ratio rises at no layer)" if jump is None else f"layer {jump}"
    drop = "none (the entropy falls at no layer)" if drop is None else f"layer {drop}"
    return rows + ["", f"largest BOS-norm jump: {jump}; largest entropy drop: {drop}"]
