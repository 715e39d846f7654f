"""FSDP2 (PyTorch's ``fully_shard``) through Lightning's ModelParallelStrategy.

``--trainer.strategy fsdp2`` (registered here with Lightning's StrategyRegistry) shards
parameters, gradients and AdamW's moments over every process. Each block is one unit, gathered just before it runs and
freed after; the root unit holds the embeddings, final norm and head. SinkLab has no
tensor-parallel plan, so the whole mesh is data-parallel.
"""
from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from pipeline.model import ConfigError, Transformer


class FSDP2Strategy(ModelParallelStrategy):
    """ModelParallelStrategy with every process in one data-parallel (sharding) group and no
    tensor parallelism. Checkpoints are gathered into one file on rank 0 (full state dict), so
    they are ``step-NNNNNN.ckpt`` files like DDP's: resumable on any strategy and world size,
    loadable with ``load_pretrained`` and exportable without consolidation."""

    def __init__(self, process_group_backend: str | None = None) -> None:
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, save_distributed_checkpoint=False,
                         process_group_backend=process_group_backend)

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


if "fsdp2" not in StrategyRegistry:
    StrategyRegistry.register("fsdp2", FSDP2Strategy, description="FSDP2 (fully_shard) over every process")


def shard_model(model: Transformer, mesh: DeviceMesh) -> None:
    """Apply ``fully_shard`` to each block, then to the root, over ``mesh``'s data-parallel
    dimension."""
    names = mesh.mesh_dim_names or ()
    tp = mesh["tensor_parallel"].size() if "tensor_parallel" in names else 1
    if tp > 1:
        raise ConfigError(f"trainer.strategy: tensor_parallel_size={tp}, but SinkLab "
                          "has no tensor-parallel plan; use --trainer.strategy fsdp2 "
                          "(or ModelParallelStrategy with tensor_parallel_size=1)")
    dp_mesh = mesh["data_parallel"] if "data_parallel" in names else mesh
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
