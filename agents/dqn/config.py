"""DQN's configs, without TensorFlow: `DQNConfig` (``demo cartpole`` and the rl-zoo3 demos) and
`AtariDQNConfig` (``demo breakout``, a frame table). The CLI builds and checks them before
TensorFlow is imported, so a bad flag is reported at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import replaygpu as rg

from ..configs import (
    STEPS_HELP,
    DecayedLearningRate,
    LinearEpsilon,
    helptext,
    require,
    require_positive,
    require_positive_ints,
    require_trains,
    require_unit_interval,
    require_vector_loop,
    require_widths,
    steps_to_train,
    total_sgd_steps,
    training_calls,
)
from ..envs import atari_env, discrete_actions_env

if TYPE_CHECKING:  # imported when an agent is made: the config alone needs no TensorFlow
    pass
from typing import TYPE_CHECKING

from replaygpu.service.config import AgentSettings

from ..distributed.actor_config import ActorConfig

if TYPE_CHECKING:  # imported when an agent is made: the config alone needs no TensorFlow
    pass


@dataclass(frozen=True)
class DQNConfig(LinearEpsilon, DecayedLearningRate):
    """DQN hyperparameters; the defaults are rl-zoo3's tuned values for CartPole-v1, with its
    algorithm (SB3's DQN: not double DQN) and its constant learning rate (``--final-learning-rate``
    decays it, `DecayedLearningRate`). The run hands back the weights of its best greedy
    evaluation while training (``keep_best``, `dqn.BestPolicy`)."""

    #: makes the env and checks it has the actions its agent takes (the CLI, before TensorFlow)
    ENV_CHECK: ClassVar[Callable[[str], Any]] = discrete_actions_env

    env_id: str = field(
        default="CartPole-v1", metadata=helptext("gymnasium env id (Discrete actions)")
    )
    seed: int = field(
        default=1, metadata=helptext("seed of envs, networks, sampling and exploration")
    )
    steps: int = field(default=50_000, metadata=helptext(STEPS_HELP))
    learning_rate: float = field(default=2.3e-3, metadata=helptext("Adam step size at the start"))
    final_learning_rate: float | None = field(
        default=None,
        metadata=helptext(
            "Adam step size at the end, > 0: linear decay over the run's SGD steps, then "
            "constant; none: a constant learning_rate"
        ),
    )
    batch_size: int = field(default=64, metadata=helptext("minibatch size of each SGD step"))
    buffer_size: int = field(default=100_000, metadata=helptext("replay table capacity"))
    learning_starts: int = field(default=1000, metadata=helptext("env steps before training"))
    gamma: float = field(default=0.99, metadata=helptext("discount factor"))
    target_update_interval: int = field(
        default=10,
        metadata=helptext(
            "env steps between target-network syncs, counted as in SB3/rl-zoo3; syncs happen "
            "after training calls, so an interval below train_freq syncs after every call"
        ),
    )
    train_freq: int = field(default=256, metadata=helptext("env steps between training calls"))
    gradient_steps: int = field(default=128, metadata=helptext("SGD steps per training call"))
    exploration_fraction: float = field(
        default=0.16, metadata=helptext("fraction of the run over which epsilon decays")
    )
    exploration_initial_eps: float = field(default=1.0, metadata=helptext("epsilon at the start"))
    exploration_final_eps: float = field(default=0.04, metadata=helptext("epsilon after decay"))
    hidden_sizes: tuple[int, ...] = field(default=(256, 256), metadata=helptext("MLP widths"))
    max_grad_norm: float = field(default=10.0, metadata=helptext("gradient clipping global norm"))
    double_q: bool = field(
        default=False, metadata=helptext("double DQN targets (rl-zoo3's SB3 DQN: no)")
    )
    num_envs: int = field(default=1, metadata=helptext("envs stepped together (one policy call)"))
    eval_episodes: int = field(default=20, metadata=helptext("greedy evaluation episodes"))
    eval_every: int = field(
        default=5000,
        metadata=helptext(
            "env steps between greedy evaluations while training (TensorBoard "
            "eval/periodic_return); 0: none"
        ),
    )
    periodic_eval_episodes: int = field(
        default=10, metadata=helptext("episodes of each evaluation while training (same seeds)")
    )
    keep_best: bool = field(
        default=True,
        metadata=helptext(
            "hand back the weights of the best evaluation while training, the final weights "
            "included (rl-zoo3's best model): the run's evaluation and replaygpu eval play "
            "them; no: the final weights"
        ),
    )
    jit_compile: bool = field(default=True, metadata=helptext("compile the SGD loop with XLA"))
    overlap_training: bool = field(
        default=True,
        metadata=helptext(
            "run each training call on a background thread while the next chunk is acted, "
            "with the weights of the call before (one chunk of policy lag); every chunk still "
            "gets gradient_steps SGD steps, appends and target syncs run on that thread in "
            "order, and checkpoints wait for the calls in flight"
        ),
    )
    device: str = field(default="", metadata=helptext("TF device; empty: first GPU, else CPU"))
    storage_dtype: Literal["float32", "float16", "bfloat16"] = field(
        default="float32",
        metadata=helptext(
            "dtype the replay table keeps float observations (obs, next_obs) in on the device; "
            "float16/bfloat16 halve their memory and round them to ~3 / ~2 significant digits "
            "(float16 overflows past 65504); float32 keeps them as the env gives them"
        ),
    )

    def __post_init__(self) -> None:
        require_vector_loop(self, "target_update_interval", "periodic_eval_episodes")
        require(self, ["eval_every"], lambda v: v >= 0, ">= 0 (0: no evaluation while training)")
        self.check_learning_rates()
        require_unit_interval(self, "exploration_initial_eps", "exploration_final_eps")
        if not 0.0 < self.exploration_fraction <= 1.0:
            raise rg.ConfigError(
                f"exploration_fraction: got {self.exploration_fraction}, expected in (0, 1]"
            )

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains (`configs.require_trains`)."""
        return steps_to_train(self)

    @property
    def total_sgd_steps(self) -> int:
        """SGD steps of the whole run: those of each training call (`training_calls`)."""
        return max(1, sum(training_calls(self)))


@dataclass(frozen=True)
class AtariDQNConfig(LinearEpsilon):
    """Atari DQN hyperparameters; defaults are the Nature / rl-zoo3 values (replay 1e5)."""

    #: makes the preprocessed ALE game (`envs.atari_env`: the demo, before any folder)
    ENV_CHECK: ClassVar[Callable[[str], Any]] = atari_env

    env_id: str = field(default="ALE/Breakout-v5", metadata=helptext("ALE game id"))
    seed: int = field(default=1, metadata=helptext("seed of env, networks, sampling, exploration"))
    steps: int = field(default=10_000_000, metadata=helptext("env steps (agent steps) to train"))
    learning_rate: float = field(default=1e-4, metadata=helptext("Adam step size"))
    batch_size: int = field(default=32, metadata=helptext("minibatch size of each SGD step"))
    buffer_size: int = field(
        default=100_000, metadata=helptext("frame-table rows (1e6: 7.07 GB of uint8 frames)")
    )
    learning_starts: int = field(default=100_000, metadata=helptext("env steps before training"))
    gamma: float = field(default=0.99, metadata=helptext("discount factor"))
    n_step: int = field(
        default=1, metadata=helptext("n-step returns, drawn from the frame table (Nature: 1)")
    )
    prioritized: bool = field(
        default=False,
        metadata=helptext("prioritized replay over the frame table (Nature: no; Ape-X: yes)"),
    )
    priority_alpha: float = field(default=0.6, metadata=helptext("priority exponent"))
    priority_beta: float = field(default=0.4, metadata=helptext("importance-weight exponent"))
    target_update_interval: int = field(
        default=1000, metadata=helptext("env steps between target-network syncs")
    )
    train_freq: int = field(default=4, metadata=helptext("env steps between training calls"))
    gradient_steps: int = field(default=1, metadata=helptext("SGD steps per training call"))
    exploration_fraction: float = field(
        default=0.1, metadata=helptext("fraction of the run over which epsilon decays")
    )
    exploration_initial_eps: float = field(default=1.0, metadata=helptext("epsilon at the start"))
    exploration_final_eps: float = field(default=0.01, metadata=helptext("epsilon after decay"))
    frame_stack: int = field(default=4, metadata=helptext("frames per observation stack"))
    max_grad_norm: float = field(default=10.0, metadata=helptext("gradient clipping global norm"))
    double_q: bool = field(default=False, metadata=helptext("double DQN targets (Nature: no)"))
    repeat_action_probability: float = field(
        default=0.25, metadata=helptext("sticky actions of ALE v5 (Machado et al. 2018)")
    )
    terminal_on_life_loss: bool = field(
        default=True, metadata=helptext("training marks a lost life terminal (game plays on)")
    )
    clip_rewards: bool = field(default=True, metadata=helptext("train on sign(reward)"))
    eval_episodes: int = field(default=5, metadata=helptext("evaluation games after training"))
    eval_epsilon: float = field(
        default=0.05, metadata=helptext("epsilon of the evaluation policy (Nature: 0.05)")
    )
    report_interval: int = field(
        default=1000, metadata=helptext("env steps between progress/TensorBoard reports")
    )
    jit_compile: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata=helptext(
            "compile the SGD loop with XLA; auto: on a GPU only (XLA's CPU convolutions ran "
            "the Nature CNN update 6x slower than TensorFlow's on a 2-core CPU)"
        ),
    )
    device: str = field(default="", metadata=helptext("TF device; empty: first GPU, else CPU"))

    def __post_init__(self) -> None:
        require_positive_ints(
            self,
            *["steps", "batch_size", "buffer_size", "target_update_interval", "train_freq"],
            *["gradient_steps", "frame_stack", "n_step", "eval_episodes", "report_interval"],
        )
        require(self, ["learning_starts"], lambda v: v >= 0, ">= 0")
        require_unit_interval(
            self,
            "gamma",
            "exploration_initial_eps",
            "exploration_final_eps",
            "repeat_action_probability",
            "eval_epsilon",
        )
        require_positive(self, "learning_rate", "max_grad_norm")
        require(self, ["priority_alpha", "priority_beta"], lambda v: v >= 0, ">= 0")
        if not 0.0 < self.exploration_fraction <= 1.0:
            raise rg.ConfigError(
                f"exploration_fraction: got {self.exploration_fraction}, expected in (0, 1]"
            )
        if self.buffer_size <= self.frame_stack + self.train_freq:
            raise rg.ConfigError(
                f"buffer_size: got {self.buffer_size}, expected > frame_stack + train_freq "
                f"({self.frame_stack + self.train_freq}) so stacks can be drawn"
            )

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains (`configs.require_trains`; `atari.train` chunks as
        `configs.next_chunk` does)."""
        return steps_to_train(self)


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
        """The least ``steps`` that trains (`configs.require_trains`): the rate limiter samples
        once the table holds ``learning_starts`` rows."""
        return self.learning_starts

    @property
    def total_sgd_steps(self) -> int:
        """SGD steps the rate limiter allows once all ``steps`` rows are inserted."""
        return total_sgd_steps(self)


@dataclass(frozen=True)
class ApexAtariConfig:
    """Ape-X DQN on Atari frames: the Nature DQN's Adam 1e-4 and batch 32, with a run length
    and replay ratio sized for a 2-core CPU (a Nature CNN SGD step of batch 32 took ~0.2 s
    there beside two actors), which is a smoke run, not enough to learn Breakout; to learn,
    on a GPU: --steps 10000000 --buffer-size 1000000 --learning-starts 50000
    --samples-per-insert 8 --num-actors 8."""

    #: makes the preprocessed ALE game (`envs.atari_env`: the demo, before any folder)
    ENV_CHECK: ClassVar[Callable[[str], Any]] = atari_env

    env_id: str = field(default="ALE/Breakout-v5", metadata=helptext("ALE game id"))
    seed: int = field(default=1, metadata=helptext("seed of actors, networks and sampling"))
    steps: int = field(default=20_000, metadata=helptext("env steps collected by all actors"))
    num_actors: int = field(default=2, metadata=helptext("actor processes"))
    segment_steps: int = field(
        default=1000,
        metadata=helptext(
            "longest table episode an actor sends in one request; longer ones are cut as "
            "truncations (the first k-1 stacks after a cut are padded)"
        ),
    )
    weight_pull_interval: int = field(
        default=1000, metadata=helptext("actor env steps between weight pulls (K)")
    )
    insert_slack: int = field(
        default=4096,
        metadata=helptext(
            "rows an actor may run ahead of the learner's rate limit before it waits; -1: never"
        ),
    )
    learning_rate: float = field(default=1e-4, metadata=helptext("Adam step size"))
    batch_size: int = field(default=32, metadata=helptext("minibatch size of each SGD step"))
    buffer_size: int = field(
        default=50_000, metadata=helptext("frame-table rows (1e6: 7.07 GB of uint8 frames)")
    )
    learning_starts: int = field(default=2_000, metadata=helptext("rows before the first SGD"))
    samples_per_insert: float = field(
        default=2.0,
        metadata=helptext(
            "rate limit: sampled rows per inserted row (Nature DQN: 8; Ape-X: well below 1)"
        ),
    )
    steps_per_call: int = field(default=16, metadata=helptext("SGD steps per Learner.train call"))
    target_update_interval: int = field(
        default=250, metadata=helptext("SGD steps between target-network syncs")
    )
    gamma: float = field(default=0.99, metadata=helptext("discount factor"))
    n_step: int = field(default=3, metadata=helptext("n-step returns (Ape-X: 3)"))
    prioritized: bool = field(
        default=True, metadata=helptext("prioritized replay (Ape-X: yes; off: uniform)")
    )
    priority_alpha: float = field(default=0.6, metadata=helptext("priority exponent (Ape-X: 0.6)"))
    priority_beta: float = field(
        default=0.4, metadata=helptext("importance-weight exponent (Ape-X: 0.4)")
    )
    frame_stack: int = field(default=4, metadata=helptext("frames per observation stack"))
    max_grad_norm: float = field(default=10.0, metadata=helptext("gradient clipping global norm"))
    double_q: bool = field(default=True, metadata=helptext("double DQN targets (Ape-X: yes)"))
    repeat_action_probability: float = field(
        default=0.25, metadata=helptext("sticky actions of ALE v5 (Machado et al. 2018)")
    )
    terminal_on_life_loss: bool = field(
        default=True, metadata=helptext("training marks a lost life terminal (game plays on)")
    )
    clip_rewards: bool = field(default=True, metadata=helptext("train on sign(reward)"))
    eval_episodes: int = field(
        default=3, metadata=helptext("evaluation games after training (0: none)")
    )
    eval_epsilon: float = field(
        default=0.05, metadata=helptext("epsilon of the evaluation policy (Nature: 0.05)")
    )
    jit_compile: Literal["auto", "on", "off"] = field(
        default="auto", metadata=helptext("compile the SGD loop with XLA; auto: on a GPU only")
    )
    address: str = field(default="127.0.0.1:0", metadata=helptext("where the learner serves"))
    device: str = field(default="", metadata=helptext("TF device; empty: first GPU, else CPU"))

    def __post_init__(self) -> None:
        require_positive_ints(
            self,
            *["steps", "num_actors", "segment_steps", "weight_pull_interval", "batch_size"],
            *["buffer_size", "steps_per_call", "target_update_interval", "frame_stack"],
            "n_step",
        )
        require(self, ["learning_starts", "eval_episodes"], lambda v: v >= 0, ">= 0")
        require(self, ["insert_slack"], lambda v: v >= -1, ">= -1 (-1: never wait)")
        require_positive(self, "learning_rate", "samples_per_insert", "max_grad_norm")
        require_unit_interval(self, "gamma", "repeat_action_probability", "eval_epsilon")
        require_trains(self)
        if self.buffer_size <= 2 * (self.segment_steps + 1):
            raise rg.ConfigError(
                f"buffer_size: got {self.buffer_size}, expected > 2 * (segment_steps + 1) = "
                f"{2 * (self.segment_steps + 1)} so a segment never overwrites the one before"
            )

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains (`configs.require_trains`): the rate limiter samples
        once the table holds ``learning_starts`` rows."""
        return max(1, self.learning_starts)

    @property
    def dqn_config(self) -> AtariDQNConfig:
        """The `AtariDQNConfig` of the update and the evaluation."""
        return AtariDQNConfig(
            env_id=self.env_id,
            seed=self.seed,
            steps=self.steps,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            buffer_size=self.buffer_size,
            learning_starts=self.learning_starts,
            gamma=self.gamma,
            n_step=self.n_step,
            prioritized=self.prioritized,
            priority_alpha=self.priority_alpha,
            priority_beta=self.priority_beta,
            frame_stack=self.frame_stack,
            max_grad_norm=self.max_grad_norm,
            double_q=self.double_q,
            repeat_action_probability=self.repeat_action_probability,
            terminal_on_life_loss=self.terminal_on_life_loss,
            clip_rewards=self.clip_rewards,
            eval_episodes=max(1, self.eval_episodes),
            eval_epsilon=self.eval_epsilon,
            jit_compile=self.jit_compile,
            device=self.device,
        )

    @property
    def actor_settings(self) -> AgentSettings:
        """What the actors run (served in ``Info``, so ``replaygpu actor ADDRESS`` can join)."""
        actor = ActorConfig(
            env_id=self.env_id,
            num_envs=1,  # one ALE game per actor process
            weight_pull_interval=self.weight_pull_interval,
            seed=self.seed,
            num_actors=self.num_actors,
            frame_stack=self.frame_stack,
            segment_steps=self.segment_steps,
            repeat_action_probability=self.repeat_action_probability,
            terminal_on_life_loss=self.terminal_on_life_loss,
            clip_rewards=self.clip_rewards,
            send_interval=256,  # finished segments go once they hold 256 steps
            insert_slack=self.insert_slack,
        )
        return actor.to_settings("dqn")
