"""Type-checked reading of an experiment file, errors naming the file, line and field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from pipeline import metric_names as N
from pipeline.model.config import ConfigError, refuse_renamed

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._+-]*$")
SEED_KEYS = ("seed_everything", "data.seed")  # set per run by the sweep's seed axis


class ExperimentError(ValueError):
    """A malformed experiment file; the message starts with `file:line: field:`."""


def line_map(text: str) -> dict[tuple, int]:
    """Map each YAML path (tuple of keys / indices) to its 1-based line number."""
    lines: dict[tuple, int] = {}

    def walk(node: yaml.Node, path: tuple) -> None:
        lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                walk(value_node, path + (key_node.value,))
                lines[path + (key_node.value,)] = key_node.start_mark.line + 1  # the key's line, not the value's
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return lines


class Reader:
    def __init__(self, path: Path, text: str):
        self.path = path
        self.lines = line_map(text)

    def fail(self, path: tuple, message: str) -> ExperimentError:
        """`file:line: field: message`, the line of the field or of its nearest enclosing one in the file."""
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        dotted = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(path))
        return ExperimentError(f"{self.path}:{self.lines.get(probe, 1)}: {dotted or '<top>'}: {message}")

    def mapping(self, value: Any, path: tuple, allowed: set[str] | None = None, required: tuple[str, ...] = ()) -> dict:
        value = {} if value is None else value
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {type(value).__name__}")
        if allowed is not None:
            for key in value:
                if key not in allowed:
                    raise self.fail(path + (key,), f"unknown field {key!r}; allowed: " + ", ".join(sorted(allowed)))
        for key in required:
            if key not in value:
                raise self.fail(path, f"missing required field {key!r}")
        return value

    def text(self, value: Any, path: tuple, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(path, f"expected a non-empty string, got {value!r}")
        return value.strip()

    def metric(self, value: Any, path: tuple) -> str:
        value = self.text(value, path)
        if not N.is_metric(value):
            raise self.fail(
                path, f"{value!r} is not a metric name; SinkLab's start with one of {', '.join(N.NAMESPACES)}"
            )
        return value

    def name(self, value: Any, path: tuple) -> str:
        value = self.text(value, path)
        if not NAME_RE.match(value):
            raise self.fail(
                path,
                f"{value!r} is not a valid name (lowercase letters, digits, and . _ + - ; it becomes a directory name)",
            )
        return value

    def overrides(self, value: Any, path: tuple) -> dict[str, Any]:
        value = self.mapping(value, path)
        for key, item in value.items():
            if not isinstance(key, str) or not re.match(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$", key):
                raise self.fail(
                    path + (key,), f"override key {key!r} must be a dotted config path such as arch.n_heads"
                )
            try:
                refuse_renamed(key, "")
            except ConfigError as err:
                raise self.fail(path + (key,), str(err)) from None
            if key in SEED_KEYS:
                raise self.fail(
                    path + (key,),
                    f"{key} is set by the sweep: seeds are an axis of their own (scale.<scale>.seeds: N, "
                    "or `sinklab sweep --seeds N`); remove this override",
                )
            if isinstance(item, dict):
                raise self.fail(
                    path + (key,), "override values must be scalars or lists; write nested fields as dotted keys"
                )
        return dict(value)

    def count(self, value: Any, path: tuple, default: int, at_most: int) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= at_most:
            raise self.fail(path, f"expected a whole number in 1..{at_most}, got {value!r}")
        return value

    def number_or_null(self, value: Any, path: tuple) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(path, f"expected a number or null (null where the paper gives no number), got {value!r}")
        return float(value)
