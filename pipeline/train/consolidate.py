"""`sinklab consolidate`: a DeepSpeed ZeRO checkpoint directory (what `sinklab fit` writes under
DeepSpeed) -> one fp32 Lightning checkpoint file.

    sinklab consolidate runs/paper-60m/checkpoints/step-020000.ckpt out/step-020000-fp32.ckpt

The file resumes on any strategy with AdamW's moments reset (docs/training.md, "Consolidating").
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from data_prep.errors import os_error_line
from pipeline.checkpoint import merge_zero_checkpoint
from pipeline.model.loading import checkpoint_arch
from sinklab_io.outputs import NotOurs, claim_file, output_path


def fresh_optimizer_state(hparams: dict, last_lr: list[float] | None) -> dict:
    """An AdamW state with SinkLab's parameter groups, empty moments, and the schedule's current
    lr (so a resumed run continues the cosine where it was, not at the peak)."""
    from pipeline.model import ModelConfig, Transformer

    from .optim import OptimConfig, build_optimizer

    model = Transformer(ModelConfig.from_dict(checkpoint_arch(hparams, "checkpoint")))
    state = build_optimizer(model, OptimConfig(**hparams.get("optim", {}))).state_dict()
    for i, group in enumerate(state["param_groups"]):
        group["initial_lr"] = group["lr"]
        if last_lr:
            group["lr"] = last_lr[i]
    return state


def consolidate(ckpt_dir: str | os.PathLike, out: str | os.PathLike) -> dict:
    """Writes ``out`` and returns the checkpoint written."""
    ckpt, out = Path(ckpt_dir), Path(out)
    if not (ckpt / "latest").is_file():
        raise FileNotFoundError(f"{ckpt}: not a DeepSpeed checkpoint directory (no 'latest' file)")
    if out.is_dir():  # checked before the merge, which takes minutes at 1B
        raise ValueError(
            f"{out}: is a directory; give the path of the .ckpt file to write, e.g. {out / (ckpt.name.removesuffix('.ckpt') + '-fp32.ckpt')}"
        )
    by = f"sinklab consolidate of {ckpt.resolve()}"  # never over another checkpoint's merge, nor a file of others
    claim_file(out, "OUT", by)
    with output_path(out, by) as tmp:
        result = merge_zero_checkpoint(ckpt, tmp)
        hparams = result.get("hyper_parameters") or {}
        if checkpoint_arch(hparams, str(ckpt)) is None:
            raise ValueError(
                f"{ckpt}: its client state has no hyper_parameters['arch']; it was not written by `sinklab fit`"
            )
        # buffers keep the training dtype (bf16 under bf16-mixed); the file is fp32 throughout
        result["state_dict"] = {k: v.float() if v.is_floating_point() else v for k, v in result["state_dict"].items()}
        if "optimizer_states" not in result:
            last_lr = (result.get("lr_schedulers") or [{}])[0].get("_last_lr")
            result["optimizer_states"] = [fresh_optimizer_state(hparams, last_lr)]
            result["sinklab"] = {"optimizer_moments": "reset", "source": str(ckpt)}
        torch.save(result, tmp)  # again: Lightning's file lacks the above
        if "loops" not in result:
            print(
                f"sinklab consolidate: {ckpt} holds no Lightning loop state; a run resumed from it counts "
                "steps (and reads data) from 0",
                file=sys.stderr,
            )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sinklab consolidate", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="DeepSpeed checkpoint directory (has a 'latest' file)")
    parser.add_argument("out", help="output .ckpt file (fp32, Lightning format)")
    args = parser.parse_args(argv)
    try:
        result = consolidate(args.checkpoint, args.out)
    except (FileNotFoundError, ValueError, NotOurs) as exc:
        print(f"sinklab consolidate: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a file-size limit: nothing half-written is left at OUT
        print(f"sinklab consolidate: {os_error_line(exc, writing=args.out)}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({sum(v.numel() for v in result['state_dict'].values()):,} fp32 values)")
    return 0
