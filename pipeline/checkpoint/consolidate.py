"""A DeepSpeed ZeRO checkpoint directory merged into one Lightning checkpoint dict."""

from __future__ import annotations

import contextlib
import io
import os


def merge_zero_checkpoint(ckpt_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> dict:
    """Lightning's converter (``zero_to_fp32`` and the training state): the checkpoint dict, also written to ``out``."""
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    if out is not None:
        return convert_zero_checkpoint_to_fp32_state_dict(ckpt_dir, out)
    with contextlib.redirect_stdout(io.StringIO()):  # its "Saving fp32 state dict to ..." line
        return convert_zero_checkpoint_to_fp32_state_dict(ckpt_dir, os.devnull)
