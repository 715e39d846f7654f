"""gpu-check's profiles: the trace ``StepProfile`` (gpu_check_profile.py) writes, gzipped within a size limit,
and its summary: the top kernels by device time and each step's phases (docs/gpu.md).

``python benchmarks/gpu_check_trace.py TRACE.json.gz`` summarises a trace again.
"""

from __future__ import annotations

import bisect
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

MARK = "sinklab::"  # the phases' record_function names: sinklab::forward, ...
PHASES = ("forward", "backward", "optimizer", "data")
PHASE_TEXT = {"data": "data and between steps"}
DEEPSPEED = "deepspeed::"  # the ZeRO optimizer's gradient hooks and reductions, wrapped while profiling
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
TRACE_LIMIT = 20 * 2**20  # bytes of the compressed trace
STEPS = "sinklabProfiledSteps"  # the trace's key for the optimizer steps it holds


def write_trace(trace: dict, path: Path, limit: int = TRACE_LIMIT) -> str | None:
    """The trace gzipped; over ``limit`` bytes, only its device events and marks (said in the returned note)."""
    data = gzip.compress(json.dumps(trace).encode(), compresslevel=6)
    note = None
    if len(data) > limit:
        kept = [e for e in trace.get("traceEvents", []) if e.get("cat") in (*DEVICE_CATS, "user_annotation")]
        data = gzip.compress(json.dumps({**trace, "traceEvents": kept}).encode(), compresslevel=9)
        if len(data) > limit:
            return f"trace: not written, over {limit / 2**20:.0f} MiB compressed even without its CPU ops"
        note = f"trace: over {limit / 2**20:.0f} MiB compressed; kept its device events and phase marks only"
    path.write_bytes(data)
    return note


def _self_times(ops: list[dict]) -> dict[str, list[float]]:
    """Each CPU op's time less that of the ops nested in it (one thread at a time): name -> [calls, us]."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_thread = defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list[list] = []  # [end, name, nested time, time]
        for e in events:
            while stack and stack[-1][0] <= e["ts"]:
                end, name, child, dur = stack.pop()
                out[name][1] += dur - child
            if stack:
                stack[-1][2] += e.get("dur", 0)
            out[e["name"]][0] += 1
            stack.append([e["ts"] + e.get("dur", 0), e["name"], 0.0, e.get("dur", 0)])
        for _, name, child, dur in stack:
            out[name][1] += dur - child
    return out


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def _outermost(marks: list[dict]) -> list[dict]:
    kept, end = [], float("-inf")
    for e in sorted(marks, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            kept.append(e)
            end = e["ts"] + e["dur"]
    return kept


def _inside(ts: float, ranges: list[dict], starts: list[float]) -> bool:
    """Whether ``ts`` falls in one of ``ranges`` (not overlapping, sorted; ``starts`` their starts)."""
    i = bisect.bisect_right(starts, ts) - 1
    return i >= 0 and ts <= ranges[i]["ts"] + ranges[i]["dur"]


def summarize(trace: dict, top: int = 15) -> str:
    """The top kernels by device time (CPU ops by self time where there is no device) and each phase per step."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    marks = [e for e in events if e.get("cat") == "user_annotation"]
    phases = {p: [e for e in marks if e["name"] == MARK + p] for p in PHASES}
    hooks = _outermost([e for e in marks if e["name"].startswith(DEEPSPEED)])
    kernels = [e for e in events if e.get("cat") in DEVICE_CATS]
    steps = max(trace.get(STEPS, len(phases["optimizer"])), 1)
    lines = [f"profiled optimizer steps: {steps}"]
    if kernels:
        totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for k in kernels:
            totals[k["name"]][0] += 1
            totals[k["name"]][1] += k["dur"]
        device_total = sum(t for _, t in totals.values())
        lines.append(f"top {top} kernels by device time ({device_total / 1e3 / steps:.2f} ms a step in all):")
    else:
        totals = _self_times([e for e in events if e.get("cat") == "cpu_op"])
        device_total = sum(t for _, t in totals.values())
        lines.append(f"no device kernels in the trace (CPU activities only); top {top} CPU ops by self time:")
    for name, (calls, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        share = 100 * us / device_total if device_total else 0
        lines.append(f"  {us / 1e3 / steps:9.3f} ms/step {share:5.1f}%  {int(calls):6d}x  {name[:90]}")
    launch = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}

    def device_in(ranges: list[dict]) -> float | None:
        if not kernels:
            return None
        ranges = sorted(ranges, key=lambda r: r["ts"])
        starts = [r["ts"] for r in ranges]
        at = (launch.get(k.get("args", {}).get("correlation"), -1) for k in kernels)
        return sum(k["dur"] for k, ts in zip(kernels, at) if _inside(ts, ranges, starts))

    lines.append("step split (wall ms a step on the host; device ms of the kernels launched in it):")
    rows = [(PHASE_TEXT.get(p, p), phases[p]) for p in PHASES] + [("DeepSpeed gradient hooks and reduction", hooks)]
    for label, ranges in rows:
        if not ranges:
            lines.append(f"  {label}: none in the trace")
            continue
        # the first profiled batch's loading came before the profile: data per batch, times batches
        factor = len(phases["forward"]) / len(ranges) if ranges is phases["data"] else 1
        wall = factor * sum(r["dur"] for r in ranges) / 1e3 / steps
        device = device_in(ranges)
        text = f"{factor * device / 1e3 / steps:.3f} ms device" if device is not None else "no device activity"
        lines.append(f"  {label}: {wall:.3f} ms wall, {text}")
    nccl = [k for k in kernels if "nccl" in k["name"].lower()]
    lines.append(
        f"  collective (NCCL) kernels: {sum(k['dur'] for k in nccl) / 1e3 / steps:.3f} ms device"
        if nccl
        else "  collective (NCCL) kernels: none in the trace"
    )
    if kernels and marks:
        start = min(r["ts"] for r in marks if r["name"].startswith(MARK))
        end = max(r["ts"] + r["dur"] for r in marks if r["name"].startswith(MARK))
        clipped = [(max(k["ts"], start), min(k["ts"] + k["dur"], end)) for k in kernels]
        busy = _union([(lo, hi) for lo, hi in clipped if hi > lo])
        lines.append(
            f"  device idle gaps: {(end - start - busy) / 1e3 / steps:.3f} ms of {(end - start) / 1e3 / steps:.3f}"
        )
    else:
        lines.append("  device idle gaps: none measurable (no device kernels in the trace)")
    return "\n".join(lines)


if __name__ == "__main__":
    with gzip.open(sys.argv[1], "rt") as f:
        print(summarize(json.load(f)))
