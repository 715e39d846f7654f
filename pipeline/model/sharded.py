"""Is this tensor sharded? One answer for every layer (torch only: training, checkpoints and tracking ask here)."""

from __future__ import annotations

from torch import Tensor, nn
from torch.distributed.tensor import DTensor


def is_sharded(t: Tensor) -> bool:
    """Whether this process holds only part of ``t`` outside its module's forward: a DeepSpeed
    ZeRO-3 parameter (an empty placeholder with ``ds_status``) or an FSDP2 shard (a DTensor)."""
    return hasattr(t, "ds_status") or isinstance(t, DTensor)


def has_sharded(module: nn.Module) -> bool:
    return any(is_sharded(p) for p in module.parameters())


def local_part(t: Tensor) -> Tensor:
    """The part of ``t`` this process holds: a ZeRO-3 partition, an FSDP2 shard, or all of it."""
    if hasattr(t, "ds_tensor"):
        return t.ds_tensor
    return t.to_local() if isinstance(t, DTensor) else t
