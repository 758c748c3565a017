"""Atari DQN's config, without TensorFlow: `AtariDQNConfig` (``demo breakout``, ``demo pong``,
and the update of `ApexAtariConfig`). The CLI builds and checks it before TensorFlow is
imported, so a bad flag is reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import replaygpu as rg
from replaygpu.agents.checks import (
    require,
    require_positive,
    require_positive_ints,
    require_unit_interval,
)
from replaygpu.agents.flags import helptext
from replaygpu.agents.schedules import LinearEpsilon, steps_to_train


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
        """The least ``steps`` that trains (`checks.require_trains`; `atari.train` chunks as
        `schedules.next_chunk` does)."""
        return steps_to_train(self)
