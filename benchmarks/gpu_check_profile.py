"""``gpu_check --profile``: a Lightning callback that runs ``torch.profiler`` over a fit's last steps, marks
each step's phases, and writes the trace (gzip) and a summary of where the time went (docs/gpu.md).

Wired through `sinklab fit` as ``--trainer.callbacks+={"class_path": "benchmarks.gpu_check_profile.StepProfile",
"init_args": {"dirpath": DIR}}`` (run from the repository, which holds ``benchmarks``).
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.gpu_check_trace import DEEPSPEED, MARK, STEPS, summarize, write_trace

HOOK_NAMES = re.compile(r"reduce|average_tensor|grad_hook|copy_grads|allreduce")


class StepProfile(Callback):
    """Profiles optimizer steps ``max_steps - steps + 1 .. max_steps`` on global rank 0 (the steps before: warm-up)."""

    def __init__(self, dirpath: str, steps: int = 3) -> None:
        if steps < 1:
            raise ValueError(f"StepProfile: steps={steps}: must be >= 1")
        self.dirpath, self.steps = Path(dirpath), steps
        self.prof, self.mark, self.wrapped, self.first = None, None, [], 0

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
