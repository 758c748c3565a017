"""SAC's configs, without TensorFlow: `SACConfig` (``demo pendulum``) and `SACLearnerConfig`
(``replaygpu learner --agent sac``). The CLI builds and checks them before TensorFlow is
imported, so a bad flag is reported at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import replaygpu as rg

from ..configs import (
    STEPS_HELP,
    helptext,
    require_positive,
    require_positive_ints,
    require_unit_interval,
    require_vector_loop,
)
from ..dqn.config import DEVICES_HELP
from ..envs import box_actions_env


@dataclass(frozen=True)
class SACConfig:
    """SAC hyperparameters; the defaults follow rl-zoo3's Pendulum-v1 values (updates batched)."""

    #: makes the env and checks it has the actions its agent takes (the CLI, before TensorFlow)
    ENV_CHECK: ClassVar[Callable[[str], Any]] = box_actions_env

    env_id: str = field(default="Pendulum-v1", metadata=helptext("gymnasium env id (Box actions)"))
    seed: int = field(default=1, metadata=helptext("seed of envs, networks, sampling and noise"))
    steps: int = field(default=20_000, metadata=helptext(STEPS_HELP))
    learning_rate: float = field(default=1e-3, metadata=helptext("Adam step size (all nets)"))
    batch_size: int = field(default=256, metadata=helptext("minibatch size of each SGD step"))
    buffer_size: int = field(default=100_000, metadata=helptext("replay table capacity"))
    learning_starts: int = field(
        default=100, metadata=helptext("env steps of uniform random actions before training")
    )
    gamma: float = field(default=0.99, metadata=helptext("discount factor"))
    tau: float = field(default=0.005, metadata=helptext("target critic Polyak rate per SGD step"))
    train_freq: int = field(default=64, metadata=helptext("env steps between training calls"))
    gradient_steps: int = field(default=64, metadata=helptext("SGD steps per training call"))
    hidden_sizes: tuple[int, ...] = field(default=(256, 256), metadata=helptext("MLP widths"))
    initial_alpha: float = field(default=1.0, metadata=helptext("initial entropy coefficient"))
    target_entropy_scale: float = field(
        default=1.0, metadata=helptext("target entropy = -scale * action dimensions")
    )
    num_envs: int = field(default=1, metadata=helptext("envs stepped together (one policy call)"))
    eval_episodes: int = field(default=10, metadata=helptext("greedy evaluation episodes"))
    jit_compile: bool = field(default=True, metadata=helptext("compile the SGD loop with XLA"))
    device: str = field(default="", metadata=helptext("TF device; empty: first GPU, else CPU"))

    def __post_init__(self) -> None:
        require_vector_loop(self)
        require_unit_interval(self, "tau")
        require_positive(self, "initial_alpha")

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains (`configs.require_trains`): `sac.train` trains after
        each chunk that ends at or past ``learning_starts``; a served learner's rate limiter
        samples once the table holds ``learning_starts`` rows."""
        return max(1, self.learning_starts)


@dataclass(frozen=True)
class SACLearnerConfig(SACConfig):
    """SAC served to remote actors: `SACConfig`'s update, with a samples-per-insert rate limit
    in place of the demo's train_freq/gradient_steps (the defaults keep its ratio: 64 steps of
    256 rows per 64 env steps)."""

    steps: int = field(
        default=20_000,
        metadata=helptext("env steps collected by all actors; 0: run until stopped (a service)"),
    )
    samples_per_insert: float = field(
        default=256.0, metadata=helptext("rate limit: sampled rows per inserted row")
    )
    steps_per_call: int = field(default=64, metadata=helptext("SGD steps per Learner.train call"))
    num_actors: int = field(default=2, metadata=helptext("actor processes (demo) / fleet size"))
    actor_envs: int = field(default=1, metadata=helptext("envs per actor"))
    weight_pull_interval: int = field(
        default=256, metadata=helptext("actor env steps between weight pulls")
    )
    address: str = field(default="127.0.0.1:0", metadata=helptext("where the learner serves"))
    devices: str = field(default="", metadata=DEVICES_HELP)

    def __post_init__(self) -> None:
        if self.steps == 0:  # until stopped: check the other fields as if the run had a length
            dataclasses.replace(self, steps=1)
        elif self.steps < 0:
            raise rg.ConfigError(f"steps: got {self.steps}, expected >= 0 (0: until stopped)")
        else:
            super().__post_init__()
        require_positive_ints(
            self, "steps_per_call", "num_actors", "actor_envs", "weight_pull_interval"
        )
        require_positive(self, "samples_per_insert")
