"""Step checkpoints: written at optimizer-step ends only, atomically, the newest ``keep_last`` kept; the ZeRO merge."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint

from sinklab_io.atomic import atomic_path, remove

from .integrity import NonFiniteLossError, nonfinite_state
from .rundir import RunDir


class BesideTargetIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, writing beside its target and renaming, never under $TMPDIR."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            sink = _Writes(f)
            try:
                torch.save(checkpoint, sink)
            except RuntimeError:  # torch's writer turns a failed write (a full disk) into its own error
                if sink.error is None:
                    raise
                raise OSError(sink.error.errno, sink.error.strerror) from None  # no temporary name in it


class _Writes:
    """A file's ``write`` that keeps the operating-system error torch's writer would hide."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.f.flush()


def at_step_end(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether this batch ended an optimizer step (not a micro-batch inside an accumulation)."""
    return (batch_idx + 1) % trainer.accumulate_grad_batches == 0


class StepCheckpoint(Checkpoint):
    """``step-NNNNNN.ckpt`` every ``every`` optimizer steps and at the end, renamed into place; keeps ``keep_last``."""

    def __init__(self, run_dir: Path, every: int, keep_last: int = 3):
        self.run_dir = RunDir(run_dir)
        self.every, self.keep_last = every, keep_last
        self.last_saved = -1
        self.uploader = None  # a remote_checkpoints.CheckpointUploader under run.log_checkpoints

    def save(self, trainer: L.Trainer) -> None:
        step = trainer.global_step
        # every rank checks what it holds (shards under ZeRO-3 / FSDP2); one bad rank stops all
        if trainer.strategy.reduce_boolean_decision(
            nonfinite_state(trainer.lightning_module, trainer.optimizers), all=False
        ):
            raise NonFiniteLossError(
                f"non-finite weights or optimizer state after step {step}: stopping without writing that "
                f"checkpoint; the ones in {self.run_dir.checkpoints} are kept. Start a new run directory with a "
                "lower optim.lr or a longer warm-up, or check the data."
            )
        final = self.run_dir.checkpoints / f"step-{step:06d}.ckpt"
        tmp = self.run_dir.checkpoints / f".{final.name}.partial"
        if trainer.is_global_zero:
            remove(tmp)
        trainer.strategy.barrier("sinklab_ckpt_pre")
        self.last_saved = step  # before saving, so the checkpoint's own state says it is saved
        try:
            trainer.save_checkpoint(tmp, weights_only=False)
        except OSError:  # a full disk, a file-size limit: no partial file stays behind
            remove(tmp)
            raise
        trainer.strategy.barrier("sinklab_ckpt_post")
        if trainer.is_global_zero:
            remove(final)
            os.replace(tmp, final)
            self.run_dir.prune(self.keep_last)
            if self.uploader is not None:
                self.uploader.upload(final, keep={p.name for _, p in self.run_dir.step_checkpoints()})
        trainer.strategy.barrier("sinklab_ckpt_done")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        due = self.every > 0 and step > 0 and step % self.every == 0 and step != self.last_saved
        if due and at_step_end(trainer, batch_idx):
            self.save(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_step != self.last_saved and trainer.global_step > 0:
            self.save(trainer)

    def state_dict(self) -> dict:
        return {"last_saved": self.last_saved}

    def load_state_dict(self, state: dict) -> None:
        self.last_saved = state.get("last_saved", -1)


def merge_zero_checkpoint(ckpt_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> dict:
    """A DeepSpeed ZeRO checkpoint directory merged by Lightning's converter (``zero_to_fp32`` and the training
    state): the checkpoint dict, also written to ``out``."""
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    if out is not None:
        return convert_zero_checkpoint_to_fp32_state_dict(ckpt_dir, out)
    with contextlib.redirect_stdout(io.StringIO()):  # its "Saving fp32 state dict to ..." line
        return convert_zero_checkpoint_to_fp32_state_dict(ckpt_dir, os.devnull)
