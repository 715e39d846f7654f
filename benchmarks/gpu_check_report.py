"""gpu-check's results: one row per case, the table and the goal ratios."""

from __future__ import annotations

from dataclasses import dataclass

GOALS = (  # (what, case, the case it is divided by or None for its MFU, goal)
    ("60m as shipped / compiled without DeepSpeed", "60m-shipped", "60m-compiled", 0.95),
    ("sigmoid (Triton tiles) / softmax", "small-sigmoid", "small-softmax", 0.8),
    ("sink logit / softmax", "small-sink-logit", "small-softmax", 0.95),
    ("1B MFU", "1b-", None, 0.55),  # the best of the 1b cases that passed (as shipped, the grid's cells)
)


@dataclass
class Result:
    case: str
    problem: str | None  # None: ok; else the first error line
    seconds: float
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_gib: float | None = None
    mode: str = "-"  # compiled, eager, eager after a compile failure; resumed
    skipped: str | None = None  # why it did not start


def goal_lines(results: list[Result]) -> list[str]:
    """The goals some of whose cases were asked for: ratio of tokens/s (or MFU), against the goal."""
    by_name, lines = {r.case: r for r in results}, []
    ones = [r for r in results if r.case.startswith("1b-") and r.mfu is not None and not r.problem]
    if ones:
        by_name["1b-"] = max(ones, key=lambda r: r.mfu)
    asked = set(by_name) | {"1b-" for r in results if r.case.startswith("1b-")}
    for what, case, base, goal in GOALS:
        if not {case, base} & asked:
            continue
        top, bottom = by_name.get(case), by_name.get(base)
        if base is None:
            value = top.mfu if top else None
            what += f" ({top.case})" if top else ""
        elif top and bottom and top.tokens_per_s and bottom.tokens_per_s:
            value = top.tokens_per_s / bottom.tokens_per_s
        else:
            value = None
        if value is None:
            cases = f"{case}{' and ' + base if base else ''}" if case != "1b-" else "no 1b case"
            lines.append(f"{what}: - (goal >= {goal:g}; {cases} give no figure)")
        else:
            lines.append(f"{what}: {value:.2f} (goal >= {goal:g}: {'met' if value >= goal else 'MISSED'})")
    return lines


def table(results: list[Result], width: int = 64) -> str:
    def cell(value, fmt):
        return "-" if value is None else fmt.format(value)

    rows = [("case", "result", "tokens/s", "MFU", "peak mem", "run", "time")]
    for r in results:
        verdict = "skipped: " + r.skipped if r.skipped else "ok" if r.problem is None else "FAIL " + r.problem
        rows.append(
            (
                r.case,
                verdict if len(verdict) <= width else verdict[: width - 3] + "...",
                cell(r.tokens_per_s, "{:,.0f}"),
                cell(r.mfu and 100 * r.mfu, "{:.1f}%"),
                cell(r.peak_gib, "{:.1f} GiB"),
                r.mode,
                f"{r.seconds:.0f} s",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) if i in (0, 1, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    failed = [r for r in results if r.problem]
    ran = [r for r in results if not r.skipped]
    lines += [
        f"{len(ran) - len(failed)} of {len(ran)} cases ok; {len(results) - len(ran)} skipped; "
        f"{sum(r.seconds for r in results):.0f} s"
    ]
    lines += goal_lines(results)
    lines += [f"{r.case}: {r.problem}" for r in failed]
    return "\n".join(lines)
