"""Writes a ZeRO checkpoint with DeepSpeed itself on CPU: 2 processes over gloo.

    python ds_zero_worker.py DATASET OUT_DIR STAGE

Lightning's DeepSpeedStrategy needs CUDA, so this drives DeepSpeed's engine directly the way
the strategy does (the LightningModule is the engine's module, Lightning's training state goes
in as client_state, tag "checkpoint"). The shared-memory all-reduce op (deepspeed_shm_comm,
a ~3 minute C++ build on first use) is marked unavailable so DeepSpeed uses plain gloo.
"""
import os
import sys

os.environ["DS_ACCELERATOR"] = "cpu"

import torch
import torch.multiprocessing as mp


def worker(rank: int, world: int, port: int, dataset: str, out: str, stage: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
    deepspeed.init_distributed(dist_backend="gloo")

    from data_prep.dataset import PackedSplit, load_manifest
    from pipeline.model import ModelConfig, Transformer
    from pipeline.train.module import SinkLabModule
    from pipeline.train.optim import OptimConfig, build_optimizer, build_scheduler

    manifest = load_manifest(dataset)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("micro", vocab_size=manifest.vocab_size)
    module = SinkLabModule(cfg, OptimConfig(lr=3e-3, min_lr=3e-4, warmup_steps=1))
    module.model = Transformer(cfg)
    ds_config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                 "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
                 "gradient_clipping": 1.0}
    optimizer = build_optimizer(module, module.optim)
    scheduler = build_scheduler(optimizer, module.optim, max_steps=12)
    engine, _, _, scheduler = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                                                   config=ds_config)
    split = PackedSplit(dataset, "train")
    steps = 3
    for step in range(steps):
        tokens = torch.as_tensor(split.take([4 * step + 2 * rank, 4 * step + 2 * rank + 1]))
        loss = engine.module.lm_loss(tokens)
        engine.backward(loss)
        engine.step()
    import lightning

    # what Lightning's DeepSpeedStrategy.save_checkpoint passes (minus the loop state)
    client = {"hyper_parameters": dict(module.hparams), "global_step": steps, "epoch": 0,
              "lr_schedulers": [scheduler.state_dict()], "pytorch-lightning_version": lightning.__version__}
    engine.save_checkpoint(out, tag="checkpoint", client_state=client)
    # fp32 everywhere on CPU: the module holds the master weights (ZeRO-3: once gathered)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage == 3):
        if rank == 0:
            torch.save({k: v.detach().clone() for k, v in engine.module.state_dict().items()},
                       os.path.join(out, "reference_state.pt"))
    torch.distributed.barrier()


if __name__ == "__main__":
    dataset, out, stage = sys.argv[1], sys.argv[2], int(sys.argv[3])
    port = int(sys.argv[4]) if len(sys.argv) > 4 else 29533
    mp.spawn(worker, args=(2, port, dataset, out, stage), nprocs=2)
