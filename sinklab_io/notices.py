"""One-line notices on stderr: what a command tells a user without stopping."""

from __future__ import annotations

import os
import sys

_RANK_VARS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
_told: set[str] = set()


def notice(message: str, once: bool = False) -> None:
    """``sinklab: <message>`` from rank 0 only; with ``once``, a message already given is not repeated."""
    line = f"sinklab: {message}"
    if (once and line in _told) or any(os.environ.get(v, "0") != "0" for v in _RANK_VARS):
        return
    _told.add(line)
    print(line, file=sys.stderr, flush=True)


def warn(command: str, text: str) -> None:
    """``sinklab <command>: warning: <text>``: the command goes on."""
    print(f"sinklab {command}: warning: {text}", file=sys.stderr, flush=True)


def why(exc: Exception) -> str:
    """An exception as part of one line: its type and the first line of its message."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
