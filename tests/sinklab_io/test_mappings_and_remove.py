"""sinklab_io.mappings (flatten, settings_of) and sinklab_io.atomic.remove: the one flattener, the
one options-to-settings copy, the one remover."""

import argparse
from dataclasses import dataclass

import pytest

from sinklab_io.atomic import remove
from sinklab_io.mappings import flatten, settings_of


def test_flatten_dots_nested_keys_and_keeps_empty_mappings_and_lists():
    data = {"model": {"attention": {"op": "sigmoid"}, "dims": [1, 2], "extra": {}}, "seed": 0}
    assert flatten(data) == {"model.attention.op": "sigmoid", "model.dims": [1, 2], "model.extra": {}, "seed": 0}
    assert flatten({"lr": 1e-3}, "optim.") == {"optim.lr": 1e-3}


@dataclass
class Settings:
    out: str
    seed: int = 0
    command: str = ""


def test_settings_of_copies_the_fields_by_name_and_takes_given_ones_apart():
    args = argparse.Namespace(out="o", seed=3, command="ignored", unused=1)
    assert settings_of(Settings, args, command="sinklab prep") == Settings("o", 3, "sinklab prep")
    with pytest.raises(AttributeError, match="seed"):  # a field the parser lacks is a bug, not a default
        settings_of(Settings, argparse.Namespace(out="o", command=""))


def test_remove_takes_a_file_a_tree_or_a_link_and_passes_over_what_is_absent(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "g").write_text("y")
    (tmp_path / "kept").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "kept")
    for name in ("f", "d", "link", "absent"):
        remove(tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # the link's target stays
