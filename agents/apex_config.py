"""Ape-X DQN's config and the networks it builds: what both runners of the algorithm share,
the in-process demo (`apex.train`, ``demo apex-cartpole``) and the standalone learner
(`learner.LearnerService`, ``replaygpu learner --agent dqn``), so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym

from replaygpu.agents.config_parts import (
    DecayedLearningRate,
    discrete_actions_env,
    require,
    require_positive,
    require_positive_ints,
    require_trains,
    require_unit_interval,
    require_widths,
)
from replaygpu.agents.flags import helptext

if TYPE_CHECKING:  # imported when an agent is made: the config alone needs no TensorFlow
    from replaygpu.agents.dqn import DQN

#: help of the ``devices`` field of the learners' configs (`ApexConfig`, `SACLearnerConfig`)
DEVICES_HELP = helptext(
    "data-parallel learner over these devices, e.g. /gpu:0,/gpu:1 (one replay shard each; "
    "/cpu:0,/cpu:1 splits the CPU, to try it); empty: one device"
)


@dataclass(frozen=True)
class ApexConfig(DecayedLearningRate):
    """Ape-X DQN hyperparameters: the rl-zoo3 CartPole DQN network and replay ratio, with the
    Ape-X paper's 3-step returns, batch 128 and a learning rate decayed linearly to a small
    floor, ``final_learning_rate``, over the SGD steps of the replay budget
    (`DecayedLearningRate`; ``steps`` 0, no end: constant)."""

    #: makes the env and checks it has the actions its agent takes (the CLI, before TensorFlow)
    ENV_CHECK: ClassVar[Callable[[str], Any]] = discrete_actions_env

    env_id: str = field(default="CartPole-v1", metadata=helptext("gymnasium env id (Discrete)"))
    seed: int = field(default=1, metadata=helptext("seed of actors, networks and sampling"))
    steps: int = field(
        default=80_000,
        metadata=helptext(
            "env steps collected by all actors; 0: run until stopped (a service), with a "
            "constant learning rate"
        ),
    )
    num_actors: int = field(default=2, metadata=helptext("actor processes"))
    actor_envs: int = field(
        default=1,
        metadata=helptext(
            "envs per actor, one batched policy call per vector step (on CartPole with this "
            "step budget, wider vector envs learned worse; see benchmarks/README.md)"
        ),
    )
    weight_pull_interval: int = field(
        default=512, metadata=helptext("actor env steps between weight pulls (K)")
    )
    learning_rate: float = field(default=2e-3, metadata=helptext("Adam step size at the start"))
    final_learning_rate: float = field(
        default=2e-5,
        metadata=helptext(
            "Adam step size at the end, > 0: linear decay over the SGD steps that the replay "
            "budget allows (steps x samples_per_insert / batch_size), then constant"
        ),
    )
    batch_size: int = field(default=128, metadata=helptext("minibatch size of each SGD step"))
    buffer_size: int = field(default=100_000, metadata=helptext("replay table capacity"))
    learning_starts: int = field(default=1000, metadata=helptext("rows before the first SGD step"))
    samples_per_insert: float = field(
        default=32.0, metadata=helptext("rate limit: sampled rows per inserted row")
    )
    steps_per_call: int = field(default=128, metadata=helptext("SGD steps per Learner.train call"))
    target_update_interval: int = field(
        default=128, metadata=helptext("SGD steps between target-network syncs")
    )
    gamma: float = field(default=0.99, metadata=helptext("discount factor"))
    n_step: int = field(
        default=3,
        metadata=helptext(
            "n-step returns (Ape-X: 3) by rg.NStep over each actor env's own rows; "
            "1: one-step targets"
        ),
    )
    hidden_sizes: tuple[int, ...] = field(default=(256, 256), metadata=helptext("MLP widths"))
    max_grad_norm: float = field(default=10.0, metadata=helptext("gradient clipping global norm"))
    double_q: bool = field(default=True, metadata=helptext("double DQN targets"))
    prioritized: bool = field(
        default=False,
        metadata=helptext(
            "prioritized replay as in the Ape-X paper (off by default: with these "
            "hyperparameters it learned CartPole worse; see benchmarks/README.md)"
        ),
    )
    priority_alpha: float = field(default=0.6, metadata=helptext("priority exponent"))
    priority_beta: float = field(default=0.4, metadata=helptext("importance-weight exponent"))
    eval_episodes: int = field(default=20, metadata=helptext("greedy evaluation episodes"))
    jit_compile: bool = field(default=True, metadata=helptext("compile the SGD loop with XLA"))
    address: str = field(default="127.0.0.1:0", metadata=helptext("where the learner serves"))
    device: str = field(default="", metadata=helptext("TF device; empty: first GPU, else CPU"))
    devices: str = field(default="", metadata=DEVICES_HELP)

    def __post_init__(self) -> None:
        positive = [
            "num_actors",
            "actor_envs",
            "weight_pull_interval",
            "batch_size",
            "buffer_size",
            "learning_starts",
            "steps_per_call",
            "target_update_interval",
            "n_step",
            "eval_episodes",
        ]
        require_positive_ints(self, *positive)
        require_positive(self, "learning_rate", "samples_per_insert")
        self.check_learning_rates()
        require_unit_interval(self, "gamma")
        require(self, ["steps"], lambda v: v >= 0, ">= 0 (0: until stopped)")
        require_trains(self)
        require_widths(self)

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains (`config_parts.require_trains`): the rate limiter samples
        once the table holds ``learning_starts`` rows."""
        return self.learning_starts

    @property
    def total_sgd_steps(self) -> int:
        """SGD steps the rate limiter allows once all ``steps`` rows are inserted."""
        return total_sgd_steps(self)


def total_sgd_steps(config: Any) -> int:
    """SGD steps a learner config's rate limiter allows once all its ``steps`` rows are
    inserted: ``samples_per_insert`` x (``steps`` - ``learning_starts``) rows sampled, plus one
    call's error buffer, in minibatches of ``batch_size`` (any learner config)."""
    budget = config.samples_per_insert * (config.steps - config.learning_starts)
    return max(1, int((budget + config.batch_size * config.steps_per_call) // config.batch_size))


def make_agent(config: ApexConfig, env: gym.Env) -> DQN:
    """The agent's networks for ``env`` (what ``replaygpu eval`` restores)."""
    from replaygpu.agents.dqn import DQN, obs_size

    obs_dim = obs_size(env.observation_space)
    return DQN(obs_dim, int(env.action_space.n), config, config.learning_rate_schedule)
