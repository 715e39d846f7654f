"""Utilities every part of SinkLab needs, below all of them (standard library only): files
written whole or not at all (``sinklab_io.atomic``); the one rule for where a command may write
without replacing what a user wrote (``sinklab_io.outputs``); nested mappings flattened to dotted
keys (``sinklab_io.mappings``); one-line notices (``sinklab_io.notices``)."""
