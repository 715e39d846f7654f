"""Utilities below every part of SinkLab (standard library only): atomic files, where a command may write,
dotted mappings, one-line notices."""
