"""`sinklab consolidate`: a DeepSpeed ZeRO checkpoint (a directory written by Lightning's
DeepSpeedStrategy, or by DeepSpeed itself) -> one fp32 Lightning checkpoint file.

    sinklab consolidate runs/paper-60m/checkpoints/step-020000.ckpt out/step-020000-fp32.ckpt

The weights come from DeepSpeed's own tool,
``deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``, which merges the
fp32 master partitions of every rank. Lightning's training state (global step, loops with the
data position, scheduler, callbacks, hyper-parameters with ``model_config``) is copied from the
client state DeepSpeed stored beside the weights. The result:

- loads with ``pipeline.model.load_pretrained`` and exports with ``sinklab export-hf``;
- resumes with ``sinklab fit --resume <file>`` on any strategy and world size. ZeRO keeps
  AdamW's moments sharded in a layout DeepSpeed's tool does not merge, so the resumed run
  starts them afresh (``sinklab.optimizer_moments = "reset"`` in the file); weights, step,
  schedule and data position continue.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch


def _tag_dir(ckpt: Path) -> tuple[Path, str]:
    latest = ckpt / "latest"
    if not latest.is_file():
        raise FileNotFoundError(f"{ckpt}: not a DeepSpeed checkpoint directory (no 'latest' file)")
    tag = latest.read_text().strip()
    return ckpt / tag, tag


def client_state(ckpt: Path) -> dict:
    """What Lightning (or any client) stored in the checkpoint besides DeepSpeed's own keys."""
    tag_dir, _ = _tag_dir(ckpt)
    files = sorted(tag_dir.glob("*mp_rank_00_model_states.pt"))
    if not files:
        raise FileNotFoundError(f"{tag_dir}: no mp_rank_00_model_states.pt")
    blob = torch.load(files[0], map_location="cpu", weights_only=False)
    ds_keys = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
               "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
               "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size",
               "ds_config", "ds_version", "shared_params", "param_groups", "ds_optimizer_state",
               "checkpoint_parallel_dimensions"}
    return {k: v for k, v in blob.items() if k not in ds_keys}


def fresh_optimizer_state(state_dict: dict, hparams: dict) -> list[dict]:
    """An AdamW state with SinkLab's parameter groups and empty moments."""
    from pipeline.model import ModelConfig, Transformer

    from .optim import OptimConfig, build_optimizer

    model = Transformer(ModelConfig.from_dict(hparams["model_config"]))
    optim = OptimConfig(**hparams.get("optim", {}))
    return [build_optimizer(model, optim).state_dict()]


def consolidate(ckpt_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    ckpt, out = Path(ckpt_dir), Path(out)
    _, tag = _tag_dir(ckpt)
    state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=tag)
    state = {k[len("_forward_module."):] if k.startswith("_forward_module.") else k: v.float()
             for k, v in state.items()}
    extra = client_state(ckpt)
    hparams = extra.get("hyper_parameters") or {}
    if "model_config" not in hparams:
        raise ValueError(f"{ckpt}: its client state has no hyper_parameters['model_config']; "
                         "it was not written by `sinklab fit`")
    result = dict(extra)
    result["state_dict"] = state
    if "optimizer_states" not in result:
        result["optimizer_states"] = fresh_optimizer_state(state, hparams)
        last_lr = (result.get("lr_schedulers") or [{}])[0].get("_last_lr")
        for i, group in enumerate(result["optimizer_states"][0]["param_groups"]):
            group["initial_lr"] = group["lr"]
            if last_lr:  # continue the schedule where it was, not at the peak
                group["lr"] = last_lr[i]
        result["sinklab"] = {"optimizer_moments": "reset", "source": str(ckpt)}
    if "loops" not in result:
        print(f"sinklab consolidate: {ckpt} holds no Lightning loop state; a run resumed from it counts "
              "steps (and reads data) from 0", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    torch.save(result, tmp)
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sinklab consolidate", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="DeepSpeed checkpoint directory (has a 'latest' file)")
    parser.add_argument("out", help="output .ckpt file (fp32, Lightning format)")
    args = parser.parse_args(argv)
    try:
        path = consolidate(args.checkpoint, args.out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"sinklab consolidate: {exc}", file=sys.stderr)
        return 2
    n = sum(v.numel() for v in torch.load(path, map_location="cpu", weights_only=False)["state_dict"].values())
    print(f"wrote {path} ({n:,} fp32 parameters)")
    return 0
