"""R2D2's configs, without TensorFlow: `R2D2Config` (``demo r2d2-cartpole``) and
`R2D2LearnerConfig` (``replaygpu learner --agent r2d2``, built by `r2d2.agent.ServedR2D2`). The
CLI builds and checks them before TensorFlow is imported, so a bad flag is reported at once.

The sequence terms are Acme's: a stored sequence is ``sequence_length`` steps, of which the
first ``burn_in`` only warm up the LSTM state; the actor stores its state every ``period``
steps of an episode, and sequences start there, so consecutive sequences overlap by
``sequence_length - period`` steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import replaygpu as rg

from ..configs import (
    LinearEpsilon,
    helptext,
    require,
    require_positive,
    require_positive_ints,
    require_unit_interval,
)
from ..envs import CARTPOLE_NO_VELOCITY, discrete_actions_env


@dataclass(frozen=True)
class R2D2Config(LinearEpsilon):
    """Recurrent replay DQN (Kapturowski et al. 2019) at CartPole scale: an LSTM Q-network on
    prioritized, overlapping sequences with a stored state and a burn-in, n-step double Q with
    value rescaling, priorities eta * max + (1 - eta) * mean of |TD| over each sequence."""

    #: makes the env and checks it has the actions its agent takes (the CLI, before TensorFlow)
    ENV_CHECK: ClassVar[Callable[[str], Any]] = discrete_actions_env

    env_id: str = field(
        default=CARTPOLE_NO_VELOCITY,
        metadata=helptext("gymnasium env id (Discrete actions, flat Box observations)"),
    )
    seed: int = field(default=1, metadata=helptext("seed of env, networks, sampling, exploration"))
    steps: int = field(default=100_000, metadata=helptext("env steps to train for"))
    sequence_length: int = field(
        default=30, metadata=helptext("steps per replayed sequence, the burn-in included")
    )
    burn_in: int = field(
        default=10, metadata=helptext("first steps of a sequence that only warm up the state")
    )
    period: int = field(
        default=10,
        metadata=helptext("env steps between stored states (sequence starts); <= the length"),
    )
    lstm_units: int = field(default=64, metadata=helptext("LSTM units"))
    torso_size: int = field(default=64, metadata=helptext("dense layer before the LSTM"))
    learning_rate: float = field(default=2e-3, metadata=helptext("Adam step size"))
    batch_size: int = field(default=32, metadata=helptext("sequences per SGD step"))
    buffer_size: int = field(default=100_000, metadata=helptext("replay table capacity (steps)"))
    learning_starts: int = field(default=2000, metadata=helptext("env steps before training"))
    train_freq: int = field(default=200, metadata=helptext("env steps between training calls"))
    gradient_steps: int = field(default=25, metadata=helptext("SGD steps per training call"))
    target_update_period: int = field(
        default=25, metadata=helptext("SGD steps between target-network syncs (in the graph)")
    )
    gamma: float = field(default=0.99, metadata=helptext("discount factor"))
    n_step: int = field(default=5, metadata=helptext("n-step double-Q targets within a sequence"))
    rescale_epsilon: float = field(
        default=1e-3, metadata=helptext("eps of the value rescaling h(x) (0: no rescaling)")
    )
    priority_eta: float = field(
        default=0.9, metadata=helptext("sequence priority: eta * max + (1 - eta) * mean |TD|")
    )
    priority_exponent: float = field(default=0.9, metadata=helptext("priority exponent alpha"))
    importance_exponent: float = field(default=0.6, metadata=helptext("importance exponent beta"))
    max_grad_norm: float = field(default=10.0, metadata=helptext("gradient clipping global norm"))
    exploration_fraction: float = field(
        default=0.3, metadata=helptext("fraction of the run over which epsilon decays")
    )
    exploration_initial_eps: float = field(default=1.0, metadata=helptext("epsilon at the start"))
    exploration_final_eps: float = field(default=0.01, metadata=helptext("epsilon after decay"))
    eval_episodes: int = field(default=20, metadata=helptext("greedy evaluation episodes"))
    jit_compile: bool = field(default=True, metadata=helptext("compile the SGD loop with XLA"))
    device: str = field(default="", metadata=helptext("TF device; empty: first GPU, else CPU"))

    def __post_init__(self) -> None:
        positive = [
            "steps",
            "sequence_length",
            "period",
            "lstm_units",
            "torso_size",
            "batch_size",
            "buffer_size",
            "train_freq",
            "gradient_steps",
            "target_update_period",
            "n_step",
            "eval_episodes",
        ]
        require_positive_ints(self, *positive)
        require(self, ["learning_starts", "burn_in", "rescale_epsilon"], lambda v: v >= 0, ">= 0")
        require_unit_interval(self, "gamma", "priority_eta", "exploration_initial_eps")
        require_unit_interval(self, "exploration_final_eps", "importance_exponent")
        require_positive(self, "learning_rate", "exploration_fraction")
        require(self, ["priority_exponent"], lambda v: v >= 0, ">= 0")
        if self.sequence_length <= self.burn_in:
            raise rg.ConfigError(
                f"sequence_length: got {self.sequence_length}, expected > burn_in "
                f"({self.burn_in}): the steps after the burn-in are the ones trained on; "
                "raise sequence_length or lower burn_in"
            )
        if self.period > self.trace_length:
            raise rg.ConfigError(
                f"period: got {self.period}, expected <= the trained length "
                f"{self.trace_length} (sequence_length {self.sequence_length} - burn_in "
                f"{self.burn_in}); a longer period leaves steps no sequence trains on"
            )
        if self.buffer_size < self.sequence_length:
            raise rg.ConfigError(
                f"buffer_size: got {self.buffer_size}, expected >= sequence_length "
                f"({self.sequence_length})"
            )

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains (`configs.require_trains`): `r2d2.train` acts whole
        chunks of ``train_freq`` env steps and trains after each that ends at or past
        ``learning_starts``."""
        chunks = -(-self.learning_starts // self.train_freq)  # the first one that trains
        return max(1, (chunks - 1) * self.train_freq + 1)

    @property
    def trace_length(self) -> int:
        """T, the steps of a sequence after its burn-in (the ones with a loss)."""
        return self.sequence_length - self.burn_in


@dataclass(frozen=True)
class R2D2LearnerConfig(R2D2Config):
    """R2D2 served to remote actors: `R2D2Config`'s network and update, prioritized sequences
    that actors send overlapping (one of ``sequence_length`` steps every ``period`` steps, with
    the LSTM state before its first step), and a samples-per-insert rate limit in place of the
    demo's train_freq/gradient_steps. A sequence's rows are stored once per sequence, so each
    env step inserts about sequence_length / period rows (3 with the defaults); the default
    limit of 1.5 sequences per inserted row is about the demo's 4 sequences per env step.
    The demo's epsilon schedule does not apply: actor i of N explores with Ape-X's epsilon."""

    steps: int = field(
        default=180_000,
        metadata=helptext(
            "table rows inserted by all actors (about sequence_length / period per env step: "
            "the default is about the demo's 60k env steps); 0: run until stopped (a service)"
        ),
    )
    learning_starts: int = field(
        default=5000, metadata=helptext("table rows before the first SGD step")
    )
    samples_per_insert: float = field(
        default=1.5, metadata=helptext("rate limit: sampled sequences per inserted row")
    )
    steps_per_call: int = field(default=32, metadata=helptext("SGD steps per Learner.train call"))
    num_actors: int = field(default=2, metadata=helptext("actor processes (demo) / fleet size"))
    actor_envs: int = field(default=1, metadata=helptext("envs per actor"))
    weight_pull_interval: int = field(
        default=400, metadata=helptext("actor env steps between weight pulls")
    )
    address: str = field(default="127.0.0.1:0", metadata=helptext("where the learner serves"))

    def __post_init__(self) -> None:
        require(self, ["steps"], lambda v: v >= 0, ">= 0 (0: until stopped)")
        if not self.steps:  # a service: its other fields are checked as for a run with a length
            dataclasses.replace(self, steps=1)
            return
        super().__post_init__()
        require_positive_ints(
            self, "steps_per_call", "num_actors", "actor_envs", "weight_pull_interval"
        )
        require_positive(self, "samples_per_insert")

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains (`configs.require_trains`): the rate limiter samples
        once the table holds ``learning_starts`` rows."""
        return max(1, self.learning_starts)
