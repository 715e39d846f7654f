"""A run's checkpoints: its directory and lock, the step checkpoint callback, what may be kept and
resumed, and the ZeRO merge. Other parts import from here only (docs/training.md, "Resume")."""

from __future__ import annotations

from .integrity import NonFiniteLossError, checkpoint_problem, nonfinite_state
from .resume import check_resume, resume_path, start_over
from .rundir import CKPT_RE, RunDir, RunDirError, acquire_lock, release_lock
from .step import BesideTargetIO, StepCheckpoint, at_step_end, merge_zero_checkpoint

__all__ = [
    "BesideTargetIO",
    "CKPT_RE",
    "NonFiniteLossError",
    "RunDir",
    "RunDirError",
    "StepCheckpoint",
    "acquire_lock",
    "at_step_end",
    "check_resume",
    "checkpoint_problem",
    "merge_zero_checkpoint",
    "nonfinite_state",
    "release_lock",
    "resume_path",
    "start_over",
]
