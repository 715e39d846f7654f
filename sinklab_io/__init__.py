"""Utilities every part of SinkLab needs, below all of them (standard library only): files and
directories written whole or not at all (``sinklab_io.atomic``); nested mappings flattened to
dotted keys (``sinklab_io.mappings``)."""
