"""kv-eval's result of one model, its MLflow metrics, the markdown table and the figure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline import metric_names as N
from pipeline import plots
from pipeline.model.eviction import SINKS as MODES

LABELS = {"policy": "own scores", "keep": "sinks kept", "drop": "sinks dropped"}


def row_key(policy: str, sinks: str) -> str:
    """A row's name in kv_eval.json: ``h2o/keep``."""
    return f"{policy}/{sinks}"


def passkey_cell(passkey: dict | None, key: str) -> str:
    right = None if passkey is None else passkey["right"].get(key)
    return "n/a" if right is None else f"{right}/{len(passkey['trials'])}"


@dataclass(frozen=True)
class KvResult:
    """One model's kv-eval result: ``rows``, the (policy, sink setting) pairs streamed; ``entry``, its object in
    kv_eval.json (perplexities keyed by :func:`row_key`)."""

    rows: list[tuple[str, str]]
    entry: dict

    def to_json(self) -> dict:
        return self.entry

    def names(self) -> dict[str, str]:
        """Each row's name in the figure, ``h2o, sinks kept``; ``full cache``."""
        return {row_key(p, m): f"{p}, {LABELS[m]}" for p, m in self.rows} | {"full": "full cache"}

    def metrics(self) -> dict[str, float]:
        r = self.entry
        out = {} if r["full"] is None else {N.stream_perplexity("full"): r["full"]}
        for budget, b in r["budgets"].items():
            out |= {N.kv_perplexity(p, m, float(budget)): b["perplexity"][row_key(p, m)] for p, m in self.rows}
            out |= {
                N.kv_first_kept(p, float(budget)): 100 * x for p, x in b.get("first_kept", {}).items() if x is not None
            }
            for factor, p in b.get("passkey", {}).items():
                for key, value in (p or {}).get("accuracy", {}).items():
                    if value is not None:
                        out[N.kv_passkey(key.replace("/", "_"), float(budget), factor.removesuffix("x"))] = value
        return out


def markdown(results: dict[str, KvResult], first: int) -> str:
    budgets = [b for r in results.values() for b in r.entry["budgets"].values()]
    factors = list(dict.fromkeys(f for b in budgets for f in b.get("passkey", {})))
    modes = [m for m in MODES if any(sinks == m for r in results.values() for _, sinks in r.rows)]
    ratio = "keep" in modes and "drop" in modes
    lines = [
        f"Perplexity under each eviction policy: on its own scores, and with the sinks (the first {first} entries and "
        "the secondary sinks found on the text) forced in (kept) or out (dropped); first token kept = the share of "
        "(eviction, layer, kv head) whose cache still held the first entry on the policy's own scores; budget = cache "
        "entries as a share of the text"
        + (
            "; passkey f× = right answers / trials (depths × keys) on prompts of f × the budget's entries streamed "
            "through the same cache (full cache: the whole prompt cached)"
            if factors
            else ""
        ),
        "",
        "| model | tokens | full | budget | policy |"
        + "".join(f" {LABELS[m]} |" for m in modes)
        + (" first token kept |" if "policy" in modes else "")
        + (" dropped / kept |" if ratio else "")
        + "".join(f" passkey {f} {LABELS[m].removeprefix('sinks ')} |" for f in factors for m in modes),
        "|---|---|---|---|---|" + "---|" * (len(modes) + ("policy" in modes) + ratio + len(factors) * len(modes)),
    ]
    for name, result in results.items():
        r = result.entry
        full = "n/a" if r["full"] is None else f"{r['full']:.2f}"
        tokens = r["tokens"] if r["sequences"] == 1 else f"{r['sequences']} seqs, {r['tokens']}"
        for budget, b in r["budgets"].items():
            head = f"| {name} | {tokens} | {full} | {budget}% ({b['entries']}) |"
            passkey = [b.get("passkey", {}).get(f) for f in factors]
            for p in dict.fromkeys(p for p, _ in result.rows):
                ppl = [b["perplexity"][row_key(p, m)] for m in modes]
                cells = [f"{v:.2f}" for v in ppl]
                if "policy" in modes:
                    share = b.get("first_kept", {}).get(p)
                    cells.append("— (no eviction)" if share is None else f"{100 * share:.1f}%")
                if ratio:
                    cells.append(f"{b['perplexity'][row_key(p, 'drop')] / b['perplexity'][row_key(p, 'keep')]:.2f}")
                cells += [passkey_cell(pk, row_key(p, m)) for pk in passkey for m in modes]
                lines.append(f"{head} {p} |" + "".join(f" {c} |" for c in cells))
            if factors:
                empty = len(modes) + ("policy" in modes) + ratio
                full_cells = [passkey_cell(pk, "full") if i == 0 else "—" for pk in passkey for i in range(len(modes))]
                lines.append(f"{head} full cache |" + " — |" * empty + "".join(f" {c} |" for c in full_cells))
    return "\n".join(lines)


def figure(results: dict[str, KvResult], path: Path, by: str) -> Path:
    panels, perplexity = {}, [f"perplexity: {name}" for name in results]
    for name, result in results.items():
        r, label = result.entry, result.names()
        budgets = sorted(r["budgets"], key=float)
        keys = [row_key(p, m) for p, m in result.rows]
        x = [float(b) for b in budgets]
        curves = {label[k]: (x, [r["budgets"][b]["perplexity"][k] for b in budgets]) for k in keys}
        if r["full"] is not None:
            curves["full attention"] = (x, [r["full"]] * len(budgets))
        panels[f"perplexity: {name}"] = curves
        for factor in dict.fromkeys(f for b in budgets for f in r["budgets"][b].get("passkey", {})):
            points: dict[str, list] = {}
            for b in budgets:
                p = r["budgets"][b].get("passkey", {}).get(factor)
                for key, value in (p or {}).get("accuracy", {}).items():
                    if value is not None:
                        points.setdefault(label[key], []).append((float(b), value))
            if points:
                panels[f"passkey {factor} (% right): {name}"] = {
                    k: tuple(map(list, zip(*v))) for k, v in points.items()
                }
    return plots.curve_panels(
        panels, path, "KV-cache eviction", xlabel="cache budget (% of the text)", log_panels=perplexity, by=by
    )
