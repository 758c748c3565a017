"""R2D2's configs (no TensorFlow, see `configs`): `R2D2Config` (``demo r2d2-cartpole``) and
`R2D2LearnerConfig` (``replaygpu learner --agent r2d2``, built by `r2d2.agent.ServedR2D2`),
both `R2D2Settings`.

The sequence terms are Acme's: a sequence is ``sequence_length`` steps, the first ``burn_in``
only warming up the LSTM state; the actor stores its state every ``period`` steps, where
sequences start, so consecutive ones overlap by ``sequence_length - period`` steps (windows of
the stored steps: each step is stored once).
"""

from __future__ import annotations

from dataclasses import dataclass

import replaygpu as rg

from ..config_fields import (
    ActorEnvs,
    BestOfEvaluations,
    ClippedGradients,
    DecayedLearningRate,
    Device,
    LinearEpsilon,
    Replay,
    Run,
    Served,
    TrainingCalls,
    UntilStopped,
    defaults,
    option,
)
from ..configs import (
    require,
    require_positive,
    require_positive_ints,
    require_unit_interval,
    total_sgd_steps,
)
from ..envs import CARTPOLE_NO_VELOCITY, discrete_actions_env


@dataclass(frozen=True)
class R2D2Settings(
    Device,
    defaults(LinearEpsilon, exploration_fraction=0.3),
    ClippedGradients,
    defaults(TrainingCalls, train_freq=200, gradient_steps=25),
    defaults(Replay, learning_starts=2000),
    defaults(DecayedLearningRate, learning_rate=2e-3, final_learning_rate=2e-4),
    Run,
):
    """Recurrent replay DQN (Kapturowski et al. 2019) at CartPole scale: an LSTM Q-network on
    prioritized, overlapping sequences with a stored state and a burn-in, n-step double Q with
    value rescaling, priorities eta * max + (1 - eta) * mean of |TD| over each sequence. What
    the demo (`R2D2Config`) and the served learner (`R2D2LearnerConfig`) share."""

    ENV_CHECK = discrete_actions_env

    env_id: str = option(
        CARTPOLE_NO_VELOCITY, "gymnasium env id (Discrete actions, flat Box observations)"
    )
    steps: int = option(100_000, "env steps to train for")
    sequence_length: int = option(30, "steps per replayed sequence, the burn-in included")
    burn_in: int = option(10, "first steps of a sequence that only warm up the state")
    period: int = option(10, "env steps between stored states (sequence starts); <= the length")
    lstm_units: int = option(64, "LSTM units")
    torso_size: int = option(64, "dense layer before the LSTM")
    batch_size: int = option(32, "sequences per SGD step")
    buffer_size: int = option(100_000, "replay table capacity (steps)")
    target_update_period: int = option(25, "SGD steps between target-network syncs (in the graph)")
    n_step: int = option(5, "n-step double-Q targets within a sequence")
    rescale_epsilon: float = option(1e-3, "eps of the value rescaling h(x) (0: no rescaling)")
    priority_eta: float = option(0.9, "sequence priority: eta * max + (1 - eta) * mean |TD|")
    priority_exponent: float = option(0.9, "priority exponent alpha")
    importance_exponent: float = option(0.6, "importance exponent beta")

    def __post_init__(self) -> None:
        super().__post_init__()
        sizes = ["sequence_length", "period", "lstm_units", "torso_size", "target_update_period"]
        require_positive_ints(self, "steps", *sizes, "n_step", "eval_episodes")
        require(self, ["burn_in", "rescale_epsilon", "priority_exponent"], lambda v: v >= 0, ">= 0")
        require_unit_interval(self, "priority_eta", "importance_exponent")
        require_positive(self, "exploration_fraction")
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
        """The least ``steps`` that trains: `r2d2.train` acts whole ``train_freq`` chunks and
        trains after each that ends at or past ``learning_starts``."""
        chunks = -(-self.learning_starts // self.train_freq)  # the first one that trains
        return max(1, (chunks - 1) * self.train_freq + 1)

    @property
    def trace_length(self) -> int:
        """T, the steps of a sequence after its burn-in (the ones with a loss)."""
        return self.sequence_length - self.burn_in


@dataclass(frozen=True)
class R2D2Config(BestOfEvaluations, R2D2Settings):
    """`R2D2Settings` for ``demo r2d2-cartpole``: the run hands back the weights of its best
    greedy evaluation while training (``keep_best``), as DQN's does."""

    @property
    def total_sgd_steps(self) -> int:
        """SGD steps of the whole run: ``gradient_steps`` after each ``train_freq`` chunk that
        ends at or past ``learning_starts`` (`steps_to_train`), the last one whole."""
        chunks = -(-self.steps // self.train_freq)
        first = max(1, -(-self.learning_starts // self.train_freq))
        return max(1, (chunks - first + 1) * self.gradient_steps)


@dataclass(frozen=True)
class R2D2LearnerConfig(
    UntilStopped,
    BestOfEvaluations,
    ActorEnvs,
    defaults(Served, weight_pull_interval=400, steps_per_call=32),
    R2D2Settings,
):
    """R2D2 served to remote actors: `R2D2Settings`' network and update on the steps actors
    send, each stored once as the demo stores them (blocks of one env's consecutive steps with
    the LSTM state before each, `experience.StepBlockWriter`), windows sampled from them by the
    `Sequence` view, and a samples-per-insert rate limit in place of the demo's
    train_freq/gradient_steps (the default, 4 sequences per step, is the demo's 200/25 at batch
    32). The demo's epsilon schedule does not apply: actor i of N explores with Ape-X's epsilon.
    The learner hands back the weights of its best greedy evaluation while training
    (``keep_best``), as the demo does."""

    steps: int = option(
        100_000,
        "env steps inserted by all actors (table rows: each step is stored once); 0: run until "
        "stopped (a service)",
    )
    learning_starts: int = option(2000, "env steps (table rows) before the first SGD step")
    samples_per_insert: float = option(4.0, "rate limit: sampled sequences per inserted step")
    final_learning_rate: float | None = option(
        None,
        "Adam step size at the end, > 0: linear decay over the SGD steps that the replay budget "
        "allows, then constant; none: a constant learning_rate (the default: served R2D2 "
        "solved CartPole on 8 of 10 seeds with it, on 6 of 10 decayed to 2e-4; "
        "benchmarks/README.md)",
    )

    @property
    def total_sgd_steps(self) -> int:
        """SGD steps the rate limiter allows once all ``steps`` rows are inserted."""
        return total_sgd_steps(self)
