"""SinkLab training layer: model, metrics, training, analysis and experiments."""
