"""A DeepSpeed ZeRO checkpoint directory merged into one Lightning checkpoint dict: the one way
SinkLab merges one (`sinklab consolidate`, pipeline.train.consolidate, and the final model of a
DeepSpeed run, pipeline.tracking.run_assets)."""

from __future__ import annotations

import contextlib
import io
import os


def merge_zero_checkpoint(ckpt_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> dict:
    """The one way SinkLab merges a DeepSpeed ZeRO checkpoint directory: Lightning's converter
    (DeepSpeed's ``zero_to_fp32`` over every rank's fp32 master partitions, plus Lightning's
    training state). Returns the Lightning checkpoint dict (``state_dict`` keys as the
    LightningModule's); ``out`` None: only the dict is wanted (the final model of `sinklab fit`),
    and the converter's own copy of it is written nowhere."""
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    if out is not None:
        return convert_zero_checkpoint_to_fp32_state_dict(ckpt_dir, out)
    with contextlib.redirect_stdout(io.StringIO()):  # its "Saving fp32 state dict to ..." line
        return convert_zero_checkpoint_to_fp32_state_dict(ckpt_dir, os.devnull)
