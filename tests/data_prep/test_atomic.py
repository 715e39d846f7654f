"""data_prep.atomic: whole or not at all."""
from __future__ import annotations

import pytest

from data_prep.atomic import atomic_directory, atomic_path, atomic_write


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = atomic_write(tmp_path / "sub" / "report.json", "old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            assert tmp.parent == target.parent and tmp.suffix == ".json" and tmp.name.startswith(".")
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert target.read_text() == "old" and sorted(p.name for p in target.parent.iterdir()) == ["report.json"]
    assert atomic_write(target, b"new").read_bytes() == b"new"


def test_a_directory_is_replaced_whole(tmp_path):
    out = tmp_path / "model"
    with atomic_directory(out) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(ValueError):
        with atomic_directory(out) as tmp:
            (tmp / "b").write_text("2")
            raise ValueError
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and [p.name for p in out.iterdir()] == ["a"]
