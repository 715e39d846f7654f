"""sinklab_io.mappings.flatten and sinklab_io.atomic.remove: the one flattener, the one remover."""

from sinklab_io.atomic import remove
from sinklab_io.mappings import flatten


def test_flatten_dots_nested_keys_and_keeps_empty_mappings_and_lists():
    data = {"model": {"attention": {"op": "sigmoid"}, "dims": [1, 2], "extra": {}}, "seed": 0}
    assert flatten(data) == {"model.attention.op": "sigmoid", "model.dims": [1, 2], "model.extra": {}, "seed": 0}
    assert flatten({"lr": 1e-3}, "optim.") == {"optim.lr": 1e-3}


def test_remove_takes_a_file_a_tree_or_a_link_and_passes_over_what_is_absent(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "g").write_text("y")
    (tmp_path / "kept").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "kept")
    for name in ("f", "d", "link", "absent"):
        remove(tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # the link's target stays
