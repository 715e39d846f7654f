"""The LightningModule: a SinkLab Transformer, next-token loss, AdamW + warm-up/cosine.

The model is built in ``configure_model`` once the dataset is known (its vocabulary sets
``vocab_size``), which is also where DeepSpeed ZeRO-3 expects it and where FSDP2 shards it
(``--trainer.strategy fsdp2``, pipeline.train.sharding). Checkpoints carry
``hyper_parameters["model_config"]`` (a plain dict) and the weights under ``model.``, which is
what ``pipeline.model.load_pretrained`` reads.
"""
from __future__ import annotations

import math

import lightning as L
import torch
from torch.utils.checkpoint import checkpoint

from pipeline.model import ConfigError, ModelConfig, Transformer

from .loss import next_token_loss
from .optim import OptimConfig, build_optimizer, build_scheduler
from .sharding import shard_model


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


def _recomputed(forward):
    """The block's forward under non-reentrant activation checkpointing when gradients flow."""
    def run(*args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)
    return run


def _reset_partitioned(model: Transformer) -> None:
    """Under ZeRO-3 the model is built inside ``deepspeed.zero.Init``, which partitions each
    layer's parameters as soon as that layer exists, so the Transformer's own initialisation
    (run once all layers exist) met empty shards. Run it again on the gathered parameters, on
    rank 0, which then broadcasts them: the same RNG stream as an unsharded build, so the same
    initial weights as DDP."""
    import deepspeed
    import torch.distributed as dist

    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
        if dist.get_rank() == 0:
            model.reset_parameters()


class SinkLabModule(L.LightningModule):
    """model: every field of pipeline.model.ModelConfig (``--model.model.attention.op sigmoid``);
    ``vocab_size`` is taken from the dataset's manifest. optim: peak/min lr, warm-up, AdamW.
    compile: ``torch.compile`` each block (in place, so checkpoints keep their keys).
    activation_checkpointing: recompute each block in backward instead of keeping activations."""

    def __init__(self, model: ModelConfig | None = None, optim: OptimConfig | None = None,
                 compile: bool = False, activation_checkpointing: bool = False):
        super().__init__()
        self.model_config = model if model is not None else ModelConfig()
        self.optim = optim if optim is not None else OptimConfig()
        self.compile_blocks, self.activation_checkpointing = compile, activation_checkpointing
        self.model: Transformer | None = None
        self._step_loss, self._micro, self._val = 0.0, 0, []
        self.save_hyperparameters({"model_config": self.model_config.to_dict(),
                                   "optim": vars(self.optim).copy()})

    # ---- model ----------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.model is not None:
            return
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "manifest"):
            self.set_vocab(dm.manifest.vocab_size, dm.manifest.context_length)
        self.model = Transformer(self.model_config)
        if self._trainer is not None and getattr(self.trainer.strategy, "zero_stage_3", False):
            _reset_partitioned(self.model)
        for block in self.model.blocks:
            if self.activation_checkpointing:
                block.forward = _recomputed(block.forward)
            if self.compile_blocks:
                block.compile()
        if self.device_mesh is not None:  # set by ModelParallelStrategy (--trainer.strategy fsdp2)
            shard_model(self.model, self.device_mesh)

    def set_vocab(self, vocab_size: int, context_length: int) -> None:
        cfg = self.model_config.replace(vocab_size=vocab_size)
        if cfg.max_seq_len < context_length:
            raise ConfigError(f"model.model.max_seq_len={cfg.max_seq_len} is below the dataset's context length "
                             f"{context_length}; set it to at least {context_length}")
        self.model_config = cfg
        self.hparams["model_config"] = cfg.to_dict()

    # ---- loss -----------------------------------------------------------------------------
    def loss_start(self) -> int:
        """Index of the first logit that counts: the prefix-LM loss starts at token p+1
        (section 6; p = 1 is ordinary LM), i.e. at logit p-1 (0-based)."""
        cfg = self.model_config
        return cfg.prefix_len - 1 if cfg.mask == "prefix" and cfg.prefix_len > 1 else 0

    def lm_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        return next_token_loss(self.model, tokens, self.loss_start())

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.lm_loss(batch["input_ids"])
        self._step_loss = self._step_loss + loss.detach()
        self._micro += 1
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches == 0:
            self._end_of_step()
        return loss

    def _end_of_step(self) -> None:
        """On the last micro-batch of a step, before its optimizer update: the step's mean loss
        over micro-batches and ranks; a non-finite one stops every rank together (so no
        checkpoint of the broken weights is written)."""
        mean = self._step_loss / self._micro
        if self.trainer.world_size > 1:
            mean = self.trainer.strategy.reduce(mean, reduce_op="mean")
        value = float(mean)
        self._step_loss, self._micro = 0.0, 0
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"non-finite training loss ({value}) at step {self.global_step}: stopping; the last good "
                "checkpoint is kept. Start a new run directory with a lower model.optim.lr or a longer "
                "warm-up (a resume restores the optimizer's lr from the checkpoint), or check the data.")
        self.log("loss", value, prog_bar=True, logger=False)
        every = max(1, self.trainer.log_every_n_steps)
        if self.global_step % every == 0 and self.trainer.is_global_zero:
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            for logger in self.trainer.loggers:  # step s = loss of the weights after s updates
                logger.log_metrics({"train/loss": value, "train/lr": lr}, step=self.global_step)

    def on_train_epoch_start(self) -> None:
        self._step_loss, self._micro = 0.0, 0

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self._val.append(self.lm_loss(batch).detach())

    def on_validation_epoch_start(self) -> None:
        self._val = []

    def on_validation_epoch_end(self) -> None:
        if not self._val or self.trainer.sanity_checking:
            return
        mean = torch.stack(self._val).mean()
        if self.trainer.world_size > 1:
            mean = self.trainer.strategy.reduce(mean, reduce_op="mean")
        self.log("val_loss", mean, prog_bar=True, logger=False)
        if self.trainer.is_global_zero:
            for logger in self.trainer.loggers:
                logger.log_metrics({"val/loss": float(mean)}, step=self.global_step)

    # ---- optimisation ---------------------------------------------------------------------
    def configure_optimizers(self):
        optimizer = build_optimizer(self.model, self.optim)
        scheduler = build_scheduler(optimizer, self.optim, self.trainer.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint.setdefault("hyper_parameters", {})["model_config"] = self.model_config.to_dict()
