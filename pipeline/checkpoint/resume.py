"""Which checkpoint a start resumes (:func:`resume_path`) and what a resume may change
(:func:`check_resume`: not the model, optimiser, schedule or data order; docs/training.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_only

from pipeline.model.config import ARCH
from pipeline.model.loading import checkpoint_arch
from sinklab_io.mappings import flatten
from sinklab_io.notices import warn

from .integrity import checkpoint_problem
from .rundir import CKPT_RE, RunDir, RunDirError

# how a run is carried out, not what it is: a resume may change these optimiser fields
FREE_OPTIM_FIELDS = ("fused",)
NEW_RUN = "to train those weights under new settings, start a new run with --model.init {ckpt}"


def checkpoint_meta(path: Path) -> dict[str, Any]:
    """The checkpoint's step, hyper-parameters, data order and lr schedules, read memory-mapped."""
    path = Path(path)
    if path.is_dir():  # DeepSpeed's: the model-states file (rank 0's tensors, Lightning's training state)
        path = sorted((path / (path / "latest").read_text().strip()).glob("*model_states.pt"))[0]
    blob = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    return {
        "global_step": int(blob.get("global_step", 0)),
        "hyper_parameters": blob.get("hyper_parameters") or {},
        "data": (blob.get("SinkDataModule") or {}).get("order"),
        "lr_schedulers": blob.get("lr_schedulers") or [],
    }


def _differences(stored: dict, given: dict, prefix: str, free: tuple[str, ...] = ()) -> list[str]:
    old, new = flatten(stored, prefix + "."), flatten(given, prefix + ".")
    keys = sorted(k for k in old.keys() & new.keys() if k.rsplit(".", 1)[-1] not in free and old[k] != new[k])
    return [f"{k}={new[k]!r} (the checkpoint's: {old[k]!r})" for k in keys]


def check_resume(ckpt: Path, arch: dict, optim: dict, data_order: dict, max_steps: int) -> int:
    """Refuse a resume from ``ckpt`` that would change the run; returns the checkpoint's step."""
    meta = checkpoint_meta(ckpt)
    step, hparams = meta["global_step"], meta["hyper_parameters"]
    if any("lr_lambdas" not in s for s in meta["lr_schedulers"]):
        raise RunDirError(
            f"--resume {ckpt}: lr_schedulers holds an older schedule format (SequentialLR / CosineAnnealingLR), "
            f"no longer read; {NEW_RUN.format(ckpt=ckpt)}"
        )
    differ = (
        _differences(checkpoint_arch(hparams, str(ckpt)) or {}, arch, ARCH)
        + _differences(hparams.get("optim") or {}, optim, "optim", FREE_OPTIM_FIELDS)
        + _differences(meta["data"] or {}, data_order, "data")
    )
    if differ:
        raise RunDirError(
            f"--resume {ckpt}: a resume continues the checkpoint's run, but {'; '.join(differ)}; "
            f"resume with the checkpoint's values ({NEW_RUN.format(ckpt=ckpt)})"
        )
    if max_steps < step:
        raise RunDirError(
            f"--resume {ckpt}: trainer.max_steps={max_steps} is below the checkpoint's step {step}; "
            f"give at least {step} (a larger value extends the run)"
        )
    return step


def resume_path(run: RunDir, resume: str | None) -> str | None:
    """The checkpoint ``--resume`` names: ``auto``, the newest intact one (None: a fresh start);
    ``never``, None (refusing a run directory with checkpoints); else the path, if intact."""
    if resume == "auto":
        newest = run.newest_checkpoint(usable=_intact)
        return str(newest) if newest else None
    if resume in ("never", "", None):
        if run.step_checkpoints():
            raise RunDirError(
                f"{run.root}: already has checkpoints; continue it with --resume auto, or choose another --run-dir"
            )
        return None
    if not Path(resume).exists():
        raise RunDirError(f"--resume {resume}: no such checkpoint")
    if problem := checkpoint_problem(Path(resume)):
        raise RunDirError(
            f"--resume {resume}: damaged checkpoint: {problem}; give an older one, or "
            "--resume auto to take the newest intact one of the run directory"
        )
    return resume


def start_over(run: RunDir) -> str | None:
    """Rank 0, when --resume auto passed over every checkpoint: set the run's records aside and say
    so; returns the MLflow run id it had (a new one is opened)."""
    previous = run.mlflow_run_id()
    aside = run.set_aside()
    print(
        f"sinklab fit: no checkpoint of {run.root} can be resumed (each is named above): starting over from "
        f"step 0; what the run recorded so far is kept in {aside}"
        + (", and a new MLflow run is opened" if previous else ""),
        file=sys.stderr,
        flush=True,
    )
    return previous


def _intact(path: Path) -> bool:
    """For --resume auto: a damaged checkpoint, or one whose step is not its name's, is passed over with a warning."""
    problem = checkpoint_problem(path)
    if problem is None:
        named, stored = int(CKPT_RE.match(path.name).group(1)), checkpoint_meta(path)["global_step"]
        if named != stored:
            problem = f"it holds step {stored}, not step {named} as its name says (copied in from another run?)"
    if problem and rank_zero_only.rank == 0:
        warn("fit", f"passing over {path}: {problem}")
    return problem is None
