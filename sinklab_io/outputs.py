"""May a command write here? The one rule (docs/training.md, "What each command writes"): a file is written only
where none stands or where SinkLab's own stands unchanged (size and sha256 as ``.sinklab-output.json`` records them;
above 64 MiB, size and mtime; with ``keep``, the hash of what lies outside that region), and replaced only by the
writer (``by``: the command and its subject) that wrote it. A command calls :func:`claim` before any work, writes
through :func:`write_output` / :func:`output_path`, and fills a folder in place under :class:`Additions`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .atomic import atomic_path, atomic_write, remove

MARKER = ".sinklab-output.json"  # {"files": {name: {"by": writer, "size": n, "sha256": h}}}
# a file with a kept region: {"by": writer, "keep": [start, end], "outside_sha256": h}
HASHED = 64 << 20  # larger files (checkpoints) are told by size and modification time instead of a hash


class NotOurs(FileExistsError):
    """The target holds files that SinkLab did not write (or that changed since it did)."""


def _recorded(directory: Path) -> dict[str, dict]:
    """The marker's entries; a marker of any other shape vouches for nothing."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(files, dict):
        return {}
    return {name: entry for name, entry in files.items() if isinstance(entry, dict)}


def _fingerprint(path: Path, keep: list[str] | None = None) -> dict:
    """Size and content hash (a copy keeps both); above HASHED, size and modification time; with ``keep``, the hash
    of what lies outside that region (None where it is not one)."""
    if keep:
        rest = outside(path.read_bytes(), keep)
        return {"keep": list(keep), "outside_sha256": None if rest is None else hashlib.sha256(rest).hexdigest()}
    stat = path.stat()
    if stat.st_size > HASHED:
        return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    with open(path, "rb") as f:
        return {"size": stat.st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


def outside(data: bytes, keep: list[str]) -> bytes | None:
    """``data`` less what lies between the two marker lines ``keep`` (None unless each stands once, in order)."""
    start, end = (m.encode() for m in keep)
    if data.count(start) != 1 or data.count(end) != 1 or data.index(start) > data.index(end):
        return None
    return data[: data.index(start) + len(start)] + data[data.index(end) :]


def _ours(path: Path, entry: dict | None, by: str | None = None) -> bool:
    if entry is None or (by is not None and entry.get("by") != by) or not path.is_file() or path.is_symlink():
        return False
    found = _fingerprint(path, entry.get("keep"))
    return None not in found.values() and all(entry.get(k) == v for k, v in found.items())


def theirs(directory: str | os.PathLike, names: Iterable[str], by: str | None = None) -> list[str]:
    """Of ``names`` in ``directory``, those that stand there and that ``by`` may not replace."""
    directory = Path(directory)
    existing = [name for name in names if os.path.lexists(directory / name)]
    if not existing:
        return []
    recorded = _recorded(directory)
    return [name for name in existing if not _ours(directory / name, recorded.get(name), by)]


def written(directory: str | os.PathLike) -> list[Path]:
    """The files in ``directory`` that SinkLab wrote, unchanged since: what a command uploads as its output."""
    directory = Path(directory)
    recorded = _recorded(directory)
    return [directory / n for n in sorted(recorded) if (directory / n).is_file() and _ours(directory / n, recorded[n])]


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _whose(directory: Path, names: list[str]) -> str:
    """Who wrote ``names``, as a clause: the user where any is not sinklab's unchanged, else the other writers."""
    recorded = _recorded(directory)
    writers = [recorded[name]["by"] for name in names if _ours(directory / name, recorded.get(name))]
    if len(writers) < len(names):
        return "which sinklab did not write (or which changed since)"
    others = " and ".join(sorted(set(map(str, writers))))
    return f"which {others} wrote (a command replaces only its own output for the same subject)"


def claim(out_dir: str | os.PathLike, names: Iterable[str], what: str = "--out", by: str | None = None) -> Path:
    """``out_dir`` as a Path; refused (:class:`NotOurs`) where it is a file or where writing ``names`` into it
    would replace a file that ``by`` may not replace."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotOurs(f"{what} {out}: is a file; name a directory (new, or one that sinklab wrote into)")
    if out.is_dir() and (foreign := theirs(out, names, by)):
        raise NotOurs(
            f"{what} {out}: already holds {_shown(foreign)}, {_whose(out, foreign)}; "
            "nothing was changed. Name a new directory, or move those files away"
        )
    return out


def claim_file(path: str | os.PathLike, what: str, by: str | None = None) -> Path:
    """:func:`claim` for a command whose output is one file ``path``."""
    path = Path(path)
    if path.is_dir():
        raise NotOurs(f"{what} {path}: is a directory; give the path of the file to write")
    if foreign := theirs(path.parent, [path.name], by):
        raise NotOurs(
            f"{what} {path}: {foreign[0]} exists, {_whose(path.parent, foreign)}; "
            "nothing was changed. Give a new file name, or move that file away"
        )
    return path


def _record(directory: Path, entries: dict[str, str], keep: list[str] | None = None) -> None:
    recorded = _recorded(directory)
    for name, by in entries.items():
        recorded[name] = {"by": by, **_fingerprint(directory / name, keep)}
    atomic_write(directory / MARKER, json.dumps({"files": recorded}, indent=1) + "\n")


@contextmanager
def output_path(path: str | os.PathLike, by: str) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write, renamed into place as ``by``'s (:func:`claim_file`'s rule)."""
    path = claim_file(path, by, by)
    with atomic_path(path) as tmp:
        yield tmp
    _record(path.parent, {path.name: by})


def write_output(
    path: str | os.PathLike, data: str | bytes | memoryview, by: str, keep: list[str] | None = None
) -> Path:
    """``data`` (text as UTF-8) at ``path`` under :func:`output_path`'s rule."""
    path = atomic_write(claim_file(path, by, by), data)
    _record(path.parent, {path.name: by}, keep)
    return path


def claim_directory(out_dir: str | os.PathLike, kind: str) -> Path:
    """``out_dir`` resolved; refused (:class:`NotOurs`) where :func:`atomic_directory` would not replace it: a file,
    the current directory (or one above it), a directory holding anything but an earlier ``kind`` output, unchanged."""
    out = Path(out_dir).resolve()
    if Path.cwd().resolve().is_relative_to(out):
        raise NotOurs(
            f"{out_dir}: is the current directory (or holds it); name a new directory below it, e.g. {Path(out_dir) / 'export'}"
        )
    if out.exists() and not out.is_dir():
        raise NotOurs(f"{out_dir}: is a file; name a new directory")
    if out.is_dir():
        recorded = _recorded(out)
        foreign = sorted(p.name for p in out.iterdir() if p.name != MARKER and not _ours(p, recorded.get(p.name), kind))
        if foreign:
            raise NotOurs(
                f"{out_dir}: holds {_shown(foreign)}, which this command did not write; nothing was changed. "
                "Name a new or empty directory"
            )
    return out


@contextmanager
def atomic_directory(out_dir: str | os.PathLike, kind: str) -> Iterator[Path]:
    """A temporary sibling directory to fill, put in the place of ``out_dir`` on success and removed on an error;
    refused as :func:`claim_directory` says (checked again: the directory may have changed since)."""
    out = claim_directory(out_dir, kind)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        _record(tmp, {p.name: kind for p in tmp.iterdir() if p.name != MARKER})
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


class Additions:
    """What one command adds under ``out`` from now on, to remove when it fails: the highest folder it creates as a
    whole, else each new entry in ``out``; what stood there before is never touched."""

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        top = self.out
        while not top.parent.exists() and top.parent != top:
            top = top.parent
        self.created = None if os.path.lexists(self.out) else top
        self.before = {
            Path(root, n).relative_to(self.out) for root, dirs, files in os.walk(self.out) for n in dirs + files
        }

    def new(self) -> list[Path]:
        """The added entries, outermost only (a new folder stands for what it holds)."""
        if self.created is not None:
            return [self.created] if os.path.lexists(self.created) else []
        added = []
        for root, dirs, files in os.walk(self.out):
            here = Path(root).relative_to(self.out)
            fresh = [name for name in dirs + files if here / name not in self.before]
            added += [Path(root, name) for name in fresh]
            dirs[:] = [name for name in dirs if name not in fresh]  # a new folder stands for what it holds
        return added

    def remove(self) -> str:
        """Remove the additions; what was done, as a clause for an error line ("" where nothing was written)."""
        added = self.new()
        wrote = any(p.is_file() or p.is_symlink() or any(files for _, _, files in os.walk(p)) for p in added)
        for path in added:
            remove(path)
        if not wrote:
            return ""
        if self.created is not None:
            return f"removed {self.created}, which this run had created"
        return f"removed what this run had written in {self.out}; what was there before is kept"
