"""DQN's configs, of `config_fields` groups and without TensorFlow (a bad flag fails at once):
`DQNConfig` (``demo cartpole``, the rl-zoo3 demos), `AtariDQNConfig` (``demo breakout``) and
Ape-X's served `ApexConfig` and `ApexAtariConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import replaygpu as rg
from replaygpu.service.config import AgentSettings

from ..config_fields import (
    ActorEnvs,
    ApeX,
    AtariGame,
    BestOfEvaluations,
    ClippedGradients,
    DataParallel,
    DecayedLearningRate,
    Device,
    FrameReplay,
    LearningRate,
    LinearEpsilon,
    Mlp,
    Prioritized,
    Replay,
    Run,
    TrainingCalls,
    VectorEnvs,
    defaults,
    option,
)
from ..configs import (
    require,
    require_positive,
    require_positive_ints,
    require_trains,
    require_vector_loop,
    total_sgd_steps,
    training_calls,
)
from ..distributed.actor_config import ActorConfig
from ..envs import atari_env, discrete_actions_env


@dataclass(frozen=True)
class DQNConfig(
    BestOfEvaluations,
    Device,
    VectorEnvs,
    ClippedGradients,
    Mlp,
    defaults(LinearEpsilon, exploration_fraction=0.16, exploration_final_eps=0.04),
    defaults(TrainingCalls, train_freq=256, gradient_steps=128),
    defaults(Replay, batch_size=64),
    defaults(DecayedLearningRate, learning_rate=2.3e-3),
    Run,
):
    """DQN hyperparameters; the defaults are rl-zoo3's tuned values for CartPole-v1, with its
    algorithm (SB3's DQN: not double DQN) and its constant learning rate (``--final-learning-rate``
    decays it, `DecayedLearningRate`). The run hands back the weights of its best greedy
    evaluation while training (``keep_best``, `evaluation.BestPolicy`)."""

    ENV_CHECK = discrete_actions_env

    seed: int = option(1, "seed of envs, networks, sampling and exploration")
    target_update_interval: int = option(
        10,
        "env steps between target-network syncs, counted as in SB3/rl-zoo3; syncs happen "
        "after training calls, so an interval below train_freq syncs after every call",
    )
    double_q: bool = option(False, "double DQN targets (rl-zoo3's SB3 DQN: no)")
    overlap_training: bool = option(
        True,
        "run each training call on a background thread while the next chunk is acted, "
        "with the weights of the call before (one chunk of policy lag); every chunk still "
        "gets gradient_steps SGD steps, appends and target syncs run on that thread in "
        "order, and checkpoints wait for the calls in flight",
    )
    storage_dtype: Literal["float32", "float16", "bfloat16"] = option(
        "float32",
        "dtype the replay table keeps float observations (obs, next_obs) in on the device; "
        "float16/bfloat16 halve their memory and round them to ~3 / ~2 significant digits "
        "(float16 overflows past 65504); float32 keeps them as the env gives them",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require_vector_loop(self, "target_update_interval")
        self.require_fraction_in_unit_interval()

    @property
    def total_sgd_steps(self) -> int:
        """SGD steps of the whole run: those of each training call (`training_calls`)."""
        return max(1, sum(training_calls(self)))


@dataclass(frozen=True)
class AtariDQNConfig(
    Device,
    ClippedGradients,
    LinearEpsilon,
    TrainingCalls,
    Prioritized,
    defaults(FrameReplay, learning_starts=100_000),
    LearningRate,
    AtariGame,
    Run,
):
    """Atari DQN hyperparameters; defaults are the Nature / rl-zoo3 values (replay 1e5)."""

    ENV_CHECK = atari_env

    steps: int = option(10_000_000, "env steps (agent steps) to train")
    n_step: int = option(1, "n-step returns, drawn from the frame table (Nature: 1)")
    target_update_interval: int = option(1000, "env steps between target-network syncs")
    double_q: bool = option(False, "double DQN targets (Nature: no)")
    report_interval: int = option(1000, "env steps between progress/TensorBoard reports")
    jit_compile: Literal["auto", "on", "off"] = option(
        "auto",
        "compile the SGD loop with XLA; auto: on a GPU only (XLA's CPU convolutions ran "
        "the Nature CNN update 6x slower than TensorFlow's on a 2-core CPU)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        positive = ["steps", "target_update_interval", "n_step", "eval_episodes", "report_interval"]
        require_positive_ints(self, *positive)
        require_positive(self, "max_grad_norm")
        require(self, ["priority_alpha", "priority_beta"], lambda v: v >= 0, ">= 0")
        self.require_fraction_in_unit_interval()
        if self.buffer_size <= self.frame_stack + self.train_freq:
            raise rg.ConfigError(
                f"buffer_size: got {self.buffer_size}, expected > frame_stack + train_freq "
                f"({self.frame_stack + self.train_freq}) so stacks can be drawn"
            )


@dataclass(frozen=True)
class ApexConfig(
    BestOfEvaluations,
    DataParallel,
    Device,
    ClippedGradients,
    ActorEnvs,
    Mlp,
    Prioritized,
    defaults(Replay, batch_size=128),
    DecayedLearningRate,
    defaults(ApeX, steps_per_call=128),
):
    """Ape-X DQN hyperparameters: the rl-zoo3 CartPole DQN network and replay ratio, with the
    Ape-X paper's 3-step returns, batch 128 and a learning rate decayed linearly to a small
    floor, ``final_learning_rate``, over the SGD steps of the replay budget
    (`DecayedLearningRate`; ``steps`` 0, no end: constant). The learner hands back the weights
    of its best greedy evaluation while training (``keep_best``), as the DQN demo does."""

    ENV_CHECK = discrete_actions_env

    env_id: str = option("CartPole-v1", "gymnasium env id (Discrete)")
    steps: int = option(
        80_000,
        "env steps collected by all actors; 0: run until stopped (a service), with a "
        "constant learning rate",
    )
    actor_envs: int = option(
        1,
        "envs per actor, one batched policy call per vector step (on CartPole with this "
        "step budget, wider vector envs learned worse; see benchmarks/README.md)",
    )
    final_learning_rate: float = option(
        2e-5,
        "Adam step size at the end, > 0: linear decay over the SGD steps that the replay "
        "budget allows (steps x samples_per_insert / batch_size), then constant",
    )
    learning_starts: int = option(1000, "rows before the first SGD step")
    n_step: int = option(
        3,
        "n-step returns (Ape-X: 3) by rg.NStep over each actor env's own rows; 1: one-step targets",
    )
    double_q: bool = option(True, "double DQN targets")
    prioritized: bool = option(
        False,
        "prioritized replay as in the Ape-X paper (off by default: with these "
        "hyperparameters it learned CartPole worse; see benchmarks/README.md)",
    )

    def __post_init__(self) -> None:
        require_positive_ints(self, "learning_starts")  # >= 1 here, before `Replay`'s >= 0
        super().__post_init__()
        require_positive_ints(self, "target_update_interval", "n_step", "eval_episodes")
        require(self, ["steps"], lambda v: v >= 0, ">= 0 (0: until stopped)")
        require_trains(self)

    @property
    def total_sgd_steps(self) -> int:
        """SGD steps the rate limiter allows once all ``steps`` rows are inserted."""
        return total_sgd_steps(self)


@dataclass(frozen=True)
class ApexAtariConfig(
    Device,
    ClippedGradients,
    Prioritized,
    defaults(FrameReplay, buffer_size=50_000),
    LearningRate,
    AtariGame,
    defaults(ApeX, weight_pull_interval=1000, steps_per_call=16, target_update_interval=250),
):
    """Ape-X DQN on Atari frames: the Nature DQN's Adam 1e-4 and batch 32, with a run length
    and replay ratio sized for a 2-core CPU (a Nature CNN SGD step of batch 32 took ~0.2 s
    there beside two actors), which is a smoke run, not enough to learn Breakout; to learn,
    on a GPU: --steps 10000000 --buffer-size 1000000 --learning-starts 50000
    --samples-per-insert 8 --num-actors 8."""

    ENV_CHECK = atari_env

    steps: int = option(20_000, "env steps collected by all actors")
    segment_steps: int = option(
        1000,
        "longest table episode an actor sends in one request; longer ones are cut as "
        "truncations (the first k-1 stacks after a cut are padded)",
    )
    insert_slack: int = option(
        4096, "rows an actor may run ahead of the learner's rate limit before it waits; -1: never"
    )
    learning_starts: int = option(2_000, "rows before the first SGD")
    samples_per_insert: float = option(
        2.0, "rate limit: sampled rows per inserted row (Nature DQN: 8; Ape-X: well below 1)"
    )
    n_step: int = option(3, "n-step returns (Ape-X: 3)")
    prioritized: bool = option(True, "prioritized replay (Ape-X: yes; off: uniform)")
    priority_alpha: float = option(0.6, "priority exponent (Ape-X: 0.6)")
    priority_beta: float = option(0.4, "importance-weight exponent (Ape-X: 0.4)")
    double_q: bool = option(True, "double DQN targets (Ape-X: yes)")
    eval_episodes: int = option(3, "evaluation games after training (0: none)")
    jit_compile: Literal["auto", "on", "off"] = option(
        "auto", "compile the SGD loop with XLA; auto: on a GPU only"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive_ints(self, "steps", "segment_steps", "target_update_interval", "n_step")
        require(self, ["eval_episodes"], lambda v: v >= 0, ">= 0")
        require(self, ["insert_slack"], lambda v: v >= -1, ">= -1 (-1: never wait)")
        require_positive(self, "max_grad_norm")
        require_trains(self)
        if self.buffer_size <= 2 * (self.segment_steps + 1):
            raise rg.ConfigError(
                f"buffer_size: got {self.buffer_size}, expected > 2 * (segment_steps + 1) = "
                f"{2 * (self.segment_steps + 1)} so a segment never overwrites the one before"
            )

    @property
    def dqn_config(self) -> AtariDQNConfig:
        """The `AtariDQNConfig` of update and evaluation (at least one game): the shared fields
        but ``target_update_interval``, SGD steps here (`distributed.learner` syncs) and env
        steps there (read only by `atari.train`)."""
        take = {f.name for f in fields(AtariDQNConfig)} - {"target_update_interval"}
        shared = {f.name: getattr(self, f.name) for f in fields(self) if f.name in take}
        return AtariDQNConfig(**{**shared, "eval_episodes": max(1, self.eval_episodes)})

    @property
    def actor_settings(self) -> AgentSettings:
        """What the actors run (served in ``Info`` for ``replaygpu actor ADDRESS``)."""
        # one ALE game per actor process; finished segments go once they hold 256 steps
        return ActorConfig.settings_of(self, "dqn", num_envs=1, send_interval=256)
