"""`make wheelhouse` (python -m cluster.wheelhouse): what `sinklab fit` needs as wheels, for nodes that reach no
package index.

What is carried and left out, and why: docs/cluster.md.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from cluster import wheel_args
from cluster.wheel_args import ASSETS, PIN, PROG, WheelhouseError, normalise
from sinklab_io.outputs import Additions

REPO = Path(__file__).resolve().parents[1]
TORCH_ONLY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")  # the node's torch brings these
BUILD = ["setuptools>=64", "wheel"]  # for `make venv WHEELHOUSE=...`'s editable install, offline
# what `sinklab prep embedded` and `sinklab fit` import, traced on a ZeRO-2 fit (docs/cluster.md)
FIT = (
    "lightning jsonargparse deepspeed mlflow-skinny sqlalchemy alembic cryptography numpy zstandard matplotlib rich "
    "tqdm psutil pyyaml packaging tokenizers safetensors"
).split()
# what FIT's packages ask for but a fit never imports (a ZeRO-2 fit ran without them; docs/cluster.md)
NEVER_IMPORTED = set(
    "contourpy gitpython google-auth markdown-it-py ninja py-cpuinfo pycparser python-dotenv uvicorn".split()
)
SAME_RANGE = {"mlflow-skinny": "mlflow"}  # the client alone, in the range setup.cfg gives mlflow


def requirements(names: list[str], extras: list[str]) -> list[str]:
    """``names`` with setup.cfg's ranges (and extras) where it lists them, then the ``extras``' requirements."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    listed = [line for line in map(str.strip, cfg["options"]["install_requires"].splitlines()) if line]
    by_name = {name(req): req for req in listed}
    reqs = []
    for text in names:
        wanted = name(text)
        listed_as = SAME_RANGE.get(wanted, wanted)
        if normalise(text) != wanted:
            reqs.append(text)  # a range of its own: taken as given
        else:
            reqs.append(by_name[listed_as].replace(listed_as, wanted, 1) if listed_as in by_name else wanted)
    for extra in extras:
        lines = map(str.strip, cfg["options.extras_require"][extra].splitlines())
        reqs += [line for line in lines if line and not line.startswith("#")]
    return reqs


def have_versions(path: Path | None) -> dict[str, str]:
    """``pip freeze`` of the node as {name: version}, local labels (+cu130) dropped; a name alone is "" (present)."""
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
        match = re.fullmatch(r"([A-Za-z0-9][\w.-]*)(==([^+\s;]+)(\+\S*)?)?(\s*;.*)?", text)
        if not match:
            raise WheelhouseError(
                f"--have {path} line {number}: {text[:60]!r} is not a `pip freeze` line (name==version, or a "
                "name alone: present, version unknown); give the output of `pip freeze` on the node"
            )
        pins[normalise(match.group(1))] = match.group(3) or ""  # "": the node has it, version unknown
    return pins


LEGACY = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}


def platform_tags(platform: str) -> list[str]:
    """``--platform`` options for a target: its manylinux tag and every older one its glibc also runs."""
    match = re.fullmatch(r"manylinux(?:_2_(\d+)|(2014|2010|1))_(\w+)", platform)
    if not match:
        return ["--platform", platform]
    glibc, arch = int(match.group(1) or LEGACY[f"manylinux{match.group(2)}"]), match.group(3)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    tags += [f"{name}_{arch}" for name, minor in LEGACY.items() if minor <= glibc]
    return [option for tag in tags for option in ("--platform", tag)]


def pip(*args: str, env: dict | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        said = [line[7:] for line in done.stderr.splitlines() if line.startswith("ERROR: ") and "yanked" not in line]
        said = [re.sub(r" \(from versions: [^)]*\)", "", line) for line in said]  # the index's whole history
        raise WheelhouseError(f"pip {args[0]} failed: {'; '.join(said) or done.stderr.strip()[-300:]}")


def build_wheel(out: Path, source: str) -> None:
    """A pure wheel of ``source`` built here (DeepSpeed with none of its ops compiled)."""
    env = dict(os.environ, DS_BUILD_OPS="0", DS_BUILD_AIO="0", DS_BUILD_CUTLASS_OPS="0")
    pip("wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir", str(out), source, env=env)


def torch_stand_in(folder: Path, torch: str) -> None:
    """A metadata-only wheel of the node's torch (``torch==X``, as X+node), which the resolver prefers."""
    version = re.fullmatch(r"torch==([\w.]+)", torch.replace(" ", ""))
    if not version:
        return  # a range: the index's torch is resolved, what only it needs is left out after
    dist = f"torch-{version.group(1)}+node"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(
            f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version.group(1)}+node\n"
        )
        wheel.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist}.dist-info/RECORD", "")


def resolve(reqs: list[str], target: list[str], out: Path, torch: str) -> list[dict]:
    """pip's resolution for the target: one metadata dict (name, version, requires_dist) per wheel."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        torch_stand_in(Path(tmp), torch)
        options = ["--dry-run", "--ignore-installed", "--quiet", "--report", str(report), *target]
        pip("install", *options, "--find-links", str(out), "--find-links", tmp, *reqs, torch)
        return [item["metadata"] for item in json.loads(report.read_text())["install"]]


def plan(resolved: list[dict], roots: list[str], have: dict, python_version: str, machine: str, trusted=None) -> dict:
    """{name: version} of what ``roots`` need and the node lacks; ranges taken on trust go to ``trusted``."""
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version

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
    meta = {normalise(m["name"]): m for m in resolved}

    def applies(dep, extra: str) -> bool:  # an extra adds only what it alone asks for
        if dep.marker is None:
            return extra == ""
        return dep.marker.evaluate({**env, "extra": extra}) and (
            extra == "" or not dep.marker.evaluate({**env, "extra": ""})
        )

    def on_node(req, asker: str) -> bool:
        key = normalise(req.name)
        if have.get(key) == "":
            if req.specifier and trusted is not None:
                trusted[key] = trusted.get(key, req.specifier) & req.specifier
            return True  # a name alone: the node has it, taken as accepted (docs/cluster.md)
        try:
            node = Version(have[key])
        except (KeyError, InvalidVersion):
            return False
        if req.specifier.contains(node, prereleases=True):
            return True
        if Version(meta[key]["version"]) < node:
            raise WheelhouseError(
                f"{asker or 'the project'} asks {req.name}{req.specifier}, but the node has {req.name} {node}: "
                "carrying it would be a downgrade; pin an older asker (--only) or install that version on the node"
            )
        return False  # too old there: the newer one is carried

    carry: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    todo = [(Requirement(r), None) for r in roots]
    while todo:
        req, asker = todo.pop()
        key = normalise(req.name)
        if TORCH_ONLY.match(key) or key not in meta or (asker and key in NEVER_IMPORTED) or on_node(req, asker):
            continue
        carry[key] = meta[key]["version"]
        for extra in {"", *req.extras} - {e for k, e in seen if k == key}:
            seen.add((key, extra))
            deps = map(Requirement, meta[key].get("requires_dist") or [])
            todo += [(dep, f"{meta[key]['name']} {meta[key]['version']}") for dep in deps if applies(dep, extra)]
    return carry


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
    add: tuple[str, ...] = (),
    trusted: dict | None = None,
) -> list[Path]:
    """Fill ``out``; returns the wheels the target needs (``out`` may hold others from before). On a failure
    what this call wrote is removed again."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    wheel_args.check(
        python_version, platform, torch, only, extras, assets, deepspeed, add, cfg["options.extras_require"]
    )
    node = have_versions(have)  # before anything is written: a bad --have file is refused
    if out.exists() and not out.is_dir():
        raise WheelhouseError(f"--out {out}: a file is there; give a folder (new or holding wheels)")
    additions = Additions(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WheelhouseError(f"--out {out}: cannot be created ({err.strerror}); give a writable folder") from None
    try:
        pinned = [PIN.fullmatch(asset) for asset in assets]
        target = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
        target += platform_tags(platform)
        reqs = requirements([*FIT, *add] if only is None else only, list(extras))
        if any(name(r) == "deepspeed" for r in reqs):
            try:
                version = deepspeed or importlib.metadata.version("deepspeed")
            except importlib.metadata.PackageNotFoundError:
                raise WheelhouseError("deepspeed is not installed here; give its version (--deepspeed X.Y.Z)") from None
            if not any(out.glob(f"deepspeed-{version}-py3-none-any.whl")):
                build_wheel(out, f"deepspeed=={version}")
            reqs = [f"deepspeed=={version}" if name(r) == "deepspeed" else r for r in reqs]
        roots = [*reqs, *BUILD]
        resolved = resolve(roots, target, out, torch)
        machine = re.search(r"(x86_64|aarch64|ppc64le|s390x|i686)$", platform)
        carry = plan(resolved, roots, node, python_version, machine.group(1) if machine else "x86_64", trusted)
        carry |= {normalise(pin.group(1)): pin.group(2) for pin in pinned if normalise(pin.group(1)) not in node}
        if only is None:
            build_wheel(out, str(REPO))
            carry["sinklab"] = cfg["metadata"]["version"]
        wanted = [f"{key}=={version}" for key, version in sorted(carry.items()) if key not in ("deepspeed", "sinklab")]
        if wanted:
            pip("download", "--no-deps", "--quiet", "--dest", str(out), *target, *wanted)
        return sorted(
            p for p in out.glob("*.whl") if carry.get(normalise(p.name.split("-")[0])) == p.name.split("-")[1]
        )
    except BaseException:
        additions.remove()
        raise


def name(requirement: str) -> str:
    return normalise(re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0])


def main(argv: list[str] | None = None) -> int:
    args = wheel_args.parser(__doc__.split("\n\n")[0]).parse_args(argv)
    try:
        wheels = build(**vars(args), trusted=(trusted := {}))
    except (WheelhouseError, KeyError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    node = have_versions(args.have)
    if newer := [" ".join(w.name.split("-")[:2]) for w in wheels if normalise(w.name.split("-")[0]) in node]:
        print(f"newer than the node's (carried): {', '.join(newer)}")
    if trusted:
        ranges = ", ".join(key + str(spec) for key, spec in sorted(trusted.items()))
        print(f"the node's version unknown, taken as accepted (check there): {ranges}")
    print(
        f"{len(wheels)} wheels, {sum(p.stat().st_size for p in wheels) / 2**20:.1f} MiB, in {args.out} "
        f"(Python {args.python_version}, {args.platform}; torch left out)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
