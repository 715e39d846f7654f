"""The one exception data preparation raises for bad input or settings."""


class DataPrepError(Exception):
    """Bad input, settings or output directory; the message is one line naming the file
    (and line) and what would be right. `sinklab prep` prints it and exits with status 2."""
