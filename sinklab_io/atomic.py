"""Files that appear whole or not at all: written under a hidden temporary name beside the target and renamed
into place (atomic on POSIX)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
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
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def publish(target: Path, fill: Callable[[Path], Path]) -> Path:
    """``target`` whole or not at all: what ``fill(tmp)`` writes and returns (a file or folder) inside a temporary
    sibling folder of ``target``, renamed into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        made = fill(tmp)
        try:
            os.replace(made, target)
        except OSError:  # another process published it first
            if not target.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
