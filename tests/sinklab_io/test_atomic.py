"""sinklab_io.atomic: whole or not at all."""

from __future__ import annotations

import pytest

from sinklab_io.atomic import atomic_path, atomic_write, publish
from sinklab_io.outputs import MARKER, NotOurs, atomic_directory


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = atomic_write(tmp_path / "sub" / "measures.json", "old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            assert tmp.parent == target.parent and tmp.suffix == ".json" and tmp.name.startswith(".")
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert target.read_text() == "old" and sorted(p.name for p in target.parent.iterdir()) == ["measures.json"]
    assert atomic_write(target, b"new").read_bytes() == b"new"


def test_a_directory_is_replaced_whole(tmp_path):
    out = tmp_path / "model"
    with atomic_directory(out, kind="test") as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(ValueError):
        with atomic_directory(out, kind="test") as tmp:
            (tmp / "b").write_text("2")
            raise ValueError
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and sorted(p.name for p in out.iterdir()) == [MARKER, "a"]
    with atomic_directory(out, kind="test") as tmp:  # an earlier output of the same writer is replaced
        (tmp / "c").write_text("3")
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and sorted(p.name for p in out.iterdir()) == [MARKER, "c"]


@pytest.mark.parametrize("case", ["user file", "user file beside an earlier output", "other writer"])
def test_a_directory_holding_what_the_writer_did_not_write_is_refused_untouched(tmp_path, case):
    out = tmp_path / "out"
    if case != "user file":
        with atomic_directory(out, kind="test" if case != "other writer" else "another") as tmp:
            (tmp / "weights").write_text("1")
    if case != "other writer":
        out.mkdir(exist_ok=True)
        (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(NotOurs, match="did not write; nothing was changed"):
        with atomic_directory(out, kind="test") as tmp:
            pytest.fail("refused before any work")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_current_directory_and_its_parents_are_refused(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for target in (".", "..", str(work)):
        with pytest.raises(NotOurs, match="current directory"):
            with atomic_directory(target, kind="test"):
                pytest.fail("refused before any work")
    assert work.is_dir() and not any(work.iterdir())


def test_publish_moves_a_filled_folder_into_place_or_leaves_nothing(tmp_path):
    def fill(tmp):
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text("{}")
        return tmp / "model"

    target = publish(tmp_path / "cache" / "model", fill)
    assert (target / "config.json").read_text() == "{}" and sorted(p.name for p in target.parent.iterdir()) == ["model"]

    def broken(tmp):
        (tmp / "half").write_text("x")
        raise OSError("download cut")

    with pytest.raises(OSError, match="download cut"):
        publish(tmp_path / "cache" / "other", broken)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["model"]  # no temporary, no half target
