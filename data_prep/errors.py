"""The one exception of data preparation, and operating-system errors as one line."""

import errno


class DataPrepError(Exception):
    """Bad input, settings or output directory, in one line naming the file and what would be right."""


_ADVICE = {
    errno.ENOSPC: "the disk is full: free space or write elsewhere",
    errno.EDQUOT: "the disk quota is used up: free space or write elsewhere",
    errno.EFBIG: "the file would pass this system's file-size limit (see `ulimit -f`): raise it or write elsewhere",
    **dict.fromkeys((errno.EACCES, errno.EPERM), "no permission to write there: choose a writable directory"),
    errno.EROFS: "a read-only file system: choose a writable directory",
}


def os_error_line(exc: OSError, writing: str | None = None) -> str:
    """An operating-system error as one line: the path (else ``writing``), what happened and what would help."""
    where = f"{exc.filename}: " if exc.filename else (f"writing {writing}: " if writing else "")
    advice = _ADVICE.get(exc.errno)
    return f"{where}{exc.strerror or exc}" + (f" ({advice})" if advice else "")
