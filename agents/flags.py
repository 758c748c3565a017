"""Command-line flags generated from frozen config dataclasses.

Each dataclass field becomes ``--field-name`` with the field's type, its default, and the help
text from ``field(metadata={"help": ...})``. Tuples of ints are written ``256,256``.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, TypeVar

C = TypeVar("C")


def helptext(text: str) -> dict[str, str]:
    """Field metadata carrying a flag's help: ``field(default=..., metadata=helptext("..."))``."""
    return {"help": text}


def _parse_int_tuple(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected comma-separated integers such as 256,256"
        ) from None
    return values


def add_config_flags(
    parser: argparse.ArgumentParser,
    config_cls: type,
    defaults: Any | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """Add one flag per field of ``config_cls`` but ``skip``; ``defaults`` (an instance)
    overrides the fields' defaults."""
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        if f.name in skip:
            continue
        default = getattr(defaults, f.name) if defaults is not None else f.default
        kind = hints[f.name]
        help_text = f.metadata.get("help", "")
        flag = "--" + f.name.replace("_", "-")
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        help_text = f"{help_text} (default: {shown})"
        if kind is bool:
            parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=help_text,
            )
        elif typing.get_origin(kind) is tuple:
            parser.add_argument(
                flag,
                dest=f.name,
                type=_parse_int_tuple,
                default=default,
                metavar="N,N",
                help=help_text,
            )
        else:
            parser.add_argument(flag, dest=f.name, type=kind, default=default, help=help_text)


def config_from_args(config_cls: type[C], args: argparse.Namespace) -> C:
    """Build ``config_cls`` from parsed flags (its ``__post_init__`` validates the values)."""
    names = [f.name for f in dataclasses.fields(config_cls)]
    return config_cls(**{n: getattr(args, n) for n in names})
