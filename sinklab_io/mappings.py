"""Nested mappings as one level of dotted keys (MLflow params, resume checks, config summaries)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``, each key after ``prefix``; an empty mapping stays a value."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out
