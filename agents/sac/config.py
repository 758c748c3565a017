"""SAC's configs (no TensorFlow, see `configs`): `SACConfig` (``demo pendulum``) and
`SACLearnerConfig` (``replaygpu learner --agent sac``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config_fields import (
    ActorEnvs,
    DataParallel,
    Device,
    LearningRate,
    Mlp,
    Replay,
    Run,
    Served,
    TrainingCalls,
    UntilStopped,
    VectorEnvs,
    defaults,
    option,
)
from ..configs import require_positive, require_unit_interval, require_vector_loop
from ..envs import box_actions_env


@dataclass(frozen=True)
class SACConfig(
    Device,
    VectorEnvs,
    Mlp,
    defaults(TrainingCalls, train_freq=64, gradient_steps=64),
    defaults(Replay, batch_size=256),
    LearningRate,
    defaults(Run, steps=20_000, eval_episodes=10),
):
    """SAC hyperparameters; the defaults follow rl-zoo3's Pendulum-v1 values (updates batched)."""

    ENV_CHECK = box_actions_env

    env_id: str = option("Pendulum-v1", "gymnasium env id (Box actions)")
    seed: int = option(1, "seed of envs, networks, sampling and noise")
    learning_rate: float = option(1e-3, "Adam step size (all nets)")
    learning_starts: int = option(100, "env steps of uniform random actions before training")
    tau: float = option(0.005, "target critic Polyak rate per SGD step")
    initial_alpha: float = option(1.0, "initial entropy coefficient")
    target_entropy_scale: float = option(1.0, "target entropy = -scale * action dimensions")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_vector_loop(self)
        require_unit_interval(self, "tau")
        require_positive(self, "initial_alpha")

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains: `sac.train` trains after each chunk that ends at or
        past ``learning_starts``, a served learner once the table holds that many rows."""
        return max(1, self.learning_starts)


@dataclass(frozen=True)
class SACLearnerConfig(
    UntilStopped, DataParallel, ActorEnvs, defaults(Served, samples_per_insert=256.0), SACConfig
):
    """SAC served to remote actors: `SACConfig`'s update, with a samples-per-insert rate limit
    in place of the demo's train_freq/gradient_steps (the defaults keep its ratio: 64 steps of
    256 rows per 64 env steps)."""

    steps: int = option(
        20_000, "env steps collected by all actors; 0: run until stopped (a service)"
    )
