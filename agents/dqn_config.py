"""DQN's configs, without TensorFlow: `DQNConfig` (``demo cartpole`` and the rl-zoo3 demos) and
`AtariDQNConfig` (``demo breakout``, a frame table). The CLI builds and checks them before
TensorFlow is imported, so a bad flag is reported at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import replaygpu as rg
from replaygpu.agents.config_parts import (
    STEPS_HELP,
    DecayedLearningRate,
    LinearEpsilon,
    discrete_actions_env,
    require,
    require_positive,
    require_positive_ints,
    require_unit_interval,
    require_vector_loop,
    steps_to_train,
    training_calls,
)
from replaygpu.agents.flags import helptext


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
        """The least ``steps`` that trains (`config_parts.require_trains`)."""
        return steps_to_train(self)

    @property
    def total_sgd_steps(self) -> int:
        """SGD steps of the whole run: those of each training call (`training_calls`)."""
        return max(1, sum(training_calls(self)))


@dataclass(frozen=True)
class AtariDQNConfig(LinearEpsilon):
    """Atari DQN hyperparameters; defaults are the Nature / rl-zoo3 values (replay 1e5)."""

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
        """The least ``steps`` that trains (`config_parts.require_trains`; `atari.train` chunks as
        `config_parts.next_chunk` does)."""
        return steps_to_train(self)
