"""One `sinklab prep` invocation: the output folder claimed first, an error (exit 2) or interruption (exit 130)
as one line, and what the invocation added removed again (docs/data_prep.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

from data_prep.errors import DataPrepError, os_error_line
from data_prep.prepare import STAGING, claim_output_dir
from sinklab_io.outputs import Additions

T = TypeVar("T")


def run_into(out: str, work: Callable[[], T], resumable: bool) -> tuple[int, T | None]:
    """``work()`` writing into ``out``: (0, its result), or (exit status, None) after one line on stderr."""
    additions = Additions(out)
    try:
        claim_output_dir(out)
        return 0, work()
    except (DataPrepError, OSError) as exc:
        if isinstance(exc, OSError) and _inside(exc.filename, out):  # that file is removed below: name the folder
            exc = OSError(exc.errno, exc.strerror)
        line = str(exc) if isinstance(exc, DataPrepError) else os_error_line(exc, writing=out)
        undone = additions.remove()
        print(f"sinklab prep: error: {line}" + (f"; {undone}" if undone else ""), file=sys.stderr)
        return 2, None
    except KeyboardInterrupt:
        staging = os.path.join(out, STAGING)
        if resumable and os.path.isdir(staging):
            print(
                "sinklab prep: interrupted; run the same command again to resume from the chunks already "
                f"finished (kept in {staging})",
                file=sys.stderr,
            )
        else:
            undone = additions.remove()
            print("sinklab prep: interrupted" + (f"; {undone}" if undone else ""), file=sys.stderr)
        return 130, None
    except BaseException:
        additions.remove()
        raise


def _inside(path: object, folder: str) -> bool:
    return isinstance(path, str | os.PathLike) and os.path.abspath(path).startswith(os.path.abspath(folder) + os.sep)
