"""The one registry of the agents layer: each algorithm by name, and the demos built on them.

An `Algorithm` names its config class, the module that trains and evaluates it and, if served,
its `builder.Builder`. A run's ``run.json`` (written by `runs.RunControl`) stores the
name; ``replaygpu eval`` and resumes read it with `read_run_file`, without TensorFlow, so a
folder without a run is reported at once. A `Demo` is an algorithm plus preset hyperparameters.

Adding an algorithm: its config (with ``ENV_CHECK``, which makes and checks its env), its module
(``train(config, recorder, run)``, ``make_agent`` and ``evaluate_agent``),
one row in `ALGORITHMS`; a served one adds a `Builder` beside its agent; a demo, a `DEMOS` row.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from replaygpu.errors import ConfigError


def _load(path: str) -> Any:
    """The object at ``"package.module.Name"``."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Algorithm:
    """One algorithm the agents layer runs.

    Attributes:
        config: ``"module.Class"`` of its config (a module without TensorFlow).
        module: the module that trains it and rebuilds its networks for ``replaygpu eval``.
        builder: ``"module.Class"`` of its `builder.Builder`; "" if not served.
        learner_agent: the ``replaygpu learner --agent`` value that runs it; "" if none.
        frames: an ALE game's frames: ``replaygpu learner`` picks it for an ALE env id.
    """

    config: str
    module: str
    builder: str = ""
    learner_agent: str = ""
    frames: bool = False

    def config_class(self) -> type:
        """The config class (importing it imports no TensorFlow)."""
        return _load(self.config)

    def load(self) -> ModuleType:
        """The algorithm's module (imports TensorFlow)."""
        return importlib.import_module(self.module)


_AGENTS = "replaygpu.agents"


def _served(config: str, builder: str, learner_agent: str, frames: bool = False) -> Algorithm:
    """A served algorithm: ``config`` and ``builder`` under the agents package, each trained by
    the one learner module (`distributed.learner.train`)."""
    learner = f"{_AGENTS}.distributed.learner"
    return Algorithm(f"{_AGENTS}.{config}", learner, f"{_AGENTS}.{builder}", learner_agent, frames)


#: every algorithm, by the name a run.json stores
ALGORITHMS: dict[str, Algorithm] = {
    "dqn": Algorithm(f"{_AGENTS}.dqn.config.DQNConfig", f"{_AGENTS}.dqn.agent"),
    "atari-dqn": Algorithm(f"{_AGENTS}.dqn.config.AtariDQNConfig", f"{_AGENTS}.dqn.atari"),
    "sac": Algorithm(f"{_AGENTS}.sac.config.SACConfig", f"{_AGENTS}.sac.agent"),
    "r2d2": Algorithm(f"{_AGENTS}.r2d2.config.R2D2Config", f"{_AGENTS}.r2d2.agent"),
    "apex": _served("dqn.config.ApexConfig", "dqn.agent.VectorDQN", "dqn"),
    "apex-atari": _served("dqn.config.ApexAtariConfig", "dqn.atari.FrameDQN", "dqn", frames=True),
    "served-sac": _served("sac.config.SACLearnerConfig", "sac.agent.ServedSAC", "sac"),
    "served-r2d2": _served("r2d2.config.R2D2LearnerConfig", "r2d2.agent.ServedR2D2", "r2d2"),
}

#: the values of ``replaygpu learner --agent``
LEARNER_AGENTS = tuple(
    dict.fromkeys(a.learner_agent for a in ALGORITHMS.values() if a.learner_agent)
)


def algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; ConfigError if none is."""
    found = ALGORITHMS.get(name)
    if found is None:
        raise ConfigError(f"algorithm: got {name!r}, expected one of {sorted(ALGORITHMS)}")
    return found


def name_of(config: Any) -> str:
    """The name of ``config``'s algorithm; ConfigError if no algorithm has its class."""
    path = f"{type(config).__module__}.{type(config).__qualname__}"
    for name, entry in ALGORITHMS.items():
        if entry.config == path:
            return name
    raise ConfigError(
        f"config: got a {type(config).__name__}, expected the config of one of {sorted(ALGORITHMS)}"
    )


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` is an ALE game (its frames go into a frame table)."""
    import gymnasium as gym  # not for `replaygpu --help`

    try:
        entry_point = str(gym.spec(env_id).entry_point)
    except gym.error.Error:
        return env_id.startswith("ALE/")
    return "ale_py" in entry_point


def served(agent: str, env_id: str | None) -> str:
    """What ``learner --agent AGENT --env ENV_ID`` runs: for an ALE game, its frame one if any."""
    choices = [name for name, a in ALGORITHMS.items() if a.learner_agent == agent]
    if not choices:
        raise ConfigError(f"agent: got {agent!r}, expected one of {list(LEARNER_AGENTS)}")
    frames = bool(env_id) and is_atari(str(env_id))
    return next((n for n in choices if ALGORITHMS[n].frames == frames), choices[0])


def builder_for(config: Any) -> Any:
    """The `builder.Builder` of ``config``'s algorithm; ConfigError if not served."""
    name = name_of(config)
    path = ALGORITHMS[name].builder
    if not path:
        served_names = sorted(n for n, a in ALGORITHMS.items() if a.builder)
        raise ConfigError(
            f"LearnerService: got a {type(config).__name__} ({name}), which the learner service "
            f"does not serve; expected the config of one of {served_names}"
        )
    return _load(path)()


@dataclass(frozen=True)
class Demo:
    """A demo: an algorithm and the hyperparameters it starts from."""

    algorithm: str  # a name in ALGORITHMS
    summary: str
    preset: dict[str, Any] = field(default_factory=dict)
    checkpoint_every_s: float = 60.0  # default of --checkpoint-every-s
    # TF_NUM_INTRAOP_THREADS unless the environment sets it; None: one per core. 1 for the MLP
    # demos: their matmuls run as fast on one thread (0.506 against 0.508 ms an SGD step on 2
    # cores), while the pool's other threads spin on the acting core (`demo cartpole` under
    # load: 14.2 s against 17.6 s median, 14.7 s of CPU against 20; benchmarks/README.md)
    intra_op_threads: int | None = None


#: the columns of a `_zoo_dqn` row: rl-zoo3's DQN hyperparameters of one env
_ZOO_COLUMNS = (
    "env_id",
    "steps",
    "learning_rate",
    "buffer_size",
    "learning_starts",
    "gamma",
    "target_update_interval",
    "gradient_steps",
    "exploration_fraction",
    "exploration_final_eps",
)


def _zoo_dqn(*row: Any) -> Demo:
    """Double DQN with rl-zoo3's hyperparameters ``row`` (in `_ZOO_COLUMNS` order) and its
    batch of 128, updates batched per 64 env steps (rl-zoo3 trains every 4 or 16)."""
    preset = dict(zip(_ZOO_COLUMNS, row, strict=True), batch_size=128, train_freq=64)
    preset.update(double_q=True)  # as these demos were measured; rl-zoo3's SB3 DQN is not double
    return Demo(
        "dqn",
        f"double DQN on {preset['env_id']} (rl-zoo3 hyperparameters, updates batched per 64 steps)",
        preset,
        intra_op_threads=1,
    )


#: every demo of ``replaygpu demo NAME``
DEMOS: dict[str, Demo] = {
    "cartpole": Demo("dqn", "DQN on CartPole-v1 (rl-zoo3 hyperparameters)", intra_op_threads=1),
    # rl-zoo3's hyperparameters, in the order of _ZOO_COLUMNS
    "acrobot": _zoo_dqn("Acrobot-v1", 100_000, 6.3e-4, 50_000, 0, 0.99, 250, 64, 0.12, 0.1),
    "mountaincar": _zoo_dqn(
        "MountainCar-v0", 120_000, 4e-3, 10_000, 1000, 0.98, 600, 32, 0.2, 0.07
    ),
    "pendulum": Demo("sac", "SAC on Pendulum-v1 (twin critics, auto entropy)"),
    # rl-zoo3's SAC values for MuJoCo (SB3's defaults, learning_starts 10k; 1e6 steps there)
    "halfcheetah": Demo(
        "sac",
        "SAC on HalfCheetah-v5 (rl-zoo3 hyperparameters, updates batched per 64 steps; "
        "needs replaygpu[mujoco])",
        dict(
            env_id="HalfCheetah-v5",
            steps=300_000,
            learning_rate=3e-4,
            buffer_size=1_000_000,
            learning_starts=10_000,
            eval_episodes=10,
        ),
    ),
    "breakout": Demo(
        "atari-dqn",
        "DQN with the Nature CNN on ALE/Breakout-v5 (needs replaygpu[atari]; a frame table)",
        checkpoint_every_s=600.0,  # a checkpoint writes the whole frame table (0.7-7 GB)
    ),
    "pong": Demo(
        "atari-dqn",
        "DQN with the Nature CNN on ALE/Pong-v5 (needs replaygpu[atari]; a frame table)",
        dict(env_id="ALE/Pong-v5"),
        checkpoint_every_s=600.0,
    ),
    "apex-cartpole": Demo(
        "apex", "Ape-X DQN on CartPole-v1: a gRPC learner service plus actor processes"
    ),
    "apex-breakout": Demo(
        "apex-atari",
        "Ape-X DQN on ALE/Breakout-v5: a frame-table learner plus Atari actor processes",
        checkpoint_every_s=600.0,  # a checkpoint writes the whole frame table
    ),
    "r2d2-cartpole": Demo(
        "r2d2",
        "R2D2 (LSTM on prioritized sequences with a stored state and burn-in) on CartPole "
        "with the velocities masked (CartPoleNoVelocity-v1)",
    ),
}


#: the file in a checkpoint folder naming the algorithm and its config
RUN_FILE = "run.json"


def read_json(path: str) -> dict[str, Any]:
    """A run file's contents; ConfigError if unreadable, not JSON or without the expected keys."""
    try:
        with open(path) as f:
            saved = json.load(f)
        if not {"algorithm", "config"} <= set(saved):
            raise ValueError("it lacks algorithm or config")
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{path}: not a readable run file ({type(err).__name__}: {err}); it is written by "
            "`replaygpu demo`/`replaygpu learner` beside their checkpoints"
        ) from None
    return saved


def read_run_file(path: str) -> tuple[str, dict[str, Any], str]:
    """``(algorithm name, config values, checkpoint folder)`` of a run folder or its
    ``checkpoints/`` folder; ConfigError if neither holds a ``run.json``."""
    for folder in (os.path.join(path, "checkpoints"), path):
        file = os.path.join(folder, RUN_FILE)
        if os.path.isfile(file):
            saved = read_json(file)
            return saved["algorithm"], saved["config"], folder
    raise ConfigError(
        f"{path!r}: no {RUN_FILE} in it or in its checkpoints/ folder; expected a run folder "
        "of `replaygpu demo`/`replaygpu learner` or its checkpoint folder"
    )
