"""`make wheelhouse` (cluster/wheelhouse.py): which wheels a node without a package index needs,
and a real subset built and installed with pip --no-index into a fresh venv."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import venv
import zipfile

import pytest
from packaging.specifiers import SpecifierSet

from cluster import wheelhouse as wh


def test_a_glibc_2_28_node_takes_every_older_manylinux_tag():
    tags = wh.platform_tags("manylinux_2_28_x86_64")[1::2]
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert wh.platform_tags("manylinux2014_aarch64")[1] == "manylinux_2_17_aarch64"
    assert wh.platform_tags("macosx_11_0_arm64") == ["--platform", "macosx_11_0_arm64"]


def test_what_only_torch_needs_is_left_to_the_nodes_torch():
    resolved = [
        {
            "name": "sinklab",
            "version": "0.1.0",
            "requires_dist": ["torch>=2.4", "jsonargparse[signatures]>=4.32", "lm-eval>=0.4; extra == 'eval'"],
        },
        {"name": "torch", "version": "2.11.0", "requires_dist": ["sympy", "filelock", "nvidia-cublas-cu12"]},
        {
            "name": "jsonargparse",
            "version": "4.40.0",
            "requires_dist": [
                "PyYAML>=3.13",
                "docstring-parser>=0.15; extra == 'signatures'",
                "typing-extensions; python_version < '3.10'",
            ],
        },
        *(
            {"name": n, "version": "1.0"}
            for n in (
                "sympy",
                "filelock",
                "nvidia-cublas-cu12",
                "PyYAML",
                "docstring_parser",
                "typing_extensions",
                "lm-eval",
            )
        ),
    ]
    asked = wh.needed(resolved, ["sinklab"], "3.11", "x86_64")
    assert set(asked) == {"sinklab", "jsonargparse", "pyyaml", "docstring-parser"}
    assert [str(s) for s in asked["pyyaml"]] == [">=3.13"]
    node = {"pyyaml": "6.0.2", "jsonargparse": "4.20.0", "docstring-parser": "bad version!"}
    asked["jsonargparse"].append(SpecifierSet(">=4.32"))
    assert wh.satisfied_on_node(asked, node) == {"pyyaml"}  # too old and unreadable versions stay in


def test_a_freeze_list_drops_local_labels_and_urls(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.11.0+cu130\nPyYAML==6.0.2\n-e git+https://x/y.git#egg=z\nfoo @ file:///tmp/foo.whl\n")
    assert wh.have_versions(freeze) == {"torch": "2.11.0", "pyyaml": "6.0.2"}


def test_a_missing_or_garbage_freeze_list_is_one_line_and_writes_nothing(tmp_path, capsys):
    """A missing --have file, and one of garbage lines, are refused in one line."""
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("torch==2.11.0\nthis is not pip freeze\n")
    for have, said in (
        (tmp_path / "missing.txt", f"--have {tmp_path / 'missing.txt'}: cannot be read (No such file or directory)"),
        (garbage, f"--have {garbage} line 2: 'this is not pip freeze' is not a `pip freeze` line (name==version)"),
    ):
        assert wh.main(["--out", str(tmp_path / "wheels"), "--have", str(have)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"make wheelhouse: {said}") and len(err.splitlines()) == 1, err
    assert not (tmp_path / "wheels").exists()


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _pypi_reachable(), reason="needs PyPI to resolve and download")
def test_deepspeed_as_a_pure_wheel_and_jsonargparse_install_with_no_index(tmp_path):
    """The real thing on a subset (the whole wheelhouse takes about a minute to build and install,
    docs/cluster.md): built for this Python, installed offline into a fresh venv."""
    out = tmp_path / "wheelhouse"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheels = wh.build(out, py, "manylinux_2_28_x86_64", "torch==2.13.0", only=["deepspeed", "jsonargparse"], assets=())
    names = {w.name.split("-")[0].lower() for w in wheels}
    assert {"deepspeed", "jsonargparse", "docstring_parser", "hjson"} <= names  # signatures extra, DeepSpeed's deps
    assert not {n for n in names if n == "torch" or n.startswith(("nvidia", "triton"))}
    deepspeed = next(w for w in wheels if w.name.startswith("deepspeed-"))
    assert deepspeed.name.endswith("-py3-none-any.whl")
    assert not [n for n in zipfile.ZipFile(deepspeed).namelist() if n.endswith(".so")]  # no compiled op

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    for args in (["jsonargparse[signatures]"], ["deepspeed", "--no-deps"]):  # DeepSpeed's torch: the node's
        done = subprocess.run(
            [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(out), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    check = subprocess.run(
        [
            python,
            "-c",
            "import jsonargparse, docstring_parser; from importlib.metadata import "
            "version; print(version('deepspeed'))",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert check.returncode == 0 and check.stdout.strip() == deepspeed.name.split("-")[1], check.stderr
