"""Training layer: data module, Lightning module, callbacks, `sinklab fit` (MLflow: pipeline.tracking;
checkpoints: pipeline.checkpoint)."""
