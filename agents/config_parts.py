"""What the agents' frozen configs are built from, without TensorFlow (the CLI builds and checks
a config before TensorFlow is imported): the range checks they share (`require` and its kin,
each raising `ConfigError` with the field's name), and what changes over a run, which they mix
in: the exploration rate (`LinearEpsilon`), Adam's step size (`DecayedLearningRate`), and the
chunks of a vector training loop (`next_chunk`, `training_calls`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

import replaygpu as rg

if TYPE_CHECKING:
    from replaygpu.samplers import LinearSchedule


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
    """``env_id`` is a registered gymnasium id (``masked_envs``' and, when ale-py is installed,
    its ``ALE/...`` games included). Without ale-py an ``ALE/...`` id is left to
    `atari.check_env`, which says which extra to install. Needs no TensorFlow, so a CLI says it
    before importing it."""
    import difflib

    import gymnasium as gym

    import replaygpu.agents.masked_envs  # noqa: F401  (registers its ids)

    example = "'CartPole-v1'"
    if env_id.startswith("ALE/"):
        try:
            import ale_py
        except ImportError:
            return
        gym.register_envs(ale_py)
        example = "'ALE/Breakout-v5'"
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise rg.ConfigError(
            f"env_id: got {env_id!r}, which gymnasium does not know; {hint}expected a registered "
            f"id such as {example} (see gymnasium.pprint_registry())"
        )


def discrete_actions_env(env_id: str) -> Any:
    """Make ``env_id`` and check that its actions are Discrete (DQN, Ape-X, R2D2); returns the
    env (close it). Needs no TensorFlow.

    Raises:
        ConfigError: the action space is not Discrete (gymnasium's own errors for an unknown
            env id).
    """
    import gymnasium as gym

    env = gym.make(env_id)
    if not isinstance(env.action_space, gym.spaces.Discrete):
        env.close()
        raise rg.ConfigError(
            f"env {env_id}: got action space {env.action_space}, expected Discrete; use the "
            "SAC agent for Box actions"
        )
    return env


def box_actions_env(env_id: str) -> Any:
    """Make ``env_id`` and check that its actions are a bounded Box and its observations a Box
    (SAC); returns the env (close it). Needs no TensorFlow.

    Raises:
        ConfigError: another action or observation space (gymnasium's own errors for an
            unknown env id).
    """
    import gymnasium as gym

    env = gym.make(env_id)
    space = env.action_space
    if not (isinstance(space, gym.spaces.Box) and space.is_bounded()):
        env.close()
        raise rg.ConfigError(
            f"env {env_id}: got action space {space}, expected a bounded Box; use the DQN "
            "agent for Discrete actions"
        )
    if not isinstance(env.observation_space, gym.spaces.Box):
        observation_space = env.observation_space
        env.close()
        raise rg.ConfigError(
            f"env {env_id}: got observation space {observation_space}, expected a Box (the SAC "
            "networks take flat vectors); flatten a Dict or Tuple space with "
            "gymnasium.wrappers.FlattenObservation, or use the DQN agent, which takes them"
        )
    return env


def require_env_actions(config: Any) -> None:
    """The config's env id is known and its env has the actions (and observations) its agent
    takes: the config class's ``ENV_CHECK`` (`discrete_actions_env`, `box_actions_env`) makes
    and checks it; a class without one (the Atari configs) and ALE ids are left to
    `atari.check_env`, like `require_env_id`. Needs no TensorFlow, so a CLI says it at once."""
    require_env_id(config.env_id)
    check = getattr(type(config), "ENV_CHECK", None)
    if check is not None and not config.env_id.startswith("ALE/"):
        check(config.env_id).close()


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


class NoTrainingError(rg.ConfigError):
    """A run whose ``steps`` end before its first SGD step (`require_trains`): it would act,
    evaluate an untrained network and exit as if it had trained.

    Attributes:
        steps: the run's ``steps``.
        first: the least ``steps`` that trains (the config's ``steps_to_train``).
        learning_starts: the config's ``learning_starts``.
    """

    def __init__(self, steps: int, first: int, learning_starts: int) -> None:
        self.steps, self.first, self.learning_starts = steps, first, learning_starts
        super().__init__(self.message())

    def message(
        self,
        name: Callable[[str], str] = str,
        defaulted: Collection[str] = (),
        command: str = "",
    ) -> str:
        """The error in the words of its reader: ``name`` spells a field (`flags.flag_name`
        for a command line); the fields in ``defaulted`` hold ``command``'s default, so the
        message names the flag to pass first."""
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
    """A run of ``config.steps`` makes at least one SGD step: ``steps`` >= the config's
    ``steps_to_train``, the least run length its training loop trains in (after
    ``learning_starts``, by the loop's own rule). ``steps`` 0 (a service run until stopped)
    and configs without ``steps_to_train`` pass. Every command checks it before TensorFlow
    is imported (`flags.config_from_args`). Needs no TensorFlow.

    Raises:
        NoTrainingError: the run would end before its first SGD step.
    """
    first = getattr(config, "steps_to_train", None)
    if first is not None and config.steps and config.steps < first:
        raise NoTrainingError(config.steps, first, config.learning_starts)


class LinearEpsilon:
    """The linear exploration schedule of a DQN config with ``steps``, ``exploration_fraction``
    and ``exploration_initial_eps`` / ``exploration_final_eps`` fields (mixed into the configs)."""

    steps: int
    exploration_fraction: float
    exploration_initial_eps: float
    exploration_final_eps: float

    def epsilon(self, env_steps: int) -> float:
        """Linearly decayed exploration rate after ``env_steps`` env steps."""
        progress = min(1.0, env_steps / (self.exploration_fraction * self.steps))
        start, end = self.exploration_initial_eps, self.exploration_final_eps
        return start + progress * (end - start)


class DecayedLearningRate:
    """Adam's step size of a config with ``steps``, ``learning_rate`` and ``final_learning_rate``
    fields and a ``total_sgd_steps`` property (mixed into the configs): linear from
    ``learning_rate`` to ``final_learning_rate`` over the run's SGD steps, then constant.

    The floor is > 0, so SGD steps past the end (a last call, a resumed run) still learn and no
    run trains at rate 0. ``final_learning_rate`` None, or ``steps`` 0 (a run without an end):
    the constant ``learning_rate``.
    """

    steps: int
    learning_rate: float
    final_learning_rate: float | None

    @property
    def total_sgd_steps(self) -> int:
        """The SGD steps of the whole run, over which the rate decays."""
        raise NotImplementedError

    def check_learning_rates(self) -> None:
        """Raise `ConfigError` unless ``0 < final_learning_rate <= learning_rate`` (or None)."""
        if self.final_learning_rate is None:
            return
        if not 0.0 < self.final_learning_rate <= self.learning_rate:
            raise rg.ConfigError(
                f"final_learning_rate: got {self.final_learning_rate}, expected in "
                f"(0, learning_rate={self.learning_rate}]: a learner never trains at rate 0; "
                "pass --final-learning-rate, e.g. learning_rate / 100"
            )

    @property
    def learning_rate_schedule(self) -> LinearSchedule | float:
        """The step size (evaluated in the graph at every SGD step) or a constant one for a run
        without an end."""
        if not self.steps or self.final_learning_rate is None:
            return self.learning_rate
        from replaygpu.samplers import LinearSchedule  # TensorFlow: only learners ask

        return LinearSchedule(self.learning_rate, self.final_learning_rate, self.total_sgd_steps)


def next_chunk(config: Any, env_steps: int) -> tuple[int, int]:
    """``(env steps, SGD steps)`` of a training loop's next chunk, after ``env_steps``:
    ``train_freq`` and ``gradient_steps`` of a config; the run's last chunk is what is left of
    its ``steps``, trained with SGD steps in proportion (at least 1), so that ``--steps N`` runs
    exactly N env steps at the configured replay ratio."""
    left = config.steps - env_steps
    if left >= config.train_freq:
        return config.train_freq, config.gradient_steps
    return left, max(1, config.gradient_steps * left // config.train_freq)


def steps_to_train(config: Any) -> int:
    """The least ``steps`` of a vector loop (`next_chunk`) that makes a training call: its last
    chunk ends at ``steps``, and a call follows each chunk that ends past ``learning_starts``
    (`training_calls`)."""
    return config.learning_starts + 1


def training_calls(config: Any) -> list[int]:
    """The SGD steps of each training call of a vector loop's whole run: one after each chunk
    (`next_chunk`) that ends past ``learning_starts``."""
    calls, env_steps = [], 0
    while env_steps < config.steps:
        size, sgd_steps = next_chunk(config, env_steps)
        env_steps += size
        if env_steps > config.learning_starts:
            calls.append(sgd_steps)
    return calls
