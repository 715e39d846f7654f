"""Files and directories that appear whole or not at all: each is written under a hidden
temporary name beside its target and renamed into place (one rename within a directory is
atomic on POSIX), so a crash or Ctrl-C never leaves half a file where a reader looks.

The one home of this rule for all of SinkLab: ``sinklab_io`` sits below every other part
(``data_prep``, ``pipeline``, ``cluster`` all import it) and needs nothing but the standard library.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def remove(path: str | os.PathLike) -> None:
    """Delete a file or a whole directory (a DeepSpeed checkpoint is one); nothing if absent."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary sibling of ``path`` (same suffix, for writers that go by it, e.g. savefig) to
    write; renamed to ``path`` when the block ends, removed if it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: str | os.PathLike, data: str | bytes | memoryview) -> Path:
    """``data`` (text as UTF-8) at ``path``, whole or not at all."""
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
    return Path(path)


MARKER = ".sinklab-output.json"  # what atomic_directory wrote into a directory, and for which writer


class NotOurs(FileExistsError):
    """The target directory holds files that no earlier run of the same writer put there."""


def _foreign(out: Path, kind: str) -> list[str]:
    """The entries of ``out`` that no earlier ``atomic_directory(out, kind)`` wrote (its marker lists those)."""
    names = sorted(p.name for p in out.iterdir())
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return names
    ours = set(marker.get("files", [])) | {MARKER} if marker.get("kind") == kind else set()
    return [name for name in names if name not in ours]


@contextmanager
def atomic_directory(out_dir: str | os.PathLike, kind: str) -> Iterator[Path]:
    """A temporary sibling directory to fill; on success it takes the place of ``out_dir``, on an
    error it is removed, so a half-written directory never stands at ``out_dir``.

    Nothing a user wrote is replaced: an existing ``out_dir`` must be empty or hold exactly what an
    earlier write of the same ``kind`` left (a marker file lists it); anything else raises
    :class:`NotOurs` before any work. The current directory is never replaced."""
    out = Path(out_dir).resolve()
    if Path.cwd().resolve().is_relative_to(out):
        raise NotOurs(
            f"{out_dir}: is the current directory (or holds it); name a new directory below it, e.g. {Path(out_dir) / 'export'}"
        )
    if out.exists() and not out.is_dir():
        raise NotOurs(f"{out_dir}: is a file; name a new directory")
    if out.is_dir() and (foreign := _foreign(out, kind)):
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise NotOurs(
            f"{out_dir}: holds {shown}, which this command did not write; nothing was changed. "
            "Name a new or empty directory"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        files = sorted(p.name for p in tmp.iterdir())
        (tmp / MARKER).write_text(json.dumps({"kind": kind, "files": files}) + "\n")
        if out.exists():  # empty, or an earlier output of this writer: swap, then drop the old one
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
