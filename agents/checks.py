"""Range checks shared by the agents' frozen configs (each raises `rg.ConfigError`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import replaygpu as rg


def require(config: Any, names: Iterable[str], ok: Callable[[Any], bool], expected: str) -> None:
    """Raise ``ConfigError("NAME: got V, expected ...")`` for the first field failing ``ok``."""
    for name in names:
        value = getattr(config, name)
        if not ok(value):
            raise rg.ConfigError(f"{name}: got {value}, expected {expected}")


def require_positive_ints(config: Any, *names: str) -> None:
    """Each named field is >= 1."""
    require(config, names, lambda v: v >= 1, ">= 1")


def require_unit_interval(config: Any, *names: str) -> None:
    """Each named field lies in [0, 1]."""
    require(config, names, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")


def require_positive(config: Any, *names: str) -> None:
    """Each named field is > 0."""
    require(config, names, lambda v: v > 0, "> 0")


def require_widths(config: Any, name: str = "hidden_sizes") -> None:
    """The named tuple of layer widths is non-empty and positive."""
    require(config, [name], lambda v: bool(v) and min(v) >= 1, "positive widths like 256,256")
