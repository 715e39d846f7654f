"""``gpu_check --profile``: a Lightning callback that runs ``torch.profiler`` over a fit's last steps, marks
each step's phases, and writes the trace (gzip) and a summary of where the time went (docs/gpu.md).

Wired through `sinklab fit` as ``--trainer.callbacks+={"class_path": "benchmarks.gpu_check_profile.StepProfile",
"init_args": {"dirpath": DIR}}``; ``python benchmarks/gpu_check_profile.py TRACE`` summarises a trace again.
"""

from __future__ import annotations

import gzip
import inspect
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

MARK = "sinklab::"  # the phases' record_function names: sinklab::forward, ...
PHASES = ("forward", "backward", "optimizer", "data")
PHASE_TEXT = {"data": "data and between steps"}
DEEPSPEED = "deepspeed::"  # the ZeRO optimizer's gradient hooks and reductions, wrapped while profiling
HOOK_NAMES = re.compile(r"reduce|average_tensor|grad_hook|copy_grads|allreduce")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
TRACE_LIMIT = 20 * 2**20  # bytes of the compressed trace
STEPS = "sinklabProfiledSteps"  # the trace's key for the optimizer steps it holds


class StepProfile(Callback):
    """Profiles optimizer steps ``max_steps - steps + 1 .. max_steps`` on global rank 0 (the steps before: warm-up)."""

    def __init__(self, dirpath: str, steps: int = 3) -> None:
        if steps < 1:
            raise ValueError(f"StepProfile: steps={steps}: must be >= 1")
        self.dirpath, self.steps = Path(dirpath), steps
        self.prof, self.mark, self.wrapped, self.first = None, None, [], 0

    # ---- the phases ----
    def _enter(self, phase: str | None) -> None:
        if self.prof is None:
            return
        if self.mark is not None:
            self.mark.__exit__(None, None, None)
        self.mark = None
        if phase is not None:
            self.mark = torch.profiler.record_function(MARK + phase)
            self.mark.__enter__()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.prof is None and trainer.is_global_zero and trainer.global_step >= trainer.max_steps - self.steps:
            self.first = trainer.global_step
            self._start(trainer)
        self._enter("forward")

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._enter("backward")

    def on_after_backward(self, trainer, pl_module) -> None:
        self._enter(None)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._enter("optimizer")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.prof is not None and trainer.global_step >= trainer.max_steps:
            self._stop(trainer)
        else:
            self._enter("data")

    def on_train_end(self, trainer, pl_module) -> None:
        self._stop(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._stop(trainer)

    # ---- the profiler ----
    def _start(self, trainer) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if trainer.strategy.root_device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._wrap_deepspeed(trainer.strategy)
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.start()

    def _wrap_deepspeed(self, strategy) -> None:
        """Each gradient hook and reduction method of the ZeRO optimizer under a record_function of its name."""
        engine = getattr(strategy, "deepspeed_engine", None)
        for owner in (engine, getattr(engine, "optimizer", None)):
            if owner is None:
                continue
            for name, _ in inspect.getmembers(type(owner), inspect.isfunction):
                if HOOK_NAMES.search(name) and name not in vars(owner):
                    setattr(owner, name, _marked(getattr(owner, name), DEEPSPEED + name))
                    self.wrapped.append((owner, name))

    def _stop(self, trainer) -> None:
        if self.prof is None:
            return
        self._enter(None)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.prof.stop()
        for owner, name in self.wrapped:
            delattr(owner, name)
        self.dirpath.mkdir(parents=True, exist_ok=True)
        raw = self.dirpath / "trace.json"
        self.prof.export_chrome_trace(str(raw))
        self.prof, self.wrapped = None, []
        trace = json.loads(raw.read_text()) | {STEPS: trainer.global_step - self.first}
        raw.unlink()
        note = write_trace(trace, self.dirpath / "trace.json.gz")
        text = summarize(trace) + (f"\n{note}" if note else "")
        (self.dirpath / "summary.txt").write_text(text + "\n")
        print(f"sinklab profile: trace and summary in {self.dirpath}", flush=True)


def _marked(method, name: str):
    def marked(*args, **kwargs):
        with torch.profiler.record_function(name):
            return method(*args, **kwargs)

    return marked


def write_trace(trace: dict, path: Path, limit: int = TRACE_LIMIT) -> str | None:
    """The trace gzipped; over ``limit`` bytes, only its device events and marks (said in the returned note)."""
    data = gzip.compress(json.dumps(trace).encode(), compresslevel=6)
    note = None
    if len(data) > limit:
        kept = [e for e in trace.get("traceEvents", []) if e.get("cat") in (*DEVICE_CATS, "user_annotation")]
        data = gzip.compress(json.dumps({**trace, "traceEvents": kept}).encode(), compresslevel=9)
        note = f"trace: over {limit / 2**20:.0f} MiB compressed; kept its device events and phase marks only"
        if len(data) > limit:
            data = data[:0]
            note = f"trace: not written, over {limit / 2**20:.0f} MiB compressed even without its CPU ops"
    if data:
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


def _inside(ts: float, ranges: list[dict]) -> bool:
    return any(r["ts"] <= ts <= r["ts"] + r["dur"] for r in ranges)


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
        picked = [k["dur"] for k in kernels if _inside(launch.get(k.get("args", {}).get("correlation"), -1), ranges)]
        return sum(picked)

    lines.append("step split (wall ms a step on the host; device ms of the kernels launched in it):")
    rows = [(PHASE_TEXT.get(p, p), phases[p]) for p in PHASES] + [("DeepSpeed gradient hooks and reduction", hooks)]
    for label, ranges in rows:
        if not ranges:
            lines.append(f"  {label}: none in the trace")
            continue
        wall = sum(r["dur"] for r in ranges) / 1e3 / steps
        device = device_in(ranges)
        text = f"{device / 1e3 / steps:.3f} ms device" if device is not None else "no device activity"
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
        busy = _union([(max(k["ts"], start), min(k["ts"] + k["dur"], end)) for k in kernels if k["ts"] < end])
        lines.append(
            f"  device idle gaps: {(end - start - busy) / 1e3 / steps:.3f} ms of {(end - start) / 1e3 / steps:.3f}"
        )
    else:
        lines.append("  device idle gaps: none measurable (no device kernels in the trace)")
    return "\n".join(lines)


if __name__ == "__main__":
    with gzip.open(sys.argv[1], "rt") as f:
        print(summarize(json.load(f)))
