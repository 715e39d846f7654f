"""Checkpoints of a run, in one room: the run directory and its lock (``rundir``), the step
checkpoint callback (``step``), what makes a checkpoint fit to keep and resume from
(``integrity``), which checkpoint a start resumes and what a resume may change (``resume``),
and a DeepSpeed ZeRO checkpoint merged into one (``consolidate``; the command is pipeline.train.consolidate). Other parts import
from here only; nothing outside this package writes or chooses a step checkpoint."""

from __future__ import annotations

from .consolidate import merge_zero_checkpoint
from .integrity import NonFiniteLossError, checkpoint_problem, nonfinite_state
from .resume import check_resume, resume_path
from .rundir import CKPT_RE, RunDir, RunDirError, acquire_lock, checkpoint_name, release_lock
from .step import StepCheckpoint, at_step_end

__all__ = [
    "CKPT_RE",
    "NonFiniteLossError",
    "RunDir",
    "RunDirError",
    "StepCheckpoint",
    "acquire_lock",
    "at_step_end",
    "check_resume",
    "checkpoint_name",
    "checkpoint_problem",
    "merge_zero_checkpoint",
    "nonfinite_state",
    "release_lock",
    "resume_path",
]
