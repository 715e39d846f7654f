"""The source a remote-code export carries: ``hf_modeling`` and every SinkLab module it imports, laid
flat with each such import made relative (``from pipeline.kernels.tiled import X`` -> ``from .tiled
import X``): transformers' loader copies only the files that ``from .name import`` lines name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ENTRY = "pipeline.model.hf_modeling"
_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the ``pipeline`` package


class BundleError(RuntimeError):
    """A module imports another in a way the flat bundle cannot carry."""


def _file(module: str) -> Path:
    path = _ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _flat_name(module: str) -> str:
    """The file name a module gets in the export (a package's ``__init__`` takes the package's name)."""
    return module.rpartition(".")[2] + ".py"


def _sinklab_imports(module: str) -> list[tuple[ast.ImportFrom, str]]:
    """Each ``from X import ...`` of ``module`` where X is a SinkLab module, with X made absolute."""
    path = _file(module)
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "pipeline" for a in node.names):
            raise BundleError(f"{path}:{node.lineno}: write `from pipeline.x import name`, not `import pipeline.x`")
        if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("pipeline")):
            continue
        if node.level and not node.module:
            raise BundleError(
                f"{path}:{node.lineno}: `from . import name` is not seen by transformers' loader; "
                "write `from .name import ...`"
            )
        base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
        found.append((node, ".".join(base + [node.module])))
    return found


def bundle_modules() -> list[str]:
    """The entry and every SinkLab module it needs, in the order they are first reached."""
    order, todo = [], [ENTRY]
    while todo:
        module = todo.pop(0)
        if module in order:
            continue
        order.append(module)
        todo += [target for _, target in _sinklab_imports(module)]
    names = [_flat_name(m) for m in order]
    if len(set(names)) < len(names):
        raise BundleError(f"two bundled modules share a file name: {sorted(order, key=_flat_name)}")
    return order


def bundle() -> dict[str, str]:
    """file name -> source, for every file of the export's code, its SinkLab imports made flat and relative."""
    files = {}
    for module in bundle_modules():
        lines = _file(module).read_text().splitlines(keepends=True)
        for node, target in _sinklab_imports(module):
            i, flat = node.lineno - 1, _flat_name(target).removesuffix(".py")
            lines[i] = re.sub(r"^(\s*)from\s+\S+\s+import", rf"\1from .{flat} import", lines[i], count=1)
        files[_flat_name(module)] = "".join(lines)
    return files


def entry_class(name: str) -> str:
    """``auto_map`` value for a class of the entry module."""
    return f"{_flat_name(ENTRY).removesuffix('.py')}.{name}"
