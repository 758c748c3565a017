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


def require_env_id(env_id: str) -> None:
    """``env_id`` is a registered gymnasium id (``masked_envs``' included); an ``ALE/...`` id
    is left to `atari.check_env`, which says which extra to install when ale-py is missing.
    Needs no TensorFlow, so a CLI says it before importing it."""
    import gymnasium as gym

    import replaygpu.agents.masked_envs  # noqa: F401  (registers its ids)

    if not env_id.startswith("ALE/") and env_id not in gym.registry:
        raise rg.ConfigError(
            f"env_id: got {env_id!r}, which gymnasium does not know; expected a registered id "
            "such as 'CartPole-v1' (see gymnasium.pprint_registry())"
        )


#: the help of the ``steps`` field of a config that `require_vector_loop` checks
STEPS_HELP = (
    "env steps to train for, exactly (the last chunk is shorter, with SGD steps in proportion); "
    "rerun a finished run with a larger value to continue it (its schedules follow the new "
    "length)"
)


def require_vector_loop(config: Any, *positive: str) -> None:
    """The fields of a single-process training loop over a vector env (DQN's, SAC's): the run
    length and sizes (and each of ``positive``) >= 1, ``learning_starts`` >= 0, ``gamma`` in
    [0, 1], ``learning_rate`` > 0, ``hidden_sizes``, and ``train_freq`` and ``steps``
    multiples of ``num_envs`` (chunks, the last one too, hold whole vector steps)."""
    sizes = ("batch_size", "buffer_size", "train_freq", "gradient_steps", "num_envs")
    require_positive_ints(config, "steps", *sizes, "eval_episodes", *positive)
    require(config, ["learning_starts"], lambda v: v >= 0, ">= 0")
    require_unit_interval(config, "gamma")
    require_positive(config, "learning_rate")
    require_widths(config)
    n = config.num_envs
    whole = f"a multiple of num_envs ({n}), as each vector step takes {n} env steps"
    require(config, ["train_freq", "steps"], lambda v: v % n == 0, whole)
