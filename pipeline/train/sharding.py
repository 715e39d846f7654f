"""The sharded strategies as Lightning strategies: DeepSpeed ZeRO (able to run on CPU) and FSDP2
(``fully_shard`` per block, the whole mesh data-parallel); docs/training.md, "Multi-process"."""

from __future__ import annotations

import os

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, StrategyRegistry
from lightning.pytorch.strategies import DeepSpeedStrategy as LightningDeepSpeedStrategy
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from pipeline.model import ConfigError, Transformer


class FSDP2Strategy(ModelParallelStrategy):
    """ModelParallelStrategy, every process data-parallel; checkpoints are one full file on rank 0, as DDP's."""

    def __init__(self, process_group_backend: str | None = None) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=False,
            process_group_backend=process_group_backend,
        )

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


class DeepSpeedStrategy(LightningDeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy, also on a CPU accelerator (gloo), with the loss divided by the
    accumulation steps once, not twice (docs/training.md, "Multi-process")."""

    def _on_cpu(self) -> bool:
        return isinstance(self.accelerator, CPUAccelerator)

    def setup_environment(self) -> None:
        if not self._on_cpu():
            return super().setup_environment()
        # DeepSpeed's CPU accelerator, without its optional shared-memory all-reduce op (a build of minutes)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator

        if get_accelerator().device_name() != "cpu":
            raise RuntimeError(
                f"the trainer runs on CPU but DeepSpeed chose its '{get_accelerator().device_name()}' "
                "accelerator; set DS_ACCELERATOR=cpu in the job's environment"
            )
        deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        if not self._on_cpu():
            return super().setup_distributed()
        # Lightning's version first validates CUDA device indices, which CPU devices lack
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    @property
    def root_device(self) -> torch.device:
        if not self._on_cpu():
            return super().root_device
        return torch.device("cpu", self.local_rank)  # DeepSpeed takes its device rank from the index

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        return super().backward(closure_loss, optimizer, *args, scale_wrt_gas=False, **kwargs)


for _stage in (None, 1, 2, 3):
    StrategyRegistry.register(
        "deepspeed" if _stage is None else f"deepspeed_stage_{_stage}",
        DeepSpeedStrategy,
        description="DeepSpeed ZeRO (SinkLab: CPU or CUDA)",
        override=True,
        **({} if _stage is None else {"stage": _stage}),
    )

if "fsdp2" not in StrategyRegistry:
    StrategyRegistry.register("fsdp2", FSDP2Strategy, description="FSDP2 (fully_shard) over every process")


def refuse_under_deepspeed(setting: str, why: str, strategy) -> None:
    """A setting DeepSpeed ZeRO cannot carry out: one line naming it, why, and what runs it."""
    if isinstance(strategy, LightningDeepSpeedStrategy):
        raise ConfigError(f"{setting}: under DeepSpeed ZeRO {why}; train it with --trainer.strategy ddp or fsdp2")


def refuse_zero_optimizer(name: str, strategy) -> None:
    """Muon and OrthoAdam under DeepSpeed ZeRO (DeepSpeed's own Muon is not wired into SinkLab)."""
    if name in ("muon", "orthoadam"):
        kind = "Muon (2-D matrices)" if name == "muon" else "OrthoAdam (per-tensor rotations)"
        why = f"a client optimizer gets flat 1-D partitions, which {kind} cannot update"
        refuse_under_deepspeed(f"optim.name={name}", why, strategy)


def shard_model(model: Transformer, mesh: DeviceMesh) -> None:
    """``fully_shard`` each block, then the root, over ``mesh``'s data-parallel dimension."""
    names = mesh.mesh_dim_names or ()
    if (tp := mesh["tensor_parallel"].size() if "tensor_parallel" in names else 1) > 1:
        raise ConfigError(
            f"trainer.strategy: tensor_parallel_size={tp}, but SinkLab "
            "has no tensor-parallel plan; use --trainer.strategy fsdp2 "
            "(or ModelParallelStrategy with tensor_parallel_size=1)"
        )
    dp_mesh = mesh["data_parallel"] if "data_parallel" in names else mesh
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
