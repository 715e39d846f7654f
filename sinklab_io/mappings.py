"""Nested mappings as one level of dotted keys (MLflow params, resume checks, config summaries), and
a command's parsed options as its typed settings."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


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


def settings_of(cls: type[T], args: argparse.Namespace, **given) -> T:
    """A command's typed settings: the fields of the dataclass ``cls`` from its parsed options, ``given`` set apart."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if f.name not in given} | given)
