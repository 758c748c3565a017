"""Command-line flags generated from frozen config dataclasses.

Each dataclass field becomes ``--field-name`` with the field's type, its default, and the help
text from ``field(metadata={"help": ...})``. Supported field types:

- ``bool``: ``--flag`` / ``--no-flag``;
- ``int``, ``float``, ``str``;
- ``tuple[int, ...]``, written ``256,256``;
- ``Literal[...]`` of str, int or float values: the flag accepts exactly those values;
- any of these but ``bool`` as ``X | None`` (or ``Optional[X]``): the flag also accepts
  ``none`` (any case) for None.

Any other type raises TypeError when the flags are built, naming the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Collection
from typing import Any, Literal, TypeVar

from replaygpu.errors import ConfigError

C = TypeVar("C")

# What a parse error says each scalar type expected.
_SCALARS: dict[type, str] = {int: "an integer", float: "a number", str: "a string"}
_INT_TUPLE = "comma-separated integers such as 256,256"


def helptext(text: str) -> dict[str, str]:
    """Field metadata carrying a flag's help: ``field(default=..., metadata=helptext("..."))``."""
    return {"help": text}


def _parse_int_tuple(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected {_INT_TUPLE}") from None
    return values


def _or_none(
    parse: Callable[[str], Any], expected: str, choices: tuple[Any, ...] | None = None
) -> Callable[[str], Any]:
    """Wrap ``parse`` so that ``none`` (any case) reads as None; other values must be in
    ``choices`` if given (argparse's own ``choices`` check would list None as ``None``)."""

    def parse_or_none(text: str) -> Any:
        if text.strip().lower() == "none":
            return None
        try:
            value = parse(text)
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(f"got {text!r}, expected {expected} or none") from None
        if choices is not None and value not in choices:
            shown = ", ".join(map(repr, (*choices, "none")))
            raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {shown})")
        return value

    return parse_or_none


def _split_optional(kind: Any) -> tuple[Any, bool]:
    """``X | None`` or ``Optional[X]`` -> ``(X, True)``; any other type -> ``(kind, False)``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = typing.get_args(kind)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            return rest[0], True
    return kind, False


def _literal_values(kind: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal`` whose values all share one type of int, float or str."""
    if typing.get_origin(kind) is not Literal:
        return None
    values = typing.get_args(kind)
    if len({type(v) for v in values}) != 1 or type(values[0]) not in _SCALARS:
        return None  # bool, enum, None or mixed types: no one conversion from text
    return values


def _type_name(kind: Any) -> str:
    return kind.__name__ if isinstance(kind, type) and not typing.get_args(kind) else repr(kind)


def _flag_kwargs(where: str, kind: Any, metavar: str) -> dict[str, Any]:
    """argparse keyword arguments (type, choices, metavar or action) for a field typed ``kind``.

    Raises:
      TypeError: ``kind`` is not one of the supported types listed in the module docstring.
    """
    inner, optional = _split_optional(kind)
    values = _literal_values(inner)
    if inner is bool and not optional:
        return {"action": argparse.BooleanOptionalAction}
    if inner in _SCALARS:
        kwargs: dict[str, Any] = {"type": inner, "metavar": metavar}
        expected = _SCALARS[inner]
    elif typing.get_origin(inner) is tuple and typing.get_args(inner) == (int, ...):
        kwargs = {"type": _parse_int_tuple, "metavar": "N,N"}
        expected = _INT_TUPLE
    elif values is not None:
        kwargs = {"type": type(values[0]), "choices": values}
        kwargs["metavar"] = "{" + ",".join(map(str, values)) + "}"
        expected = _SCALARS[type(values[0])]
    else:
        raise TypeError(
            f"{where}: cannot make a command-line flag for type {_type_name(kind)}; supported "
            "types are bool, int, float, str, tuple[int, ...] and Literal[...] of str, int or "
            "float values, and any of these but bool with `| None`. Change the field's type, or "
            "pass the field in `skip` and set it yourself."
        )
    if optional:
        choices = kwargs.pop("choices", None)
        kwargs["type"] = _or_none(kwargs["type"], expected, choices)
        kwargs["metavar"] = (
            kwargs["metavar"][:-1] + ",none}" if choices else kwargs["metavar"] + "|none"
        )
    return kwargs


def _shown(default: Any) -> str:
    """A default as the user would type it, escaped for argparse's %-formatting of help."""
    if default is None:
        text = "none"
    elif isinstance(default, tuple):
        text = ",".join(map(str, default))
    else:
        text = str(default)
    return text.replace("%", "%%")


def add_config_flags(
    parser: argparse.ArgumentParser,
    config_cls: type,
    defaults: Any | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """Add one flag per field of ``config_cls`` but ``skip``; ``defaults`` (an instance)
    overrides the fields' defaults.

    Raises:
      TypeError: a field's type has no flag form (see the module docstring).
    """
    hints = typing.get_type_hints(config_cls)  # resolves `from __future__ import annotations`
    for f in dataclasses.fields(config_cls):
        if f.name in skip:
            continue
        default = getattr(defaults, f.name) if defaults is not None else f.default
        where = f"{config_cls.__name__}.{f.name}"
        kwargs = _flag_kwargs(where, hints[f.name], metavar=f.name.upper())
        help_text = f"{f.metadata.get('help', '')} (default: {_shown(default)})".lstrip()
        parser.add_argument(
            flag_name(f.name), dest=f.name, default=default, help=help_text, **kwargs
        )


def flag_name(field_name: str) -> str:
    """The flag of a config field: ``batch_size`` -> ``--batch-size``."""
    return "--" + field_name.replace("_", "-")


def config_from_args(
    config_cls: type[C], args: argparse.Namespace, parser: argparse.ArgumentParser | None = None
) -> C:
    """Build ``config_cls`` from parsed flags (its ``__post_init__`` validates the values).

    A value the config refuses is reported as the flag's: ``--batch-size: got -3, expected >= 1``
    (the config says ``batch_size: ...``), through ``parser.error`` when a parser is given. A
    run that would end before its first SGD step is refused too (`config_parts.require_trains`),
    naming the flag to pass and which value is the command's default.

    Raises:
        ConfigError: a value the config refuses, without ``parser``.
    """
    from replaygpu.agents.config_parts import NoTrainingError, require_env_actions, require_trains

    names = [f.name for f in dataclasses.fields(config_cls)]
    try:
        config = config_cls(**{n: getattr(args, n) for n in names})
        require_trains(config)  # every command, not only the configs that check it themselves
        if "env_id" in names:  # before TensorFlow, which making the agent comes after
            require_env_actions(config)
        return config
    except NoTrainingError as err:
        defaulted = [n for n in ("steps", "learning_starts") if _is_default(parser, args, n)]
        message = err.message(flag_name, defaulted, parser.prog if parser is not None else "")
    except ValueError as err:  # rg.ConfigError is one
        message = flag_message(err, names)
    if parser is not None:
        parser.error(message)
    raise ConfigError(message) from None


def _is_default(
    parser: argparse.ArgumentParser | None, args: argparse.Namespace, name: str
) -> bool:
    """Whether flag ``name`` holds ``parser``'s default (passed or not)."""
    return parser is not None and getattr(args, name) == parser.get_default(name)


def flag_message(err: ValueError, names: Collection[str]) -> str:
    """A config's error about one of the fields ``names`` as its flag's: ``batch_size: got -3,
    expected >= 1`` -> ``--batch-size: got -3, expected >= 1``; any other error as it is."""
    field_name, sep, rest = str(err).partition(": ")
    return f"{flag_name(field_name)}: {rest}" if sep and field_name in names else str(err)
