"""Training layer: data module, Lightning module, callbacks, MLflow tracking, CLI."""
