"""The agents' config checks, training-loop chunks and command line, without TensorFlow: the CLI
builds and checks a config before TensorFlow is imported, so a bad flag is reported at once.

- Checks: `require` and its kin, each raising `ConfigError` with the field's name.
- Chunks of a vector training loop: `next_chunk`, `training_calls`. Field groups: `config_fields`.
- Flags (`add_config_flags`, `config_from_args`): each field becomes ``--field-name`` with its
  type, default and the ``help`` of its metadata (`config_fields.option`). Types: ``bool``
  (``--flag`` / ``--no-flag``), ``int``, ``float``, ``str``, ``tuple[int, ...]`` (``256,256``),
  ``Literal[...]`` of str, int or float, and any but ``bool`` as ``X | None`` (``none``); any
  other raises TypeError naming the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Collection, Iterable
from typing import Any, Literal, TypeVar

import replaygpu as rg
from replaygpu.errors import ConfigError


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


def require_env_actions(config: Any) -> None:
    """Known env id, ``ENV_CHECK`` accepts its env; ALE: `envs.atari_env`, run before any folder."""
    from .envs import require_env_id

    require_env_id(config.env_id)
    check = getattr(type(config), "ENV_CHECK", None)
    if check is not None and not config.env_id.startswith("ALE/"):
        check(config.env_id).close()


def require_vector_loop(config: Any, *positive: str) -> None:
    """A vector loop's (DQN's, SAC's) checks beyond its groups': ``steps``, ``eval_episodes``,
    ``positive`` >= 1; ``train_freq``, ``steps`` multiples of ``num_envs`` (whole vector steps)."""
    require_positive_ints(config, "steps", "eval_episodes", *positive)
    n = config.num_envs
    whole = f"a multiple of num_envs ({n}), as each vector step takes {n} env steps"
    require(config, ["train_freq", "steps"], lambda v: v % n == 0, whole)


class NoTrainingError(rg.ConfigError):
    """A run whose ``steps`` end before its first SGD step (`require_trains`): it would act,
    evaluate an untrained network and exit as if it had trained. ``first``: the least ``steps``
    that trains (the config's ``steps_to_train``)."""

    def __init__(self, steps: int, first: int, learning_starts: int) -> None:
        self.steps, self.first, self.learning_starts = steps, first, learning_starts
        super().__init__(self.message())

    def message(
        self,
        name: Callable[[str], str] = str,
        defaulted: Collection[str] = (),
        command: str = "",
    ) -> str:
        """The message with fields spelled by ``name`` (`flag_name` for a command line); the
        fields in ``defaulted`` hold ``command``'s default, so it names the flag to pass first."""
        default = f" (the default of {command})" if command else " (the default)"
        steps, starts = name("steps"), name("learning_starts")
        fixes = [f"{starts} below {self.steps}", f"{steps} {self.first} or more"]
        if "steps" in defaulted and "learning_starts" not in defaulted:
            fixes.reverse()
        return (
            f"{steps}: got {self.steps}{default if 'steps' in defaulted else ''}, expected >= "
            f"{self.first}: the run would end before its first SGD step, which comes after "
            f"{starts} {self.learning_starts}"
            f"{default if 'learning_starts' in defaulted else ''}; pass {fixes[0]}, or {fixes[1]}"
        )


def require_trains(config: Any) -> None:
    """Raise `NoTrainingError` unless ``steps`` >= ``steps_to_train`` (the least that trains);
    ``steps`` 0 and configs without it pass. Every command checks it in `config_from_args`."""
    first = getattr(config, "steps_to_train", None)
    if first is not None and config.steps and config.steps < first:
        raise NoTrainingError(config.steps, first, config.learning_starts)


def next_chunk(config: Any, env_steps: int) -> tuple[int, int]:
    """``(env steps, SGD steps)`` of the chunk after ``env_steps``: ``train_freq`` and
    ``gradient_steps``; the last is what is left of ``steps`` with SGD steps in proportion (at
    least 1), so ``--steps N`` runs exactly N env steps at the configured replay ratio."""
    left = config.steps - env_steps
    if left >= config.train_freq:
        return config.train_freq, config.gradient_steps
    return left, max(1, config.gradient_steps * left // config.train_freq)


def training_calls(config: Any) -> list[int]:
    """SGD steps of a vector loop's training calls: one per chunk ending past learning_starts."""
    calls, env_steps = [], 0
    while env_steps < config.steps:
        size, sgd_steps = next_chunk(config, env_steps)
        env_steps += size
        if env_steps > config.learning_starts:
            calls.append(sgd_steps)
    return calls


def total_sgd_steps(config: Any) -> int:
    """SGD steps a learner config's rate limiter allows once its ``steps`` rows are inserted:
    ``samples_per_insert`` x (``steps`` - ``learning_starts``) plus one call's error buffer."""
    budget = config.samples_per_insert * (config.steps - config.learning_starts)
    return max(1, int((budget + config.batch_size * config.steps_per_call) // config.batch_size))


C = TypeVar("C")

# What a parse error says each scalar type expected.
_SCALARS: dict[type, str] = {int: "an integer", float: "a number", str: "a string"}
_INT_TUPLE = "comma-separated integers such as 256,256"


def _parse_int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected {_INT_TUPLE}") from None


def _or_none(
    parse: Callable[[str], Any], expected: str, choices: tuple[Any, ...] | None = None
) -> Callable[[str], Any]:
    """``parse`` with ``none`` (any case) as None; checks ``choices`` (argparse's shows None)."""

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


def _flag_kwargs(where: str, kind: Any, metavar: str) -> dict[str, Any]:
    """argparse keyword arguments for a field typed ``kind``; TypeError for an unsupported one."""
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
        name = kind.__name__ if isinstance(kind, type) and not typing.get_args(kind) else repr(kind)
        raise TypeError(
            f"{where}: cannot make a command-line flag for type {name}; supported "
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
        return "none"
    text = ",".join(map(str, default)) if isinstance(default, tuple) else str(default)
    return text.replace("%", "%%")


def add_config_flags(
    parser: argparse.ArgumentParser,
    config_cls: type,
    defaults: Any | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """A flag per field but ``skip``, ``defaults`` (an instance) overriding; TypeError: no form."""
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
    """Build ``config_cls`` from parsed flags; a value it refuses, or a run that would not train
    (`require_trains`), is reported as the flag's (``--batch-size: got -3, expected >= 1``)
    through ``parser.error``, or raised as `ConfigError` without ``parser``."""
    names = [f.name for f in dataclasses.fields(config_cls)]
    try:
        config = config_cls(**{n: getattr(args, n) for n in names})
        require_trains(config)  # every command, not only the configs that check it themselves
        if "env_id" in names:  # before TensorFlow, which making the agent comes after
            require_env_actions(config)
        return config
    except NoTrainingError as err:
        defaulted = [  # the flags holding the parser's default (passed or not)
            n
            for n in ("steps", "learning_starts")
            if parser is not None and getattr(args, n) == parser.get_default(n)
        ]
        message = err.message(flag_name, defaulted, parser.prog if parser is not None else "")
    except ValueError as err:  # rg.ConfigError is one
        message = flag_message(err, names)
    if parser is not None:
        parser.error(message)
    raise ConfigError(message) from None


def flag_message(err: ValueError, names: Collection[str]) -> str:
    """An error about a field in ``names`` as its flag's (``--batch-size: ...``), others as is."""
    field_name, sep, rest = str(err).partition(": ")
    return f"{flag_name(field_name)}: {rest}" if sep and field_name in names else str(err)
